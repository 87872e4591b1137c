// The transformer's forward and backward, block by block, llm.c style: every activation a buffer
// with its shape, the backward pass the forward one read in reverse.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include "seqforge/nn/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "nn/dense.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

using nn::gemm;

namespace {

constexpr double kLayerNormEps = 1e-5;

// y(N, out) = x(N, in) W(out, in)^T (+ b when given, + beta y); in bf16 on copies of x (made
// here into x_low) and of W (w_low, made once per step) when w_low is given.
void linear_forward(Backend& be, Tensor y, Tensor x, Buffer& x_low, Tensor w, Tensor w_low,
                    Tensor b, double beta = 0.0) {
  const int64_t n = x.dim(0), in = x.dim(1), out = y.dim(1);
  GemmShape s{
      .trans_b = true, .m = n, .n = out, .k = in, .lda = in, .ldb = in, .ldc = out, .beta = beta};
  s.bias = !b.empty();
  const void* bias = b.empty() ? nullptr : b.data();
  if (w_low.empty()) return be.gemm(s, w.dtype(), x.data(), w.data(), y.data(), bias);
  Tensor xl = x_low.get(be, DType::bf16, x.shape());
  be.convert(xl, x);
  be.gemm(s, DType::bf16, xl.data(), w_low.data(), y.data(), bias);
}

// The operand of dy's GEMMs: dy itself, or its bf16 copy in dy_low.
const void* gemm_operand(Backend& be, Tensor dy, Buffer& dy_low, bool low) {
  if (!low) return dy.data();
  Tensor gl = dy_low.get(be, DType::bf16, dy.shape());
  be.convert(gl, dy);
  return gl.data();
}

// dx(N, in) = dy(N, out) W(out, in), from dy's operand g.
void linear_input_backward(Backend& be, Tensor dx, const void* g, Tensor dy, Tensor w, bool low) {
  const int64_t n = dy.dim(0), out = dy.dim(1), in = dx.dim(1);
  const GemmShape dxs{.m = n, .n = in, .k = out, .lda = out, .ldb = in, .ldc = in};
  be.gemm(dxs, low ? DType::bf16 : dy.dtype(), g, w.data(), dx.data());
}

// dW += dy^T x, db += column sums of dy, dx = dy W; x and W as forward used them (bf16 copies
// with `low`, and dy then converted into dy_low).
void linear_backward(Backend& be, Tensor dx, Tensor dw, Tensor db, Tensor dy, Buffer& dy_low,
                     Tensor x, Tensor w, bool low) {
  const int64_t n = dy.dim(0), out = dy.dim(1), in = dx.dim(1);
  be.sum_rows_acc(db, dy);
  const void* g = gemm_operand(be, dy, dy_low, low);
  const GemmShape dws{
      .trans_a = true, .m = out, .n = in, .k = n, .lda = out, .ldb = in, .ldc = in, .beta = 1.0f};
  be.gemm(dws, low ? DType::bf16 : dy.dtype(), g, x.data(), dw.data());
  linear_input_backward(be, dx, g, dy, w, low);
}

}  // namespace

// One of a block's Linears (y = x W^T + b), with its adapter when it has one.
struct Transformer::Proj {
  int64_t in = 0, out = 0;
  size_t w = 0, b = 0;          // W0 (out, in), b (out)
  size_t A = kNone, B = kNone;  // adapter: A (rank, in), B (out, rank)
  size_t m = kNone;             // DoRA: magnitudes (out)
  Buffer v, scale, inv_norm;    // DoRA: V = W0 + s B A (out, in) (f32 GEMMs), m / ||V||,
                                // 1 / ||V|| (out)
  Buffer low;                   // bf16 copy of the weight the GEMMs use (W0, or V)
  Buffer base_low;              // DoRA with dropout: bf16 copy of W0 (out, in) when it is f32
  Buffer a_low;                 // bf16 copy of A (rank, in)
  static constexpr size_t kNone = SIZE_MAX;
};

// A block's parameters and its output.
struct Transformer::Block {
  size_t ln1_w, ln1_b, ln2_w, ln2_b;
  Proj p[4];          // attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
  Buffer out;         // (N, C) the next block's input
  uint64_t seed = 0;  // its dropout masks in the last forward
};

// What a block's backward needs of its forward: one per block, or one for all when activations
// are recomputed in backward.
struct Transformer::Acts {
  Buffer ln1, ln1_saved;                       // (N, C), (N, 2) mean and 1/std
  Buffer qkv;                                  // (N, 3C) q, k, v of every head
  Buffer att, lse;                             // (N, C) heads side by side, (B, H, T)
  Buffer mid;                                  // (N, C) x + attention branch
  Buffer ln2, ln2_saved;                       // (N, C), (N, 2)
  Buffer fc, gelu;                             // (N, 4C) before and after GELU
  Buffer mask1, mask2;                         // (N, C) dropout masks of the two branches
  Buffer ln1_low, att_low, ln2_low, gelu_low;  // bf16 GEMM operands (N, C), (N, C), (N, C), (N, 4C)
  // Per Linear with an adapter: x A^T (N, rank); DoRA: x V^T before scaling (N, out); LoRA with
  // dropout: the adapter's dropped input and its mask (N, in).
  Buffer xa[4], pre[4], xd[4], xd_mask[4];
};

// One block's scratch at a time, forward and backward.
struct Transformer::Scratch {
  Buffer ln, gelu;  // bf16 GEMMs: (N, C) a LayerNorm's output, (N, 4C) GELU's, before their bf16
                    // copies (which backward reads instead)
  Buffer branch;    // (N, C) a residual branch before it joins the stream
  Buffer dc1, dc2;  // (N, C)
  Buffer dmid;      // (N, C) gradient at x + attention branch
  Buffer d4;        // (N, 4C) d GELU output, then d fc
  Buffer dqkv;      // (N, 3C)
  Buffer d_low;     // bf16 copy of the gradient a GEMM reads, up to (N, 4C)
  Buffer dx[2];     // (N, C) the gradient flowing down, block by block
  Buffer g, g_low;  // adapters: (N, rank) the gradient at x A^T, and its bf16 copy
  Buffer dp, dp2;   // adapters: (N, out) DoRA's gradient at x V^T, and dy * x V^T
  Buffer dm_col;    // adapters: (out) DoRA's column sums of dy * x V^T
  Buffer t;         // adapters: (N, in) a with-dropout term of dx
  Buffer rest, rest_low;    // DoRA with dropout: (N, in) x minus the adapter's dropped input, and
                            // its bf16 copy
  Buffer dnorm_w, dnorm_b;  // (C) LayerNorm gradients of a frozen base, discarded
  Buffer dz;                // (N, C) at ln_f's output
  Buffer v;                 // (out, in) DoRA's V before its bf16 copy, with bf16 GEMMs
  Buffer x0_mask;           // (N, C) embedding dropout
};

Transformer::Transformer(const TransformerOptions& o, DType dtype) : opt_(o), params_(dtype) {
  SF_CHECK(o.vocab_size > 0 && o.block_size > 0 && o.n_layer > 0 && o.n_head > 0 && o.n_embd > 0 &&
               o.n_embd % o.n_head == 0,
           "transformer sizes: vocabulary ", o.vocab_size, ", block ", o.block_size, ", layers ",
           o.n_layer, ", heads ", o.n_head, ", width ", o.n_embd);
  model_opt_.family = ModelFamily::transformer;
  model_opt_.vocab_size = o.vocab_size;
  model_opt_.embedding_dim = o.n_embd;
  model_opt_.transformer = o;
  model_opt_.adapter = o.adapter;
  model_opt_.output_size = o.num_classes > 0 ? o.num_classes : o.vocab_size;
  model_opt_.per_step = o.num_classes == 0;
  const int64_t C = o.n_embd;
  const Init w = Init::Normal(0.0, 0.02), zero = Init::Constant(0.0), one = Init::Constant(1.0);
  const Init w_proj = Init::Normal(0.0, 0.02 / std::sqrt(2.0 * double(o.n_layer)));
  wte_ = params_.declare("transformer.wte.weight", {o.vocab_size, C}, w);
  wpe_ = params_.declare("transformer.wpe.weight", {o.block_size, C}, w);
  if (o.segments > 0) wse_ = params_.declare("transformer.wse.weight", {o.segments, C}, w);
  auto linear = [&](Proj& p, const std::string& name, int64_t in, int64_t out, Init init) {
    p.in = in;
    p.out = out;
    p.w = params_.declare(name + ".weight", {out, in}, init);
    p.b = params_.declare(name + ".bias", {out}, zero);
  };
  for (int64_t i = 0; i < o.n_layer; ++i) {
    const std::string h = "transformer.h." + std::to_string(i);
    auto k = std::make_unique<Block>();
    k->ln1_w = params_.declare(h + ".ln_1.weight", {C}, one);
    k->ln1_b = params_.declare(h + ".ln_1.bias", {C}, zero);
    linear(k->p[0], h + ".attn.c_attn", C, 3 * C, w);
    linear(k->p[1], h + ".attn.c_proj", C, C, w_proj);
    k->ln2_w = params_.declare(h + ".ln_2.weight", {C}, one);
    k->ln2_b = params_.declare(h + ".ln_2.bias", {C}, zero);
    linear(k->p[2], h + ".mlp.c_fc", C, 4 * C, w);
    linear(k->p[3], h + ".mlp.c_proj", 4 * C, C, w_proj);
    blocks_.push_back(std::move(k));
  }
  lnf_w_ = params_.declare("transformer.ln_f.weight", {C}, one);
  lnf_b_ = params_.declare("transformer.ln_f.bias", {C}, zero);
  if (o.num_classes > 0) {
    cls_w_ = params_.declare("classifier.weight", {o.num_classes, C}, w);
    cls_b_ = params_.declare("classifier.bias", {o.num_classes}, zero);
  } else {
    params_.alias("lm_head.weight", wte_);  // the tied output head
  }
  base_params_ = params_.size();
  declare_adapters();
  acts_.resize(1);
  scratch_ = std::make_unique<Scratch>();
}

Transformer::~Transformer() = default;

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
        p.m = params_.declare(name + ".lora_magnitude_vector.weight", {p.out}, Init::Constant(1.0));
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

std::vector<std::string> Transformer::fresh_parameters() const {
  std::vector<std::string> out;
  const auto& entries = params_.values().entries();
  for (size_t i : {wse_, cls_w_, cls_b_})
    if (i != kNone) out.push_back(entries[i].name);
  for (size_t i = base_params_; i < params_.size(); ++i) out.push_back(entries[i].name);
  return out;
}

std::vector<std::string> Transformer::unused_base_tensors() const {
  if (opt_.num_classes > 0) return {"lm_head.weight"};
  return {};
}

// One set of block activations (the one every block shares when checkpointing) and the blocks'
// outputs, which are kept either way.
std::string Transformer::activation_note() const {
  if (!opt_.checkpoint_activations || acts_.empty() || !acts_[0]) return {};
  const Acts& a = *acts_[0];
  size_t set = 0, outputs = 0;
  for (const Buffer* b :
       {&a.ln1, &a.ln1_saved, &a.qkv, &a.att, &a.lse, &a.mid, &a.ln2, &a.ln2_saved, &a.fc, &a.gelu,
        &a.mask1, &a.mask2, &a.ln1_low, &a.att_low, &a.ln2_low, &a.gelu_low})
    set += b->capacity();
  for (int j = 0; j < 4; ++j)
    set += a.xa[j].capacity() + a.pre[j].capacity() + a.xd[j].capacity() + a.xd_mask[j].capacity();
  for (const auto& k : blocks_) outputs += k->out.capacity();
  const double L = double(blocks_.size());
  auto mb = [](double bytes) {  // three significant digits below 100 MB
    char v[32];
    std::snprintf(v, sizeof v, bytes < 100.0 * (1 << 20) ? "%.3g" : "%.0f", bytes / (1 << 20));
    return std::string(v);
  };
  return "activation checkpointing: " + mb(double(set + outputs)) +
         " MB of block activations kept for backward instead of " +
         mb(L * double(set) + double(outputs)) + " MB (one block's set of " + mb(double(set)) +
         " MB recomputed at a time)";
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
      const std::vector<double> v = nn::adapted_weight(
          download_doubles(be, params_.value(p.w)), download_doubles(be, params_.value(p.A)),
          download_doubles(be, params_.value(p.B)), p.out, p.in, r, s);
      upload_doubles(be, params_.value(p.m), nn::row_norms(v, p.out, p.in));
    }
}

void Transformer::initialize(Backend& be, uint64_t seed) {
  Rng rng(seed);
  params_.allocate(be, rng);
  init_adapters(be, {});
}

void Transformer::set_gemm_dtype(DType dtype) {
  SF_CHECK(dtype == params_.dtype() || dtype == DType::bf16, "transformer GEMMs in ",
           dtype_name(dtype));
  low_ = dtype == DType::bf16;
}

Tensor Transformer::forward(Backend& be, Tensor ids, Tensor h0, Tensor c0, bool training,
                            Rng& rng) {
  SF_CHECK(h0.empty() && c0.empty(), "a transformer takes no initial states");
  return forward(be, ids, training, rng);
}

// The weights of this step: DoRA's V and its scales, bf16 copies for bf16 GEMMs.
void Transformer::prepare_weights(Backend& be) {
  const DType dt = params_.dtype();
  if (opt_.adapter.bf16_base && !low_)
    fail("adapter.base_precision: a base held in bf16 needs bf16 GEMMs (train.precision: bf16)");
  const double s = opt_.adapter.alpha / double(opt_.adapter.rank);
  for (auto& k : blocks_)
    for (Proj& p : k->p) {
      const Tensor w0 = params_.value(p.w);
      Tensor w = w0;
      if (p.m != Proj::kNone) {  // V = W0 + s B A; bf16 GEMMs read only its bf16 copy
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
      if (low_ && w.dtype() != DType::bf16)
        be.convert(p.low.get(be, DType::bf16, {p.out, p.in}), w);
      if (low_ && p.A != Proj::kNone)
        be.convert(p.a_low.get(be, DType::bf16, {opt_.adapter.rank, p.in}), params_.value(p.A));
      if (low_ && p.m != Proj::kNone && adapter_dropping_ && w0.dtype() != DType::bf16)
        be.convert(p.base_low.get(be, DType::bf16, {p.out, p.in}), w0);
    }
}

// The weight bf16 GEMMs use: W0 as base_weight gives it, or DoRA's V in its bf16 copy.
Tensor Transformer::low_weight(const Proj& p) const {
  return p.m == Proj::kNone ? base_weight(p) : p.low.tensor();
}

// W0 as the GEMMs read it: a base held in bf16 itself, else its bf16 copy of this step with bf16
// GEMMs (under DoRA only with adapter dropout, the GEMMs otherwise reading V).
Tensor Transformer::base_weight(const Proj& p) const {
  const Tensor w = params_.value(p.w);
  if (!low_ || w.dtype() == DType::bf16) return w;
  return p.m == Proj::kNone ? p.low.tensor() : p.base_low.tensor();
}

// xa(N, rank) = x A^T, on the bf16 copies (the one linear_forward just made) with bf16 GEMMs.
void Transformer::adapter_input(Backend& be, Proj& p, Tensor xa, Tensor x, Buffer& x_low) {
  const int64_t N = x.dim(0), r = opt_.adapter.rank;
  if (!low_)
    return gemm(be, params_.dtype(), false, true, N, r, p.in, 1.0f, 0.0f, x, params_.value(p.A),
                xa);
  gemm(be, DType::bf16, false, true, N, r, p.in, 1.0f, 0.0f, x_low.tensor(), p.a_low.tensor(), xa);
}

// dA(rank, in) += s g^T x; with bf16 GEMMs from x's bf16 copy (the f32 x is not kept).
void Transformer::adapter_grad_a(Backend& be, Proj& p, Tensor g, Tensor x, Tensor x_op, double s) {
  const int64_t N = g.dim(0), r = g.dim(1);
  if (!low_)
    return gemm(be, params_.dtype(), true, false, r, p.in, N, s, 1.0f, g, x, params_.grad(p.A));
  Tensor gl = scratch_->g_low.get(be, DType::bf16, g.shape());
  be.convert(gl, g);
  gemm(be, DType::bf16, true, false, r, p.in, N, s, 1.0f, gl, x_op, params_.grad(p.A));
}

// y(N, out) = the Linear j of a block on x(N, in), its adapter included.
void Transformer::proj_forward(Backend& be, Proj& p, Acts& a, int j, Tensor y, Tensor x,
                               Buffer& x_low, uint64_t seed) {
  const DType dt = params_.dtype();
  const Tensor bias = params_.value(p.b), w_low = low_ ? low_weight(p) : Tensor();
  if (p.A == Proj::kNone) return linear_forward(be, y, x, x_low, params_.value(p.w), w_low, bias);
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
    be.scale_columns(y, pre, p.scale.tensor(), bias);
    if (adapter_dropping_) {  // PEFT: the base on x, DoRA's correction on the dropped input
      Tensor rest = scratch_->rest.get(be, dt, x.shape());  // (N, in) x - in
      be.copy(rest, in);
      be.scale(rest, -1.0);
      be.add(rest, x);
      linear_forward(be, y, rest, scratch_->rest_low, params_.value(p.w),
                     low_ ? base_weight(p) : Tensor(), {}, 1.0f);
    }
  } else {  // LoRA: y = x W0^T + b + s in A^T B^T
    linear_forward(be, y, x, x_low, params_.value(p.w), w_low, bias);
  }
  Tensor xa = a.xa[j].get(be, dt, {N, r});  // (N, rank) in A^T
  if (adapter_dropping_)
    gemm(be, dt, false, true, N, r, p.in, 1.0f, 0.0f, in, params_.value(p.A), xa);
  else
    adapter_input(be, p, xa, x, x_low);
  if (p.m == Proj::kNone)
    gemm(be, dt, false, true, N, p.out, r, s, 1.0f, xa, params_.value(p.B), y);
}

// dx(N, in) from dy(N, out) through the Linear j, and the gradients of what trains: the base
// weights without adapters (unless frozen), the adapters with them. x as forward had it (f32).
void Transformer::proj_backward(Backend& be, Proj& p, Acts& a, int j, Tensor dx, Tensor dy,
                                Tensor x, Tensor x_op) {
  const DType dt = params_.dtype();
  Scratch& sc = *scratch_;
  const Tensor w_op = base_weight(p);
  if (p.A == Proj::kNone) {
    if (train_base_)
      return linear_backward(be, dx, params_.grad(p.w), params_.grad(p.b), dy, sc.d_low, x_op, w_op,
                             low_);
    return linear_input_backward(be, dx, gemm_operand(be, dy, sc.d_low, low_), dy, w_op, low_);
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
    Tensor dp = sc.dp.get(be, dt, dy.shape());
    be.scale_columns(dp, dy, p.scale.tensor(), {});
    Tensor t = sc.dp2.get(be, dt, dy.shape());  // dy in V^T, summed over rows, then / ||V||
    be.mul(t, dy, a.pre[j].tensor());
    Tensor col = sc.dm_col.get(be, dt, {p.out});
    be.fill(col, 0.0);
    be.sum_rows_acc(col, t);
    be.mul(col, col, p.inv_norm.tensor());
    be.add(params_.grad(p.m), col);
    gemm(be, dt, true, false, p.out, r, N, s, 1.0f, dp, a.xa[j].tensor(), params_.grad(p.B));
    gemm(be, dt, false, false, N, r, p.out, 1.0f, 0.0f, dp, params_.value(p.B), g);
    grad_a();
    const Tensor v_op = low_ ? low_weight(p) : p.v.tensor();
    linear_input_backward(be, dx, gemm_operand(be, dp, sc.d_low, low_), dp, v_op, low_);
    if (!adapter_dropping_) return;
    // dx = dy W0 + (dP V - dy W0) * mask, from y = (x - in) W0^T + ... with in = x * mask.
    Tensor base = sc.t.get(be, dt, dx.shape());  // (N, in) dy W0
    linear_input_backward(be, base, gemm_operand(be, dy, sc.d_low, low_), dy, base_weight(p), low_);
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
  linear_input_backward(be, dx, gemm_operand(be, dy, sc.d_low, low_), dy, w_op, low_);
  if (!adapter_dropping_)
    return gemm(be, dt, false, false, N, p.in, r, s, 1.0f, g, params_.value(p.A), dx);
  Tensor t = sc.t.get(be, dt, dx.shape());
  gemm(be, dt, false, false, N, p.in, r, s, 0.0f, g, params_.value(p.A), t);
  be.mul(t, t, a.xd_mask[j].tensor());
  be.add(dx, t);
}

// x *= a dropout mask drawn from `seed` into `mask` (kept for backward), when dropping.
void Transformer::drop(Backend& be, Tensor x, Buffer& mask, uint64_t seed) {
  if (!dropping_) return;
  Tensor m = mask.get(be, x.dtype(), x.shape());
  be.dropout_mask(m, opt_.dropout, seed);
  be.mul(x, x, m);
}

// The attention of block k: with bf16 products when the GEMMs are bf16; with dropout in
// training, on the probabilities too (nanoGPT's attn_dropout), its mask drawn from the block's
// seed.
AttentionShape Transformer::block_attention(const Block& k) const {
  AttentionShape s = shape_;
  s.bf16_products = low_;
  if (dropping_) {
    s.dropout = opt_.dropout;
    s.seed = mix_seed(k.seed, 3);
  }
  return s;
}

// x (N, C) -> the block's output (N, C), keeping in `a` what backward needs.
void Transformer::block_forward(Backend& be, Block& k, Acts& a, Tensor x) {
  const AttentionShape s = block_attention(k);
  const DType dt = params_.dtype();
  const int64_t N = x.dim(0), C = x.dim(1);
  auto W = [&](size_t i) { return params_.value(i); };
  Scratch& sc = *scratch_;
  // With bf16 GEMMs and no adapter reading them, the f32 LayerNorm and GELU outputs are scratch.
  const bool scratch_f32 = low_;
  {
    SF_PROFILE_SCOPE("attention projections forward");
    Tensor ln1 = (scratch_f32 ? sc.ln : a.ln1).get(be, dt, {N, C});
    be.layer_norm_forward(ln1, a.ln1_saved.get(be, dt, {N, 2}), x, W(k.ln1_w), W(k.ln1_b),
                          kLayerNormEps);
    proj_forward(be, k.p[0], a, 0, a.qkv.get(be, dt, {N, 3 * C}), ln1, a.ln1_low, k.seed);
  }
  Tensor att = a.att.get(be, dt, {N, C});
  {
    SF_PROFILE_SCOPE("attention forward");
    be.attention_forward({.shape = s,
                          .qkv = a.qkv.tensor().data(),
                          .lengths = lengths_.empty() ? nullptr : lengths_.data(),
                          .out = att.data(),
                          .lse = a.lse.get(be, dt, {s.batch, s.heads, s.seq}).data()},
                         dt);
  }
  SF_PROFILE_SCOPE("block forward");
  Tensor branch = sc.branch.get(be, dt, {N, C});
  proj_forward(be, k.p[1], a, 1, branch, att, a.att_low, k.seed);
  drop(be, branch, a.mask1, mix_seed(k.seed, 1));
  Tensor mid = a.mid.get(be, dt, {N, C});
  be.copy(mid, x);
  be.add(mid, branch);
  Tensor ln2 = (scratch_f32 ? sc.ln : a.ln2).get(be, dt, {N, C});
  be.layer_norm_forward(ln2, a.ln2_saved.get(be, dt, {N, 2}), mid, W(k.ln2_w), W(k.ln2_b),
                        kLayerNormEps);
  Tensor fc = a.fc.get(be, dt, {N, 4 * C});
  proj_forward(be, k.p[2], a, 2, fc, ln2, a.ln2_low, k.seed);
  Tensor gelu = (scratch_f32 ? sc.gelu : a.gelu).get(be, dt, {N, 4 * C});
  {
    SF_PROFILE_SCOPE("gelu");
    be.gelu_forward(gelu, fc);
  }
  proj_forward(be, k.p[3], a, 3, branch, gelu, a.gelu_low, k.seed);
  drop(be, branch, a.mask2, mix_seed(k.seed, 2));
  Tensor out = k.out.get(be, dt, {N, C});
  be.copy(out, mid);
  be.add(out, branch);
}

// dout (N, C) at the block's output -> dx (N, C) at its input x, into `dx`.
void Transformer::block_backward(Backend& be, Block& k, Acts& a, Tensor x, Tensor dout, Tensor dx) {
  SF_PROFILE_SCOPE("block backward");
  const AttentionShape s = block_attention(k);
  const DType dt = params_.dtype();
  const int64_t N = x.dim(0), C = x.dim(1);
  auto W = [&](size_t i) { return params_.value(i); };
  // LayerNorm parameter gradients, or scratch to discard them in when the base is frozen.
  auto G = [&](size_t i) {
    return train_base_ ? params_.grad(i)
                       : (i == k.ln1_w || i == k.ln2_w ? scratch_->dnorm_w : scratch_->dnorm_b)
                             .get(be, dt, {C});
  };
  // A GEMM's x operand as forward used it: the bf16 copy, or the f32 tensor.
  auto op = [&](Buffer& low, Buffer& full) { return low_ ? low.tensor() : full.tensor(); };
  Scratch& sc = *scratch_;
  // MLP branch: out = mid + drop(gelu(fc) W_mproj^T + b).
  Tensor dbranch = dout;
  if (dropping_) {
    dbranch = sc.dc1.get(be, dt, {N, C});
    be.mul(dbranch, dout, a.mask2.tensor());
  }
  Tensor d4 = sc.d4.get(be, dt, {N, 4 * C});  // (N, 4C) d gelu, then d fc in place
  proj_backward(be, k.p[3], a, 3, d4, dbranch, a.gelu.tensor(), op(a.gelu_low, a.gelu));
  {
    SF_PROFILE_SCOPE("gelu");
    be.gelu_backward(d4, d4, a.fc.tensor());
  }
  Tensor dln2 = sc.dc2.get(be, dt, {N, C});
  proj_backward(be, k.p[2], a, 2, dln2, d4, a.ln2.tensor(), op(a.ln2_low, a.ln2));
  Tensor dmid = sc.dmid.get(be, dt, {N, C});
  be.layer_norm_backward(dmid, G(k.ln2_w), G(k.ln2_b), dln2, a.mid.tensor(), W(k.ln2_w),
                         a.ln2_saved.tensor());
  be.add(dmid, dout);
  // Attention branch: mid = x + drop(att W_proj^T + b).
  dbranch = dmid;
  if (dropping_) {
    dbranch = sc.dc1.get(be, dt, {N, C});
    be.mul(dbranch, dmid, a.mask1.tensor());
  }
  Tensor datt = sc.dc2.get(be, dt, {N, C});
  proj_backward(be, k.p[1], a, 1, datt, dbranch, a.att.tensor(), op(a.att_low, a.att));
  Tensor dqkv = sc.dqkv.get(be, dt, {N, 3 * C});
  {
    SF_PROFILE_SCOPE("attention backward");
    be.attention_backward({.shape = s,
                           .qkv = a.qkv.tensor().data(),
                           .lengths = lengths_.empty() ? nullptr : lengths_.data(),
                           .out = a.att.tensor().data(),
                           .lse = a.lse.tensor().data(),
                           .dout = datt.data(),
                           .dqkv = dqkv.data()},
                          dt);
  }
  Tensor dln1 = sc.dc1.get(be, dt, {N, C});
  proj_backward(be, k.p[0], a, 0, dln1, dqkv, a.ln1.tensor(), op(a.ln1_low, a.ln1));
  be.layer_norm_backward(dx, G(k.ln1_w), G(k.ln1_b), dln1, x, W(k.ln1_w), a.ln1_saved.tensor());
  be.add(dx, dmid);
}

Tensor Transformer::forward(Backend& be, Tensor ids, bool training, Rng& rng) {
  SF_PROFILE_SCOPE("forward");
  SF_CHECK(ids.shape().rank() == 2, "transformer input: ids (B, T), got ", ids.shape().str());
  const int64_t B = ids.dim(0), T = ids.dim(1), N = B * T, C = opt_.n_embd;
  if (T > opt_.block_size)
    fail("sequence of ", T, " tokens is longer than the model's block size ", opt_.block_size);
  const DType dt = params_.dtype();
  shape_ = {.batch = B,
            .seq = T,
            .heads = opt_.n_head,
            .head_dim = C / opt_.n_head,
            .causal = opt_.causal,
            .scale = 1.0 / std::sqrt(double(C / opt_.n_head))};
  dropping_ = training && opt_.dropout > 0;
  adapter_dropping_ =
      training && opt_.adapter.kind != AdapterKind::none && opt_.adapter.dropout > 0;
  // One set of activations per block, or one for all when backward recomputes them.
  acts_.resize(opt_.checkpoint_activations ? 1 : blocks_.size());
  for (auto& a : acts_)
    if (!a) a = std::make_unique<Acts>();
  prepare_weights(be);
  ids_ = ids.reshape({N});
  Tensor x0 = x0_.get(be, dt, {N, C});  // (N, C) token + position embeddings
  be.embedding_forward(x0, params_.value(wte_), ids_);
  const Tensor positions = params_.value(wpe_).slice(0, T);  // (T, C)
  for (int64_t b = 0; b < B; ++b) be.add(x0.reshape({B, T * C}).slice(b, b + 1), positions);
  SF_CHECK(lengths_.empty() || lengths_.shape() == Shape({B}), "transformer: lengths ",
           lengths_.shape().str(), " for ", B, " sequences");
  if (wse_ != kNone) {
    SF_CHECK(segments_.shape() == Shape({B, T}), "transformer: segments ", segments_.shape().str(),
             " for ids ", ids.shape().str());
    Tensor se = seg_emb_.get(be, dt, {N, C});  // (N, C)
    be.embedding_forward(se, params_.value(wse_), segments_.reshape({N}));
    be.add(x0, se);
  }
  if (dropping_) drop(be, x0, scratch_->x0_mask, rng.next());
  Tensor x = x0;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& k = *blocks_[i];
    if (dropping_ || adapter_dropping_) k.seed = rng.next();
    block_forward(be, k, *acts_[opt_.checkpoint_activations ? 0 : i], x);
    x = k.out.tensor();
  }
  z_ = z_buf_.get(be, dt, {N, C});  // (N, C) ln_f's output
  be.layer_norm_forward(z_, lnf_saved_.get(be, dt, {N, 2}), x, params_.value(lnf_w_),
                        params_.value(lnf_b_), kLayerNormEps);
  if (cls_w_ != kNone) return head_forward(be);
  Tensor logits = logits_.get(be, dt, {N, opt_.vocab_size});  // (N, V) = z wte^T
  gemm(be, dt, false, true, N, opt_.vocab_size, C, 1.0f, 0.0f, z_, params_.value(wte_), logits);
  return logits;
}

// The classifier on the mean of z over each row's tokens: pooled (B, C) = P z with P (B, N)
// holding 1 / length at a row's tokens, logits (B, K) = pooled W^T + b.
Tensor Transformer::head_forward(Backend& be) {
  const int64_t B = shape_.batch, T = shape_.seq, N = B * T, C = opt_.n_embd, K = opt_.num_classes;
  const DType dt = params_.dtype();
  std::vector<int64_t> lengths(static_cast<size_t>(B), T);
  if (!lengths_.empty()) lengths = download_vector<int64_t>(be, lengths_);
  std::vector<double> p(static_cast<size_t>(B * N), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    SF_CHECK(lengths[b] >= 1 && lengths[b] <= T, "transformer: sequence ", b, " has length ",
             lengths[b], ", not in [1, ", T, "]");
    std::fill_n(p.begin() + b * N + b * T, lengths[b], 1.0 / double(lengths[b]));
  }
  Tensor pool = pool_.get(be, dt, {B, N});
  upload_doubles(be, pool, p);
  Tensor pooled = pooled_.get(be, dt, {B, C});
  gemm(be, dt, false, false, B, C, N, 1.0f, 0.0f, pool, z_, pooled);
  Tensor logits = logits_.get(be, dt, {B, K});
  Buffer unused;
  linear_forward(be, logits, pooled, unused, params_.value(cls_w_), {}, params_.value(cls_b_));
  return logits;
}

// dlogits (B, K) -> the classifier's gradients and dz (N, C) = P^T dpooled.
Tensor Transformer::head_backward(Backend& be, Tensor dlogits) {
  const int64_t B = shape_.batch, N = B * shape_.seq, C = opt_.n_embd, K = opt_.num_classes;
  const DType dt = params_.dtype();
  SF_CHECK(dlogits.shape() == Shape({B, K}), "transformer backward: dlogits ",
           dlogits.shape().str(), ", expected ", Shape({B, K}).str());
  gemm(be, dt, true, false, K, C, B, 1.0f, 1.0f, dlogits, pooled_.tensor(), params_.grad(cls_w_));
  be.sum_rows_acc(params_.grad(cls_b_), dlogits);
  Tensor dpooled = dpooled_.get(be, dt, {B, C});
  gemm(be, dt, false, false, B, C, K, 1.0f, 0.0f, dlogits, params_.value(cls_w_), dpooled);
  Tensor dz = scratch_->dz.get(be, dt, {N, C});
  gemm(be, dt, true, false, N, C, B, 1.0f, 0.0f, pool_.tensor(), dpooled, dz);
  return dz;
}

void Transformer::decode_start(Backend& be) {
  SF_CHECK(opt_.num_classes == 0, "decoding needs a language model, not a classifier");
  decode_pos_ = 0;
  dropping_ = adapter_dropping_ = false;
  prepare_weights(be);  // the weights hold still while generating
  kv_.resize(blocks_.size());
  if (acts_.empty()) acts_.resize(1);
  if (!acts_[0]) acts_[0] = std::make_unique<Acts>();
}

// The new tokens through every block, each attending to the cached q, k, v rows of the tokens
// before it: the Linears run on the new rows only.
Tensor Transformer::decode(Backend& be, Tensor ids) {
  SF_PROFILE_SCOPE("decode");
  const int64_t n = ids.numel(), C = opt_.n_embd, T = decode_pos_ + n;
  SF_CHECK(n > 0 && T <= opt_.block_size, "decode: ", decode_pos_, " cached + ", n,
           " new tokens exceed the block size ", opt_.block_size);
  const DType dt = params_.dtype();
  Acts& a = *acts_[0];
  Scratch& sc = *scratch_;
  auto W = [&](size_t i) { return params_.value(i); };
  Tensor x = x0_.get(be, dt, {n, C});  // (n, C) the new tokens' embeddings
  be.embedding_forward(x, W(wte_), ids.reshape({n}));
  be.add(x, W(wpe_).slice(decode_pos_, T));
  const AttentionShape s{.batch = 1,
                         .seq = T,
                         .heads = opt_.n_head,
                         .head_dim = C / opt_.n_head,
                         .causal = opt_.causal,
                         .scale = 1.0 / std::sqrt(double(C / opt_.n_head))};
  SF_CHECK(opt_.causal, "decoding needs a causal model");
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& k = *blocks_[i];
    // (block_size, 3C) the q, k, v rows of every token so far.
    Tensor cache = kv_[i].get(be, dt, {opt_.block_size, 3 * C});
    Tensor ln1 = a.ln1.get(be, dt, {n, C});
    be.layer_norm_forward(ln1, a.ln1_saved.get(be, dt, {n, 2}), x, W(k.ln1_w), W(k.ln1_b),
                          kLayerNormEps);
    proj_forward(be, k.p[0], a, 0, cache.slice(decode_pos_, T), ln1, a.ln1_low, 0);
    Tensor att = a.att.get(be, dt, {T, C});  // (T, C) every row; the new ones are the last n
    be.attention_forward({.shape = s,
                          .qkv = cache.data(),
                          .out = att.data(),
                          .lse = a.lse.get(be, dt, {1, s.heads, T}).data()},
                         dt);
    Tensor branch = sc.branch.get(be, dt, {n, C});
    proj_forward(be, k.p[1], a, 1, branch, att.slice(decode_pos_, T), a.att_low, 0);
    Tensor mid = a.mid.get(be, dt, {n, C});
    be.copy(mid, x);
    be.add(mid, branch);
    Tensor ln2 = a.ln2.get(be, dt, {n, C});
    be.layer_norm_forward(ln2, a.ln2_saved.get(be, dt, {n, 2}), mid, W(k.ln2_w), W(k.ln2_b),
                          kLayerNormEps);
    Tensor fc = a.fc.get(be, dt, {n, 4 * C});
    proj_forward(be, k.p[2], a, 2, fc, ln2, a.ln2_low, 0);
    Tensor gelu = a.gelu.get(be, dt, {n, 4 * C});
    be.gelu_forward(gelu, fc);
    proj_forward(be, k.p[3], a, 3, branch, gelu, a.gelu_low, 0);
    x = k.out.get(be, dt, {n, C});
    be.copy(x, mid);
    be.add(x, branch);
  }
  decode_pos_ = T;
  Tensor z = z_buf_.get(be, dt, {n, C});
  be.layer_norm_forward(z, lnf_saved_.get(be, dt, {n, 2}), x, W(lnf_w_), W(lnf_b_), kLayerNormEps);
  Tensor logits = logits_.get(be, dt, {n, opt_.vocab_size});
  gemm(be, dt, false, true, n, opt_.vocab_size, C, 1.0f, 0.0f, z, W(wte_), logits);
  return logits;
}

void Transformer::backward_logits(Backend& be, Tensor dlogits) {
  SF_PROFILE_SCOPE("backward");
  const int64_t N = ids_.numel(), C = opt_.n_embd, V = opt_.vocab_size;
  const int64_t B = shape_.batch, T = shape_.seq;
  const DType dt = params_.dtype();
  Scratch& sc = *scratch_;
  Tensor dz;  // (N, C)
  if (cls_w_ != kNone) {
    dz = head_backward(be, dlogits);
  } else {  // the tied head: dwte(V, C) += dlogits^T z, dz(N, C) = dlogits wte
    SF_CHECK(dlogits.shape() == Shape({N, V}), "transformer backward: dlogits ",
             dlogits.shape().str());
    if (train_base_)
      gemm(be, dt, true, false, V, C, N, 1.0f, 1.0f, dlogits, z_, params_.grad(wte_));
    dz = sc.dz.get(be, dt, {N, C});
    gemm(be, dt, false, false, N, C, V, 1.0f, 0.0f, dlogits, params_.value(wte_), dz);
  }
  const size_t L = blocks_.size();
  Tensor dx = sc.dx[L % 2].get(be, dt, {N, C});
  be.layer_norm_backward(dx, train_base_ ? params_.grad(lnf_w_) : sc.dnorm_w.get(be, dt, {C}),
                         train_base_ ? params_.grad(lnf_b_) : sc.dnorm_b.get(be, dt, {C}), dz,
                         blocks_[L - 1]->out.tensor(), params_.value(lnf_w_), lnf_saved_.tensor());
  for (size_t i = L; i-- > 0;) {
    Block& k = *blocks_[i];
    const Tensor x = i > 0 ? blocks_[i - 1]->out.tensor() : x0_.tensor();
    if (opt_.checkpoint_activations && i + 1 < L) {  // the shared activations hold the last block's
      SF_PROFILE_SCOPE("recompute");
      block_forward(be, k, *acts_[0], x);
    }
    Tensor down = sc.dx[i % 2].get(be, dt, {N, C});
    block_backward(be, k, *acts_[opt_.checkpoint_activations ? 0 : i], x, dx, down);
    dx = down;
  }
  if (dropping_) be.mul(dx, dx, sc.x0_mask.tensor());
  if (wse_ != kNone) be.embedding_backward(params_.grad(wse_), dx, segments_.reshape({N}));
  if (train_base_) {
    be.embedding_backward(params_.grad(wte_), dx, ids_);
    // Each position's gradient summed over the batch.
    be.sum_rows_acc(params_.grad(wpe_).slice(0, T).reshape({T * C}), dx.reshape({B, T * C}));
  }
  if (grad_ready_) grad_ready_(0, params_.size());
}

}  // namespace seqforge
