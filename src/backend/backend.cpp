// The Backend's defaults: host staging memory, the waiting forms of its reductions (the value
// through one f64 of the backend's memory, read back), a recurrence as its steps, and an optimizer
// update segment by segment.
#include "seqforge/backend/backend.hpp"

#include <cstdlib>

#include "kernels/grad_clip.hpp"
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

// The decoder ops, for backends that do not run them (supports(Op::decoder) is false there).
void Backend::rms_norm_forward(Tensor, Tensor, Tensor, Tensor, double, double) {
  fail("the ", name(), " backend does not run rms_norm_forward (Llama-style decoders) yet");
}
void Backend::rms_norm_backward(Tensor, Tensor, Tensor, Tensor, Tensor, double, Tensor, Tensor) {
  fail("the ", name(), " backend does not run rms_norm_backward (Llama-style decoders) yet");
}
void Backend::rotary(const Rotary&, DType) {
  fail("the ", name(), " backend does not run rotary (Llama-style decoders) yet");
}
int64_t ColumnMap::width(const Tensor& x) const {
  const Shape& shape = x.shape();
  int64_t C = shape.rank() ? shape[shape.rank() - 1] : x.numel();
  bool first = true;
  for (const Tensor* t : {&scale, &bias, &dscale}) {
    if (t->empty()) continue;
    SF_CHECK(t->dtype() == x.dtype(), "a column map's dtype ", dtype_name(t->dtype()),
             " against its input's ", dtype_name(x.dtype()));
    if (first) C = t->numel(), first = false;
    SF_CHECK(t->numel() == C, "column maps of ", t->numel(), " and ", C, " values");
  }
  SF_CHECK(C > 0 ? x.numel() % C == 0 : x.numel() == 0, "a column map: ", x.numel(),
           " values are not rows of ", C);
  return C;
}
int64_t GluAffine::width(const Tensor& gate_x) const {
  const int64_t C = gate.width(gate_x), U = up.width(gate_x);
  SF_CHECK(C == U, "glu: the gate's column maps of ", C, " values, up's of ", U);
  return C;
}
void Backend::glu_forward(Tensor, Tensor, Tensor, GluKind, const GluAffine&) {
  fail("the ", name(), " backend does not run glu_forward (Llama-style decoders) yet");
}
void Backend::glu_backward(Tensor, Tensor, Tensor, Tensor, Tensor, GluKind, const GluAffine&) {
  fail("the ", name(), " backend does not run glu_backward (Llama-style decoders) yet");
}
std::string Backend::collectives_unavailable() {
  return "the " + std::string(name()) + " backend has no collectives of its own";
}
void Backend::join_collectives(const HostCollectives&) {
  fail("the ", name(), " backend has no collectives of its own (join_collectives)");
}
void Backend::all_reduce_sum(Tensor) {
  fail("the ", name(), " backend has no collectives of its own (join_collectives)");
}
void Backend::soft_cap_forward(Tensor, Tensor, double) {
  fail("the ", name(), " backend does not run soft_cap_forward (Gemma's soft-capping) yet");
}
void Backend::soft_cap_backward(Tensor, Tensor, Tensor, double) {
  fail("the ", name(), " backend does not run soft_cap_backward (Gemma's soft-capping) yet");
}

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

namespace {

template <typename Chain>
bool check_stack(std::span<const Chain> chains) {
  for (size_t i = 0; i < chains.size(); ++i)
    SF_CHECK(!chains[i].w_ih || (i == 1 && chains.size() == 2),
             "a recurrence stack is two chains, the second given w_ih");
  if (chains.size() != 2 || !chains[1].w_ih) return false;
  const Chain &lower = chains[0], &upper = chains[1];
  SF_CHECK(
      lower.cell.batch == upper.cell.batch && lower.cell.hidden == upper.cell.hidden &&
          lower.steps == upper.steps && lower.reverse == upper.reverse && lower.gemm == upper.gemm,
      "a recurrence stack's chains need one batch, width, length, direction and product dtype");
  return true;
}

}  // namespace

bool is_stack(std::span<const RecurrenceForward> chains) {
  if (!check_stack(chains)) return false;
  SF_CHECK(chains[1].x && chains[1].cell.gates && !chains[1].cell.x,
           "a recurrence stack's upper chain takes its input from x into cell.gates");
  return true;
}

bool is_stack(std::span<const RecurrenceBackward> chains) {
  if (!check_stack(chains)) return false;
  SF_CHECK(!chains[0].cell.dh_out && chains[1].dx,
           "a recurrence stack's lower chain takes its output gradient from the upper chain");
  return true;
}

void Backend::recurrence_forward(CellKind kind, std::span<const RecurrenceForward> chains,
                                 DType dtype) {
  check_whole_chain(kind);
  const int gates = cell_type(kind).gates;
  const int64_t size = dtype_size(dtype);
  if (is_stack(chains)) {  // a layer at a time, the upper one's input projection between
    recurrence_forward(kind, chains.first(1), dtype);
    RecurrenceForward upper = chains[1];
    const int64_t B = upper.cell.batch, H = upper.cell.hidden;
    // G(steps * B, G*H) = x W_ih^T + bias
    GemmShape proj{.trans_b = true,
                   .m = upper.steps * B,
                   .n = gates * H,
                   .k = H,
                   .lda = upper.ld_x,
                   .ldb = H,
                   .ldc = gates * H};
    proj.bias = upper.bias != nullptr;
    gemm(proj, upper.gemm, upper.x, upper.w_ih, upper.cell.gates, upper.bias);
    upper.w_ih = upper.x = upper.bias = nullptr;
    return recurrence_forward(kind, std::span(&upper, 1), dtype);
  }
  for (const RecurrenceForward& a : chains) {
    const int64_t B = a.cell.batch, GH = gates * a.cell.hidden;
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
}

void Backend::recurrence_backward(CellKind kind, std::span<const RecurrenceBackward> chains,
                                  DType dtype) {
  check_whole_chain(kind);
  const CellType& type = cell_type(kind);
  const int64_t size = dtype_size(dtype);
  if (is_stack(chains)) {  // a layer at a time, the lower one's output gradient between
    RecurrenceBackward upper = chains[1], lower = chains[0];
    upper.w_ih = nullptr;
    recurrence_backward(kind, std::span(&upper, 1), dtype);
    const int64_t B = lower.cell.batch, H = lower.cell.hidden, GH = type.gates * H;
    // dx(steps * B, H) = dG(steps * B, G*H) W_ih(G*H, H)
    const void* dg = upper.cell.dgates_low ? upper.cell.dgates_low : upper.cell.dgates;
    gemm({.m = lower.steps * B, .n = H, .k = GH, .lda = GH, .ldb = H, .ldc = H}, upper.gemm, dg,
         chains[1].w_ih, upper.dx);
    lower.cell.dh_out = upper.dx;
    lower.cell.ld_dh_out = H;
    return recurrence_backward(kind, std::span(&lower, 1), dtype);
  }
  for (const RecurrenceBackward& a : chains) {
    const int64_t H = a.cell.hidden;
    for (int64_t k = 0; k < a.steps; ++k) {
      cell_backward(kind, ref::backward_step(a, k, type.gates, type.direct_state_grad, size),
                    dtype);
      // dh(B, H) (+)= dR(B, G*H) W_hh(G*H, H)
      GemmShape back{.m = a.cell.batch,
                     .n = H,
                     .k = type.gates * H,
                     .lda = type.gates * H,
                     .ldb = H,
                     .ldc = H};
      back.beta = type.direct_state_grad ? 1.0 : 0.0;
      gemm(back, a.gemm, ref::recurrent_operand(a, k, type.gates, type.recurrent_grads, size),
           a.w_hh, a.dh);
    }
  }
}

void Backend::begin_capture() { fail("the ", name(), " backend records no op sequences"); }
std::unique_ptr<StepGraph> Backend::end_capture() {
  fail("the ", name(), " backend records no op sequences");
}

void Backend::optimizer_step(const OptimizerStep& a, DType dtype) {
  SF_CHECK(host_addressable(), "the ", name(), " backend must run optimizer_step itself");
  const int64_t S = a.segment_count, size = dtype_size(dtype);
  const double lr = *a.lr;
  bool skip;
  ref::gradient_factor(a.grad_scale, a.clip, &skip);
  auto view = [&](void* base, int64_t offset, int64_t n) {
    return base ? Tensor(static_cast<char*>(base) + offset * size, dtype, {n}) : Tensor();
  };
  for (int64_t s = 0; s < S; ++s) {
    const OptimizerSegment& seg = a.segments[s];
    const Tensor g = view(a.grads, seg.grad_offset, seg.numel);
    if (seg.flags & OptimizerSegment::kFrozen) {
      if (a.zero_grads) fill(g, 0.0);
      continue;
    }
    const Tensor p = view(a.params, seg.value_offset, seg.numel);
    const Tensor m = view(a.m, seg.grad_offset, seg.numel);
    const int64_t step = a.steps[s] + 1;
    const double decay = seg.flags & OptimizerSegment::kDecays ? a.weight_decay : 0.0;
    if (a.kind == OptimizerKind::sgd) {
      sgd_step(p, g, m,
               {.lr = lr,
                .momentum = a.momentum,
                .dampening = a.dampening,
                .weight_decay = decay,
                .nesterov = a.nesterov,
                .first_step = step == 1,
                .grad_scale = a.grad_scale,
                .clip = a.clip});
      if (a.zero_grads) fill(g, 0.0);
    } else {
      adam_step(p, g, m, view(a.v, seg.grad_offset, seg.numel),
                {.lr = lr,
                 .beta1 = a.beta1,
                 .beta2 = a.beta2,
                 .eps = a.eps,
                 .weight_decay = decay,
                 .decoupled = a.kind == OptimizerKind::adamw,
                 .step = step,
                 .grad_scale = a.grad_scale,
                 .clip = a.clip,
                 .zero_grads = a.zero_grads});
    }
    if (!skip) a.steps[s] = step;
  }
}

}  // namespace seqforge
