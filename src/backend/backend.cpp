// The Backend's defaults: host staging memory, the waiting forms of its reductions (the value
// through one f64 of the backend's memory, read back), and a recurrence as its steps.
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

// p moved by `elements` of `size` bytes (null stays null).
const void* moved(const void* p, int64_t elements, size_t size) {
  return p ? static_cast<const char*>(p) + elements * static_cast<int64_t>(size) : nullptr;
}
void* moved(void* p, int64_t elements, size_t size) {
  return p ? static_cast<char*>(p) + elements * static_cast<int64_t>(size) : nullptr;
}

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
  const CellForward& c0 = a.cell;
  const int64_t B = c0.batch, H = c0.hidden, GH = cell_type(kind).gates * H;
  const size_t es = dtype_size(dtype), ls = dtype_size(c0.low);
  Scratch rec(*this, static_cast<size_t>(B * GH) * es);
  for (int64_t k = 0; k < a.steps; ++k) {
    const int64_t t = a.reverse ? a.steps - 1 - k : k, tp = a.reverse ? t + 1 : t - 1;
    CellForward p = c0;
    p.gates = moved(c0.gates, t * B * GH, es);
    p.gates_low = moved(c0.gates_low, t * B * GH, ls);
    p.c = moved(c0.c, t * B * H, es);
    p.saved = moved(c0.saved, t * B * H, es);
    p.h = moved(c0.h, t * B * c0.ldh, es);
    p.h_low = moved(c0.h_low, t * B * c0.ldh, ls);
    p.x = moved(c0.x, t * B * c0.ldx, es);
    const void* h_prev = a.h0;
    int64_t ld = a.ld_h0;
    if (k > 0) {
      p.c_prev = moved(c0.c, tp * B * H, es);
      p.h_prev = moved(c0.h, tp * B * c0.ldh, es);
      p.ld_h_prev = c0.ldh;
      h_prev = c0.h_low ? moved(c0.h_low, tp * B * c0.ldh, ls) : p.h_prev;
      ld = c0.ldh;
    }
    // R(B, G*H) = h_prev(B, H) W_hh^T
    gemm({.trans_b = true, .m = B, .n = GH, .k = H, .lda = ld, .ldb = H, .ldc = GH}, a.gemm, h_prev,
         a.w_hh, rec.data());
    p.gates_rec = rec.data();
    cell_forward(kind, p, dtype);
  }
}

void Backend::recurrence_backward(CellKind kind, const RecurrenceBackward& a, DType dtype) {
  check_whole_chain(kind);
  const CellType& type = cell_type(kind);
  const CellBackward& c0 = a.cell;
  const int64_t B = c0.batch, H = c0.hidden, GH = type.gates * H;
  const size_t es = dtype_size(dtype), ls = dtype_size(c0.low);
  const void* d_rec = type.recurrent_grads ? (c0.dgates_rec_low ? c0.dgates_rec_low : c0.dgates_rec)
                                           : (c0.dgates_low ? c0.dgates_low : c0.dgates);
  const size_t d_rec_size = dtype_size(a.gemm);
  for (int64_t k = 0; k < a.steps; ++k) {
    const int64_t t = a.reverse ? k : a.steps - 1 - k, tp = a.reverse ? t + 1 : t - 1;
    const bool first = a.reverse ? t == a.steps - 1 : t == 0;  // the chain's first step forward
    CellBackward p = c0;
    p.gates = moved(c0.gates, t * B * GH, es);
    p.gates_low = moved(c0.gates_low, t * B * GH, ls);
    p.saved = moved(c0.saved, t * B * H, es);
    p.dh_out = moved(c0.dh_out, t * B * c0.ld_dh_out, es);
    p.dgates = moved(c0.dgates, t * B * GH, es);
    p.dgates_low = moved(c0.dgates_low, t * B * GH, ls);
    p.dgates_rec = moved(c0.dgates_rec, t * B * GH, es);
    p.dgates_rec_low = moved(c0.dgates_rec_low, t * B * GH, ls);
    if (!first) {
      p.c_prev = moved(a.c, tp * B * H, es);
      p.h_prev = moved(a.h, tp * B * a.ldh, es);
      p.ld_h_prev = a.ldh;
    }
    p.dh_rec = a.dh;
    p.dh_direct = type.direct_state_grad ? a.dh : nullptr;
    cell_backward(kind, p, dtype);
    // dh(B, H) (+)= dR(B, G*H) W_hh(G*H, H)
    GemmShape back{.m = B, .n = H, .k = GH, .lda = GH, .ldb = H, .ldc = H};
    back.beta = type.direct_state_grad ? 1.0 : 0.0;
    gemm(back, a.gemm, moved(d_rec, t * B * GH, d_rec_size), a.w_hh, a.dh);
  }
}

}  // namespace seqforge
