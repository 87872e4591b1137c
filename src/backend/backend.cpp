// The Backend's defaults: host staging memory, the waiting forms of its reductions (the value
// through one f64 of the backend's memory, read back), and a recurrence as its steps.
#include "seqforge/backend/backend.hpp"

#include <cstdlib>

#include "kernels/recurrence_steps.hpp"

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

// `bytes` of `be`'s memory for the life of the scope.
class Scratch {
 public:
  Scratch(Backend& be, size_t bytes) : be_(be), ptr_(be.alloc(bytes)) {}
  ~Scratch() { be_.free(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* data() const { return ptr_; }

 private:
  Backend& be_;
  void* ptr_;
};

void check_whole_chain(CellKind kind) {
  SF_CHECK(kind == CellKind::lstm || kind == CellKind::gru,
           "a whole-chain recurrence runs LSTM and GRU cells, not ", cell_type(kind).name);
}

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

void Backend::recurrence_forward(CellKind kind, const RecurrenceForward& a, DType dtype) {
  check_whole_chain(kind);
  const int gates = cell_type(kind).gates;
  const int64_t B = a.cell.batch, GH = gates * a.cell.hidden, size = dtype_size(dtype);
  Scratch rec(*this, static_cast<size_t>(B * GH * size));
  for (int64_t k = 0; k < a.steps; ++k) {
    ref::ForwardStep s = ref::forward_step(a, k, gates, size);
    // R(B, G*H) = h_prev(B, H) W_hh^T
    gemm({.trans_b = true,
          .m = B,
          .n = GH,
          .k = a.cell.hidden,
          .lda = s.ld,
          .ldb = a.cell.hidden,
          .ldc = GH},
         a.gemm, s.h_prev, a.w_hh, rec.data());
    s.cell.gates_rec = rec.data();
    cell_forward(kind, s.cell, dtype);
  }
}

void Backend::recurrence_backward(CellKind kind, const RecurrenceBackward& a, DType dtype) {
  check_whole_chain(kind);
  const CellType& type = cell_type(kind);
  const int64_t H = a.cell.hidden, size = dtype_size(dtype);
  for (int64_t k = 0; k < a.steps; ++k) {
    cell_backward(kind, ref::backward_step(a, k, type.gates, type.direct_state_grad, size), dtype);
    // dh(B, H) (+)= dR(B, G*H) W_hh(G*H, H)
    GemmShape back{
        .m = a.cell.batch, .n = H, .k = type.gates * H, .lda = type.gates * H, .ldb = H, .ldc = H};
    back.beta = type.direct_state_grad ? 1.0 : 0.0;
    gemm(back, a.gemm, ref::recurrent_operand(a, k, type.gates, type.recurrent_grads, size), a.w_hh,
         a.dh);
  }
}

}  // namespace seqforge
