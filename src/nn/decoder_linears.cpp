// The decoder's Linears (y = x W^T + b) with their LoRA/DoRA adapters (PEFT's computation, the
// base frozen): the adapters' parameters, DoRA's weights of each step, and each Linear's forward
// and backward on rows that may sit inside wider buffers (q, k and v side by side).
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include <algorithm>
#include <cmath>

#include "nn/decoder_parts.hpp"
#include "nn/dense.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

namespace {

// C (m, n), rows ldc apart, (beta C +)= alpha op(A) op(B).
void gemm(Backend& be, DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
          int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc, double alpha,
          double beta) {
  const GemmShape s{.trans_a = ta,
                    .trans_b = tb,
                    .m = m,
                    .n = n,
                    .k = k,
                    .lda = lda,
                    .ldb = ldb,
                    .ldc = ldc,
                    .alpha = alpha,
                    .beta = beta};
  be.gemm(s, dt, a, b, c);
}

const char* const kTargets[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                "gate_proj", "up_proj", "down_proj"};

}  // namespace

void Decoder::declare_adapters() {
  const AdapterOptions& a = opt_.adapter;
  if (a.kind == AdapterKind::none) return;
  SF_CHECK(a.rank > 0 && a.alpha > 0 && a.dropout >= 0 && a.dropout < 1, "adapter rank ", a.rank,
           ", alpha ", a.alpha, ", dropout ", a.dropout);
  for (const std::string& t : a.targets)
    if (std::find(std::begin(kTargets), std::end(kTargets), t) == std::end(kTargets))
      fail("adapter target '", t, "' is not a Linear of a ", opt_.model_type,
           " layer (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  train_base_ = false;
  for (size_t i = 0; i < base_params_; ++i)  // the base never trains: no gradient, no state
    if (i != score_) params_.fix(i);
  if (a.bf16_base)  // the Linears' weights held in bf16, the GEMMs' operands as they are
    for (auto& l : layers_)
      for (int j = 0; j < 7; ++j) params_.fix(l->projs()[j].w, DType::bf16);
  for (auto& l : layers_)
    for (int j = 0; j < 7; ++j) {
      if (std::find(a.targets.begin(), a.targets.end(), kTargets[j]) == a.targets.end()) continue;
      Proj& p = l->projs()[j];
      const std::string name = "base_model.model." + p.name;
      p.A = params_.declare(name + ".lora_A.weight", {a.rank, p.in},
                            Init::Uniform(1.0 / std::sqrt(double(p.in))));
      p.B = params_.declare(name + ".lora_B.weight", {p.out, a.rank}, Init::Constant(0.0));
      if (a.kind == AdapterKind::dora)
        p.m = params_.declare(name + ".lora_magnitude_vector", {p.out}, Init::Constant(1.0));
    }
}

std::vector<bool> Decoder::frozen_parameters() const {
  if (train_base_) return {};
  std::vector<bool> frozen(params_.size(), false);
  std::fill(frozen.begin(), frozen.begin() + std::ptrdiff_t(base_params_), true);
  if (score_ != kNone) frozen[score_] = false;  // new with the task: it trains
  return frozen;
}

std::vector<std::string> Decoder::fresh_parameters() const {
  std::vector<std::string> out;
  const auto& entries = params_.values().entries();
  if (score_ != kNone) out.push_back(entries[score_].name);
  for (size_t i = base_params_; i < params_.size(); ++i) out.push_back(entries[i].name);
  return out;
}

// DoRA's magnitudes not in `loaded` start at ||W0 + s B A|| per row (PEFT's start: ||W0||).
void Decoder::init_adapters(Backend& be, const std::vector<std::string>& loaded) {
  const int64_t r = opt_.adapter.rank;
  const double s = opt_.adapter.alpha / double(r);
  for (auto& l : layers_)
    for (int j = 0; j < 7; ++j) {
      Proj& p = l->projs()[j];
      if (p.m == kNone || std::find(loaded.begin(), loaded.end(),
                                    params_.values().entries()[p.m].name) != loaded.end())
        continue;
      nn::init_dora_magnitude(be, params_.value(p.m), params_.value(p.w), params_.value(p.A),
                              params_.value(p.B), s, params_.values().entries()[p.w].name);
    }
}

// This step's weights: DoRA's V = W0 + s B A and its row norms, from this step's A, B and m;
// with bf16 GEMMs, bf16 copies of each Linear's weight (DoRA: of V) and of the head, a frozen
// weight's made once.
void Decoder::prepare_weights(Backend& be) {
  const DType dt = params_.dtype();
  if (opt_.adapter.bf16_base && gemm_dt_ != DType::bf16)
    fail(
        "adapter.base_precision bf16: a base held in bf16 needs bf16 GEMMs (train.precision: "
        "bf16)");
  const double s = opt_.adapter.alpha / double(opt_.adapter.rank);
  for (auto& l : layers_)
    for (int j = 0; j < 7; ++j) {
      Proj& p = l->projs()[j];
      const Tensor w = params_.value(p.w);
      if (p.m != kNone) {
        const Tensor v = p.v.get(be, dt, {p.out, p.in});
        if (w.dtype() == dt)
          be.copy(v, w);
        else
          be.convert(v, w);
        gemm(be, dt, false, false, p.out, p.in, opt_.adapter.rank, params_.value(p.B).data(),
             opt_.adapter.rank, params_.value(p.A).data(), p.in, v.data(), p.in, s, 1.0);
        be.dora_norm(p.scale.get(be, dt, {p.out}), p.inv_norm.get(be, dt, {p.out}), v,
                     params_.value(p.m));
      }
      if (!low()) continue;
      if (p.m != kNone && opt_.adapter.dropout > 0 && w.dtype() != gemm_dt_ &&
          !frozen_low_ready_)  // W0 on the dropped-out part of the input
        be.convert(p.base_low.get(be, gemm_dt_, {p.out, p.in}), w);
      if (p.m != kNone)
        be.convert(p.w_low.get(be, gemm_dt_, {p.out, p.in}), p.v.tensor());
      else if (w.dtype() != gemm_dt_ && (!params_.fixed(p.w) || !frozen_low_ready_))
        be.convert(p.w_low.get(be, gemm_dt_, {p.out, p.in}), w);
    }
  if (low() && score_ == kNone && (!params_.fixed(head_) || !frozen_low_ready_))
    be.convert(head_low_.get(be, gemm_dt_, params_.value(head_).shape()), params_.value(head_));
  frozen_low_ready_ = low();
}

const void* Decoder::low_weight(const Proj& p) const {
  const Tensor w = params_.value(p.w);
  return p.m == kNone && w.dtype() == gemm_dt_ ? w.data() : p.w_low.tensor().data();
}

const void* Decoder::low_operand(Backend& be, Buffer& low_buf, const void* x, int64_t rows,
                                 int64_t cols, int64_t ld) {
  if (!low()) return nullptr;
  const DType dt = params_.dtype();
  Tensor packed(const_cast<void*>(x), dt, {rows, cols});
  if (ld != cols) {
    packed = scratch_->d_packed.get(be, dt, {rows, cols});
    be.copy_rows(packed.data(), cols, x, ld, rows, cols, dt);
  }
  const Tensor out = low_buf.get(be, gemm_dt_, {rows, cols});
  be.convert(out, packed);
  return out.data();
}

// W0's bf16 operand: a base held in bf16 itself, else its bf16 copy (DoRA: the one kept for
// adapter dropout, as its w_low holds V).
const void* Decoder::base_low_weight(const Proj& p) const {
  const Tensor w = params_.value(p.w);
  if (w.dtype() == gemm_dt_) return w.data();
  return (p.m == kNone ? p.w_low : p.base_low).tensor().data();
}

// y(N, out), rows ldy apart, = (residual +) the Linear of x(N, in), rows ldx apart (x_low: x as a
// packed bf16 operand, or null; residual: rows ldy apart, may be y): without an adapter one GEMM;
// with LoRA x W0^T + b + s (in A^T) B^T; with DoRA (m / ||V||)(in V^T) + b (+ (x - in) W0^T): the
// product in V^T packed, then scaled per column into y's rows. The adapter's input `in` is x, or
// with adapter dropout x * mask (PEFT's lora_dropout: the base keeps x, so DoRA adds W0 on the
// dropped-out part). With bf16 GEMMs the products with W0 and V take bf16 operands; the
// adapters' rank-r products stay in f32.
void Decoder::proj_forward(Backend& be, Proj& p, void* y, int64_t ldy, const void* x, int64_t ldx,
                           const void* x_low, const void* residual, bool unscaled) {
  const int64_t N = batch_ * seq_, r = opt_.adapter.rank;
  const DType dt = params_.dtype();
  const Tensor b = p.b == kNone ? Tensor() : params_.value(p.b);
  const double s = opt_.adapter.alpha / double(r);
  // out (N, out) rows ldo apart (out_beta out +)= a W^T: in bf16 from a_low and w_low, or in f32
  // from a (rows lda apart) and w.
  const auto product = [&](const void* a, int64_t lda, const void* a_low, const void* w,
                           const void* w_low, void* out, int64_t ldo, double out_beta) {
    if (a_low)
      gemm(be, gemm_dt_, false, true, N, p.out, p.in, a_low, p.in, w_low, p.in, out, ldo, 1.0,
           out_beta);
    else
      gemm(be, dt, false, true, N, p.out, p.in, a, lda, w, p.in, out, ldo, 1.0, out_beta);
  };
  const bool drop = adapter_dropping_ && p.A != kNone;
  const void* in = x;  // the adapter's input
  int64_t ldi = ldx;
  if (drop) {
    SF_CHECK(ldx == p.in, "adapter dropout on a Linear whose input rows are strided");
    const Tensor mask = p.xd_mask->get(be, dt, {N, p.in});
    be.dropout_mask(mask, opt_.adapter.dropout, p.seed);
    const Tensor xd = p.xd->get(be, dt, {N, p.in});
    be.mul(xd, Tensor(const_cast<void*>(x), dt, {N, p.in}), mask);
    in = xd.data(), ldi = p.in;
  }
  if (p.m == kNone) {
    if (residual && residual != y) be.copy_rows(y, ldy, residual, ldy, N, p.out, dt);
    product(x, ldx, x_low, params_.value(p.w).data(), low() ? low_weight(p) : nullptr, y, ldy,
            residual ? 1.0 : 0.0);
    if (!b.empty()) {  // + b on every row: ones (N, 1) b (1, out)
      const Tensor ones = scratch_->ones.tensor();
      gemm(be, dt, false, false, N, p.out, 1, ones.data(), 1, b.data(), p.out, y, ldy, 1.0, 1.0);
    }
    if (p.A == kNone) return;
    const Tensor xa = p.xa->get(be, dt, {N, r});
    gemm(be, dt, false, true, N, r, p.in, in, ldi, params_.value(p.A).data(), p.in, xa.data(), r,
         1.0, 0.0);
    gemm(be, dt, false, true, N, p.out, r, xa.data(), r, params_.value(p.B).data(), r, y, ldy, s,
         1.0);
    return;
  }
  const Tensor xa = p.xa->get(be, dt, {N, r});
  gemm(be, dt, false, true, N, r, p.in, in, ldi, params_.value(p.A).data(), p.in, xa.data(), r, 1.0,
       0.0);
  const Tensor pre = p.pre->get(be, dt, {N, p.out});
  // rest_low holds the dropped input's bf16 operand here, then the dropped-out part's below.
  const void* in_low = drop ? low_operand(be, scratch_->rest_low, in, N, p.in, p.in) : x_low;
  product(in, ldi, in_low, p.v.tensor().data(), low() ? low_weight(p) : nullptr, pre.data(), p.out,
          0.0);
  if (unscaled) {
    SF_CHECK(!drop, "DoRA's column scaling left to the caller with adapter dropout");
    return;
  }
  be.scale_columns(Tensor(y, dt, {N, p.out}), pre, p.scale.tensor(), b, ldy, residual);
  if (!drop) return;
  // + (x - in) W0^T
  const Tensor rest = scratch_->rest.get(be, dt, {N, p.in});
  be.copy(rest, Tensor(const_cast<void*>(in), dt, {N, p.in}));
  be.scale(rest, -1.0);
  be.add(rest, Tensor(const_cast<void*>(x), dt, {N, p.in}));
  product(rest.data(), p.in, low_operand(be, scratch_->rest_low, rest.data(), N, p.in, p.in),
          params_.value(p.w).data(), low() ? base_low_weight(p) : nullptr, y, ldy, 1.0);
}

bool Decoder::scaled_in_glu(const Proj& p) const { return p.m != kNone && !adapter_dropping_; }

Decoder::GluInputs Decoder::glu_inputs(Layer& l) const {
  GluInputs in;
  const auto input = [&](Proj& p, const Buffer& out, Tensor& scale, Tensor& bias) {
    if (!scaled_in_glu(p)) return out.tensor();
    scale = p.scale.tensor();
    if (p.b != kNone) bias = params_.value(p.b);
    return p.pre->tensor();
  };
  in.gate = input(l.gate, l.a->gate_out, in.affine.gate.scale, in.affine.gate.bias);
  in.up = input(l.up, l.a->up_out, in.affine.up.scale, in.affine.up.bias);
  return in;
}

// dx(N, in) (dx_beta dx +)= d(loss)/dx through the Linear, from dy(N, out) rows ldy apart; the
// gradients of what trains accumulate: W and b without adapters, A, B (and m) with them. With
// bf16 GEMMs (x_low: x's bf16 operand), the products with W0 or V and W's gradient take bf16
// operands. With adapter dropout the adapter's gradients read the input it had, and its part of
// dx passes the mask: LoRA dx = dy W0 + s (g A) * mask; DoRA dx = dy W0 + (dpre V - dy W0) * mask.
void Decoder::proj_backward(Backend& be, Proj& p, void* dx, double dx_beta, const void* dy,
                            int64_t ldy, const void* x, int64_t ldx, const void* x_low,
                            bool unscaled) {
  const int64_t N = batch_ * seq_, r = opt_.adapter.rank;
  const DType dt = params_.dtype();
  const double s = opt_.adapter.alpha / double(r);
  const Tensor ones = scratch_->ones.tensor();
  // out (N, in) (out_beta out +)= e W for e (N, out) rows lde apart and W0 or V: in bf16 (e's
  // bf16 operand and w_low) or f32 (w).
  const auto input_grad = [&](const void* e, int64_t lde, const void* w, const void* w_low,
                              void* out, double out_beta) {
    if (x_low)
      gemm(be, gemm_dt_, false, false, N, p.in, p.out,
           low_operand(be, scratch_->d_low, e, N, p.out, lde), p.out, w_low, p.in, out, p.in, 1.0,
           out_beta);
    else
      gemm(be, dt, false, false, N, p.in, p.out, e, lde, w, p.in, out, p.in, 1.0, out_beta);
  };
  const void* w0 = params_.value(p.w).data();
  if (p.A == kNone) {  // a plain Linear; its weights train unless the base is frozen
    if (dx) input_grad(dy, ldy, w0, x_low ? low_weight(p) : nullptr, dx, dx_beta);
    if (!train_base_) return;
    if (x_low)  // d_low holds dy when dx was computed; made again otherwise
      gemm(be, gemm_dt_, true, false, p.out, p.in, N,
           dx ? scratch_->d_low.tensor().data()
              : low_operand(be, scratch_->d_low, dy, N, p.out, ldy),
           p.out, x_low, p.in, params_.grad(p.w).data(), p.in, 1.0, 1.0);
    else
      gemm(be, dt, true, false, p.out, p.in, N, dy, ldy, x, ldx, params_.grad(p.w).data(), p.in,
           1.0, 1.0);
    if (p.b != kNone)
      gemm(be, dt, false, false, 1, p.out, N, ones.data(), N, dy, ldy, params_.grad(p.b).data(),
           p.out, 1.0, 1.0);
    return;
  }
  const bool drop = adapter_dropping_;
  const void* in = drop ? p.xd->tensor().data() : x;  // the adapter's input
  const int64_t ldi = drop ? p.in : ldx;
  const void* d = dy;  // the gradient at the adapted product: dy for LoRA, dpre for DoRA
  int64_t ldd = ldy;
  if (p.m != kNone && !unscaled) {
    const Tensor dpre = scratch_->dpre.get(be, dt, {N, p.out});
    be.dora_backward(dpre, params_.grad(p.m), Tensor(const_cast<void*>(dy), dt, {N, p.out}),
                     p.pre->tensor(), p.scale.tensor(), p.inv_norm.tensor(), ldy);
    d = dpre.data(), ldd = p.out;
  }
  // g = d B (N, rank); dB += s d^T (in A^T); dA += s g^T in.
  const Tensor g = scratch_->g.get(be, dt, {N, r});
  gemm(be, dt, false, false, N, r, p.out, d, ldd, params_.value(p.B).data(), r, g.data(), r, 1.0,
       0.0);
  gemm(be, dt, true, false, p.out, r, N, d, ldd, p.xa->tensor().data(), r, params_.grad(p.B).data(),
       r, s, 1.0);
  gemm(be, dt, true, false, r, p.in, N, g.data(), r, in, ldi, params_.grad(p.A).data(), p.in, s,
       1.0);
  if (!dx) return;
  const Tensor dxt(dx, dt, {N, p.in});
  if (p.m == kNone) {  // dx = d W0 + s (g A) (* mask)
    input_grad(d, ldd, w0, x_low ? low_weight(p) : nullptr, dx, dx_beta);
    if (!drop)
      return gemm(be, dt, false, false, N, p.in, r, g.data(), r, params_.value(p.A).data(), p.in,
                  dx, p.in, s, 1.0);
    const Tensor own = scratch_->own.get(be, dt, {N, p.in});
    gemm(be, dt, false, false, N, p.in, r, g.data(), r, params_.value(p.A).data(), p.in, own.data(),
         p.in, s, 0.0);
    be.mul(own, own, p.xd_mask->tensor());
    return be.add(dxt, own);
  }
  // DoRA, whose V holds s B A already: dx = dpre V, or with dropout dy W0 + (dpre V - dy W0) *
  // mask.
  if (!drop)
    return input_grad(d, ldd, p.v.tensor().data(), x_low ? low_weight(p) : nullptr, dx, dx_beta);
  const Tensor own = scratch_->own.get(be, dt, {N, p.in}),
               base = scratch_->own2.get(be, dt, {N, p.in});
  input_grad(d, ldd, p.v.tensor().data(), x_low ? low_weight(p) : nullptr, own.data(), 0.0);
  input_grad(dy, ldy, w0, x_low ? base_low_weight(p) : nullptr, base.data(), 0.0);
  be.scale(base, -1.0);
  be.add(own, base);  // dpre V - dy W0
  be.mul(own, own, p.xd_mask->tensor());
  be.scale(base, -1.0);
  be.add(own, base);
  if (dx_beta == 0) return be.copy(dxt, own);
  be.add(dxt, own);
}

}  // namespace seqforge
