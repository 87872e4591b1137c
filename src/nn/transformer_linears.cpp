// The blocks' Linears (y = x W^T + b) with their LoRA/DoRA adapters (PEFT's computation, the
// base frozen): the adapters' parameters, the weights of each step (DoRA's V, bf16 copies), and
// each Linear's forward and backward.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include <algorithm>
#include <cmath>

#include "nn/dense.hpp"
#include "nn/transformer_parts.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

using nn::gemm;
using nn::linear_forward;

void nn::linear_forward(Backend& be, Tensor y, Tensor x, Buffer& x_low, Tensor w, Tensor w_low,
                        Tensor b, double beta) {
  const int64_t n = x.dim(0), in = x.dim(1), out = y.dim(1);
  GemmShape s{
      .trans_b = true, .m = n, .n = out, .k = in, .lda = in, .ldb = in, .ldc = out, .beta = beta};
  s.bias = !b.empty();
  const void* bias = b.empty() ? nullptr : b.data();
  if (x.dtype() == DType::bf16 || x.dtype() == DType::f16) {  // already a half GEMM's operand
    SF_CHECK(w_low.dtype() == x.dtype(), "linear_forward: a ", dtype_name(x.dtype()),
             " input needs the weights' copy in it");
    return be.gemm(s, x.dtype(), x.data(), w_low.data(), y.data(), bias);
  }
  if (w_low.empty()) return be.gemm(s, w.dtype(), x.data(), w.data(), y.data(), bias);
  Tensor xl = x_low.get(be, w_low.dtype(), x.shape());
  be.convert(xl, x);
  be.gemm(s, w_low.dtype(), xl.data(), w_low.data(), y.data(), bias);
}

namespace {

// The operand of dy's GEMMs: dy itself (low: dy's dtype), or its copy in dy_low in the half type
// `low`.
const void* gemm_operand(Backend& be, Tensor dy, Buffer& dy_low, DType low) {
  if (low == dy.dtype()) return dy.data();
  Tensor gl = dy_low.get(be, low, dy.shape());
  be.convert(gl, dy);
  return gl.data();
}

// dx(N, in) = dy(N, out) W(out, in), from dy's operand g in the GEMMs' dtype `low`.
void linear_input_backward(Backend& be, Tensor dx, const void* g, Tensor dy, Tensor w, DType low) {
  const int64_t n = dy.dim(0), out = dy.dim(1), in = dx.dim(1);
  const GemmShape dxs{.m = n, .n = in, .k = out, .lda = out, .ldb = in, .ldc = in};
  be.gemm(dxs, low, g, w.data(), dx.data());
}

// dW += dy^T x, db += column sums of dy, dx = dy W; x and W as forward used them (half copies
// when `low` is a half type, and dy then converted into dy_low).
void linear_backward(Backend& be, Tensor dx, Tensor dw, Tensor db, Tensor dy, Buffer& dy_low,
                     Tensor x, Tensor w, DType low) {
  const int64_t n = dy.dim(0), out = dy.dim(1), in = dx.dim(1);
  const void* g = dy.data();
  if (low != dy.dtype() && !db.empty()) {  // one pass over dy for both
    Tensor gl = dy_low.get(be, low, dy.shape());
    be.sum_rows_acc_and_convert(db, dy, gl);
    g = gl.data();
  } else {
    if (!db.empty()) be.sum_rows_acc(db, dy);
    g = gemm_operand(be, dy, dy_low, low);
  }
  const GemmShape dws{
      .trans_a = true, .m = out, .n = in, .k = n, .lda = out, .ldb = in, .ldc = in, .beta = 1.0};
  be.gemm(dws, low, g, x.data(), dw.data());
  linear_input_backward(be, dx, g, dy, w, low);
}

}  // namespace

// After the base parameters, so that they keep nanoGPT's order and the adapters are contiguous.
void Transformer::declare_adapters() {
  const AdapterOptions& a = opt_.adapter;
  if (a.kind == AdapterKind::none) return;
  SF_CHECK(a.rank > 0 && a.alpha > 0 && a.dropout >= 0 && a.dropout < 1, "adapter rank ", a.rank,
           ", alpha ", a.alpha, ", dropout ", a.dropout);
  train_base_ = false;
  for (size_t i = 0; i < base_params_; ++i)  // the base never trains: no gradient, no state
    if (i != wse_ && i != cls_w_ && i != cls_b_) params_.fix(i);
  static const char* const kNames[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  for (const std::string& t : a.targets) {
    bool known = false;
    for (const char* n : kNames) known |= t == n;
    if (!known)
      fail("adapter target '", t, "' is not a Linear of a block (attn.c_attn, attn.c_proj, ",
           "mlp.c_fc, mlp.c_proj)");
  }
  for (size_t i = 0; i < blocks_.size(); ++i)
    for (int j = 0; j < 4; ++j) {
      if (std::find(a.targets.begin(), a.targets.end(), kNames[j]) == a.targets.end()) continue;
      Proj& p = blocks_[i]->p[j];
      const std::string name =
          "base_model.model.transformer.h." + std::to_string(i) + "." + kNames[j];
      if (a.bf16_base) params_.fix(p.w, DType::bf16);
      p.A = params_.declare(name + ".lora_A.weight", {a.rank, p.in},
                            Init::Uniform(1.0 / std::sqrt(double(p.in))));
      p.B = params_.declare(name + ".lora_B.weight", {p.out, a.rank}, Init::Constant(0.0));
      if (a.kind == AdapterKind::dora)
        p.m = params_.declare(name + ".lora_magnitude_vector", {p.out}, Init::Constant(1.0));
    }
}

std::vector<bool> Transformer::frozen_parameters() const {
  if (opt_.adapter.kind == AdapterKind::none) return {};
  std::vector<bool> frozen(params_.size(), false);
  std::fill(frozen.begin(), frozen.begin() + static_cast<std::ptrdiff_t>(base_params_), true);
  for (size_t i : {wse_, cls_w_, cls_b_})  // new with the task: they train
    if (i != kNone) frozen[i] = false;
  return frozen;
}

// m = ||W0 + s B A|| per row (PEFT's start: ||W0|| while B is zero), for the magnitudes not in
// `loaded`.
void Transformer::init_adapters(Backend& be, const std::vector<std::string>& loaded) {
  const int64_t r = opt_.adapter.rank;
  const double s = opt_.adapter.alpha / double(r);
  for (auto& k : blocks_)
    for (Proj& p : k->p) {
      if (p.m == Proj::kNone || std::find(loaded.begin(), loaded.end(),
                                          params_.values().entries()[p.m].name) != loaded.end())
        continue;
      nn::init_dora_magnitude(be, params_.value(p.m), params_.value(p.w), params_.value(p.A),
                              params_.value(p.B), s, params_.values().entries()[p.w].name);
    }
}

// The weights of this step: DoRA's V and its scales, bf16 copies for bf16 GEMMs.
void Transformer::prepare_weights(Backend& be) {
  SF_PROFILE_SCOPE("weights of the step");
  const DType dt = params_.dtype();
  if (opt_.adapter.bf16_base && !(low_ && low_type_ == DType::bf16))
    fail("adapter.base_precision: a base held in bf16 needs bf16 GEMMs (train.precision: bf16)");
  const double s = opt_.adapter.alpha / double(opt_.adapter.rank);
  for (auto& k : blocks_)
    for (Proj& p : k->p) {
      const Tensor w0 = params_.value(p.w);
      Tensor w = w0;
      if (p.m != Proj::kNone) {  // V = W0 + s B A; half GEMMs read only its half copy
        Tensor v = (low_ ? scratch_->v : p.v).get(be, dt, {p.out, p.in});
        if (w.dtype() == dt)
          be.copy(v, w);
        else
          be.convert(v, w);
        gemm(be, dt, false, false, p.out, p.in, opt_.adapter.rank, s, 1.0, params_.value(p.B),
             params_.value(p.A), v);
        be.dora_norm(p.scale.get(be, dt, {p.out}), p.inv_norm.get(be, dt, {p.out}), v,
                     params_.value(p.m));
        w = v;
      }
      if (low_ && w.dtype() != low_type_) be.convert(p.low.get(be, low_type_, {p.out, p.in}), w);
      if (low_ && p.A != Proj::kNone)
        be.convert(p.a_low.get(be, low_type_, {opt_.adapter.rank, p.in}), params_.value(p.A));
      if (low_ && p.m != Proj::kNone && adapter_dropping_ && w0.dtype() != low_type_)
        be.convert(p.base_low.get(be, low_type_, {p.out, p.in}), w0);
    }
}

// The weight half GEMMs use: W0 as base_weight gives it, or DoRA's V in its half copy.
Tensor Transformer::low_weight(const Proj& p) const {
  return p.m == Proj::kNone ? base_weight(p) : p.low.tensor();
}

// W0 as the GEMMs read it: a base held in bf16 itself, else its half copy of this step with half
// GEMMs (under DoRA only with adapter dropout, the GEMMs otherwise reading V).
Tensor Transformer::base_weight(const Proj& p) const {
  const Tensor w = params_.value(p.w);
  if (!low_ || w.dtype() == low_type_) return w;
  return p.m == Proj::kNone ? p.low.tensor() : p.base_low.tensor();
}

// xa(N, rank) = x A^T, on the half copies (the one linear_forward just made) with half GEMMs.
void Transformer::adapter_input(Backend& be, Proj& p, Tensor xa, Tensor x, Buffer& x_low) {
  const int64_t N = x.dim(0), r = opt_.adapter.rank;
  if (!low_)
    return gemm(be, params_.dtype(), false, true, N, r, p.in, 1.0f, 0.0f, x, params_.value(p.A),
                xa);
  gemm(be, low_type_, false, true, N, r, p.in, 1.0f, 0.0f, x_low.tensor(), p.a_low.tensor(), xa);
}

// dA(rank, in) += s g^T x; with half GEMMs from x's half copy (the f32 x is not kept).
void Transformer::adapter_grad_a(Backend& be, Proj& p, Tensor g, Tensor x, Tensor x_op, double s) {
  const int64_t N = g.dim(0), r = g.dim(1);
  if (!low_)
    return gemm(be, params_.dtype(), true, false, r, p.in, N, s, 1.0f, g, x, params_.grad(p.A));
  Tensor gl = scratch_->g_low.get(be, low_type_, g.shape());
  be.convert(gl, g);
  gemm(be, low_type_, true, false, r, p.in, N, s, 1.0f, gl, x_op, params_.grad(p.A));
}

// y(N, out) = (or with `add`, y +=) the Linear j of a block on x(N, in), its adapter included.
void Transformer::proj_forward(Backend& be, Proj& p, Acts& a, int j, Tensor y, Tensor x,
                               Buffer& x_low, uint64_t seed, bool add, bool unscaled) {
  const DType dt = params_.dtype();
  const Tensor b = bias(p.b), w_low = low_ ? low_weight(p) : Tensor();
  const double beta = add ? 1.0 : 0.0;
  if (p.A == Proj::kNone)
    return linear_forward(be, y, x, x_low, params_.value(p.w), w_low, b, beta);
  const AdapterOptions& ad = opt_.adapter;
  const int64_t N = x.dim(0), r = ad.rank;
  const double s = ad.alpha / double(r);
  Tensor in = x;  // the adapter's input: x, or x with dropout (PEFT's lora_dropout)
  if (adapter_dropping_) {
    Tensor mask = a.xd_mask[j].get(be, dt, x.shape());
    be.dropout_mask(mask, ad.dropout, mix_seed(seed, 16 + uint64_t(j)));
    in = a.xd[j].get(be, dt, x.shape());
    be.mul(in, x, mask);
  }
  if (p.m != Proj::kNone) {  // DoRA: y = (m / ||V||) in V^T + b (+ (x - in) W0^T, see below)
    Tensor pre = a.pre[j].get(be, dt, {N, p.out});
    linear_forward(be, pre, in, x_low, low_ ? Tensor() : p.v.tensor(), w_low, {});
    SF_CHECK(!unscaled || !adapter_dropping_,
             "DoRA's column scaling left to the caller with adapter dropout");
    if (!unscaled) be.scale_columns(y, pre, p.scale.tensor(), b, 0, add ? y.data() : nullptr);
    if (adapter_dropping_) {  // PEFT: the base on x, DoRA's correction on the dropped input
      Tensor rest = scratch_->rest.get(be, dt, x.shape());  // (N, in) x - in
      be.copy(rest, in);
      be.scale(rest, -1.0);
      be.add(rest, x);
      linear_forward(be, y, rest, scratch_->rest_low, params_.value(p.w),
                     low_ ? base_weight(p) : Tensor(), {}, 1.0f);
    }
  } else {  // LoRA: y = x W0^T + b + s in A^T B^T
    linear_forward(be, y, x, x_low, params_.value(p.w), w_low, b, beta);
  }
  Tensor xa = a.xa[j].get(be, dt, {N, r});  // (N, rank) in A^T
  if (adapter_dropping_)
    gemm(be, dt, false, true, N, r, p.in, 1.0f, 0.0f, in, params_.value(p.A), xa);
  else
    adapter_input(be, p, xa, x, x_low);
  if (p.m == Proj::kNone)
    gemm(be, dt, false, true, N, p.out, r, s, 1.0f, xa, params_.value(p.B), y);
}

ColumnMap Transformer::fc_map(const Proj& p) const {
  if (p.m == Proj::kNone || adapter_dropping_) return {};
  return {.scale = p.scale.tensor(), .bias = bias(p.b)};
}

// dx(N, in) from dy(N, out) through the Linear j, and the gradients of what trains: the base
// weights without adapters (unless frozen), the adapters with them. x as forward had it (f32).
void Transformer::proj_backward(Backend& be, Proj& p, Acts& a, int j, Tensor dx, Tensor dy,
                                Tensor x, Tensor x_op, bool unscaled) {
  const DType dt = params_.dtype();
  Scratch& sc = *scratch_;
  const Tensor w_op = base_weight(p);
  if (p.A == Proj::kNone) {
    if (train_base_)
      return linear_backward(be, dx, params_.grad(p.w),
                             p.b == Proj::kNone ? Tensor() : params_.grad(p.b), dy, sc.d_low, x_op,
                             w_op, operand_type());
    return linear_input_backward(be, dx, gemm_operand(be, dy, sc.d_low, operand_type()), dy, w_op,
                                 operand_type());
  }
  const AdapterOptions& ad = opt_.adapter;
  const int64_t N = dy.dim(0), r = ad.rank;
  const double s = ad.alpha / double(r);
  Tensor g = sc.g.get(be, dt, {N, r});  // (N, rank) the gradient at in A^T, over s
  // The adapter's dA += s g^T in, from the input forward gave it.
  auto grad_a = [&] {
    if (!adapter_dropping_) return adapter_grad_a(be, p, g, x, x_op, s);
    gemm(be, dt, true, false, r, p.in, N, s, 1.0f, g, a.xd[j].tensor(), params_.grad(p.A));
  };
  if (p.m != Proj::kNone) {  // DoRA, ||V|| a constant: dP = dy m/||V||, dm = sum dy in V^T/||V||
    Tensor dp = dy;
    if (!unscaled) {
      dp = sc.dp.get(be, dt, dy.shape());
      be.dora_backward(dp, params_.grad(p.m), dy, a.pre[j].tensor(), p.scale.tensor(),
                       p.inv_norm.tensor());
    }
    gemm(be, dt, true, false, p.out, r, N, s, 1.0f, dp, a.xa[j].tensor(), params_.grad(p.B));
    gemm(be, dt, false, false, N, r, p.out, 1.0f, 0.0f, dp, params_.value(p.B), g);
    grad_a();
    const Tensor v_op = low_ ? low_weight(p) : p.v.tensor();
    linear_input_backward(be, dx, gemm_operand(be, dp, sc.d_low, operand_type()), dp, v_op,
                          operand_type());
    if (!adapter_dropping_) return;
    // dx = dy W0 + (dP V - dy W0) * mask, from y = (x - in) W0^T + ... with in = x * mask.
    Tensor base = sc.t.get(be, dt, dx.shape());  // (N, in) dy W0
    linear_input_backward(be, base, gemm_operand(be, dy, sc.d_low, operand_type()), dy,
                          base_weight(p), operand_type());
    be.scale(base, -1.0);
    be.add(dx, base);
    be.mul(dx, dx, a.xd_mask[j].tensor());
    be.scale(base, -1.0);
    return be.add(dx, base);
  }
  // LoRA: dB += s dy^T xa, g = dy B, dA += s g^T in, dx = dy W0 + s (g A) * mask.
  gemm(be, dt, true, false, p.out, r, N, s, 1.0f, dy, a.xa[j].tensor(), params_.grad(p.B));
  gemm(be, dt, false, false, N, r, p.out, 1.0f, 0.0f, dy, params_.value(p.B), g);
  grad_a();
  linear_input_backward(be, dx, gemm_operand(be, dy, sc.d_low, operand_type()), dy, w_op,
                        operand_type());
  if (!adapter_dropping_)
    return gemm(be, dt, false, false, N, p.in, r, s, 1.0f, g, params_.value(p.A), dx);
  Tensor t = sc.t.get(be, dt, dx.shape());
  gemm(be, dt, false, false, N, p.in, r, s, 0.0f, g, params_.value(p.A), t);
  be.mul(t, t, a.xd_mask[j].tensor());
  be.add(dx, t);
}

}  // namespace seqforge
