// The Backend's defaults: host staging memory, and the waiting forms of its reductions (the value
// through one f64 of the backend's memory, read back).
#include "seqforge/backend/backend.hpp"

#include <cstdlib>

namespace seqforge {

namespace {

// One f64 in `be`'s memory for the life of the scope.
class Scalar {
 public:
  explicit Scalar(Backend& be) : be_(be), ptr_(be.alloc(sizeof(double))) {}
  ~Scalar() { be_.free(ptr_); }
  Scalar(const Scalar&) = delete;
  Scalar& operator=(const Scalar&) = delete;
  Tensor tensor() const { return Tensor(ptr_, DType::f64, {1}); }
  double read() const {
    double v = 0;
    be_.download(&v, tensor());
    return v;
  }

 private:
  Backend& be_;
  void* ptr_;
};

}  // namespace

void* Backend::alloc_host(size_t bytes) {
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) fail("out of host memory allocating ", bytes, " bytes");
  return p;
}

void Backend::free_host(void* ptr) { std::free(ptr); }

double Backend::regression_loss(const RegressionLoss& kind, Tensor pred, Tensor target, Tensor mask,
                                Tensor dpred) {
  Scalar loss(*this);
  regression_loss(kind, pred, target, mask, dpred, loss.tensor());
  return loss.read();
}

double Backend::cross_entropy_loss(Tensor logits, Tensor targets, Tensor weights,
                                   int64_t ignore_index, Tensor dlogits) {
  Scalar loss(*this);
  cross_entropy_loss(logits, targets, weights, ignore_index, dlogits, loss.tensor());
  return loss.read();
}

double Backend::sum_squares(Tensor x) {
  Scalar sum(*this);
  sum_squares(x, sum.tensor());
  return sum.read();
}

}  // namespace seqforge
