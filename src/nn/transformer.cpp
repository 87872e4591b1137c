// The transformer's forward and backward, block by block, llm.c style: every activation a buffer
// with its shape, the backward pass the forward one read in reverse.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include "seqforge/nn/transformer.hpp"

#include <cmath>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

namespace {

constexpr double kLayerNormEps = 1e-5;

// y(N, out) = x(N, in) W(out, in)^T + b; in bf16 on copies of x (made here into x_low) and of W
// (w_low, made once per step) when w_low is given.
void linear_forward(Backend& be, Tensor y, Tensor x, Buffer& x_low, Tensor w, Tensor w_low,
                    Tensor b) {
  const int64_t n = x.dim(0), in = x.dim(1), out = y.dim(1);
  GemmShape s{.trans_b = true, .m = n, .n = out, .k = in, .lda = in, .ldb = in, .ldc = out};
  s.bias = true;
  if (w_low.empty()) return be.gemm(s, w.dtype(), x.data(), w.data(), y.data(), b.data());
  Tensor xl = x_low.get(be, DType::bf16, x.shape());
  be.convert(xl, x);
  be.gemm(s, DType::bf16, xl.data(), w_low.data(), y.data(), b.data());
}

// dW += dy^T x, db += column sums of dy, dx = dy W; x and W as forward used them (bf16 copies
// with w_low, and dy then converted into dy_low).
void linear_backward(Backend& be, Tensor dx, Tensor dw, Tensor db, Tensor dy, Buffer& dy_low,
                     Tensor x, Tensor w, bool low) {
  const int64_t n = dy.dim(0), out = dy.dim(1), in = dx.dim(1);
  be.sum_rows_acc(db, dy);
  const void* g = dy.data();
  if (low) {
    Tensor gl = dy_low.get(be, DType::bf16, dy.shape());
    be.convert(gl, dy);
    g = gl.data();
  }
  const DType dt = low ? DType::bf16 : dy.dtype();
  const GemmShape dws{
      .trans_a = true, .m = out, .n = in, .k = n, .lda = out, .ldb = in, .ldc = in, .beta = 1.0f};
  be.gemm(dws, dt, g, x.data(), dw.data());
  const GemmShape dxs{.m = n, .n = in, .k = out, .lda = out, .ldb = in, .ldc = in};
  be.gemm(dxs, dt, g, w.data(), dx.data());
}

}  // namespace

// A block's parameters, its bf16 weight copies and its output.
struct Transformer::Block {
  size_t ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mproj_w, mproj_b;
  Buffer attn_low, proj_low, fc_low, mproj_low;  // bf16 (3C, C), (C, C), (4C, C), (C, 4C)
  Buffer out;                                    // (N, C) the next block's input
  uint64_t seed = 0;                             // its dropout masks in the last forward
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
  Buffer dz;        // (N, C) at ln_f's output
  Buffer x0_mask;   // (N, C) embedding dropout
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
  model_opt_.output_size = o.vocab_size;
  model_opt_.per_step = true;
  const int64_t C = o.n_embd;
  const Init w = Init::Normal(0.0, 0.02), zero = Init::Constant(0.0), one = Init::Constant(1.0);
  const Init w_proj = Init::Normal(0.0, 0.02 / std::sqrt(2.0 * double(o.n_layer)));
  wte_ = params_.declare("transformer.wte.weight", {o.vocab_size, C}, w);
  wpe_ = params_.declare("transformer.wpe.weight", {o.block_size, C}, w);
  for (int64_t i = 0; i < o.n_layer; ++i) {
    const std::string h = "transformer.h." + std::to_string(i);
    auto k = std::make_unique<Block>();
    k->ln1_w = params_.declare(h + ".ln_1.weight", {C}, one);
    k->ln1_b = params_.declare(h + ".ln_1.bias", {C}, zero);
    k->attn_w = params_.declare(h + ".attn.c_attn.weight", {3 * C, C}, w);
    k->attn_b = params_.declare(h + ".attn.c_attn.bias", {3 * C}, zero);
    k->proj_w = params_.declare(h + ".attn.c_proj.weight", {C, C}, w_proj);
    k->proj_b = params_.declare(h + ".attn.c_proj.bias", {C}, zero);
    k->ln2_w = params_.declare(h + ".ln_2.weight", {C}, one);
    k->ln2_b = params_.declare(h + ".ln_2.bias", {C}, zero);
    k->fc_w = params_.declare(h + ".mlp.c_fc.weight", {4 * C, C}, w);
    k->fc_b = params_.declare(h + ".mlp.c_fc.bias", {4 * C}, zero);
    k->mproj_w = params_.declare(h + ".mlp.c_proj.weight", {C, 4 * C}, w_proj);
    k->mproj_b = params_.declare(h + ".mlp.c_proj.bias", {C}, zero);
    blocks_.push_back(std::move(k));
  }
  lnf_w_ = params_.declare("transformer.ln_f.weight", {C}, one);
  lnf_b_ = params_.declare("transformer.ln_f.bias", {C}, zero);
  params_.alias("lm_head.weight", wte_);  // the tied output head
  acts_.resize(1);
  scratch_ = std::make_unique<Scratch>();
}

Transformer::~Transformer() = default;

void Transformer::initialize(Backend& be, uint64_t seed) {
  Rng rng(seed);
  params_.allocate(be, rng);
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

// x (N, C) -> the block's output (N, C), keeping in `a` what backward needs.
void Transformer::block_forward(Backend& be, Block& k, Acts& a, Tensor x) {
  const AttentionShape& s = shape_;
  const DType dt = params_.dtype();
  const int64_t N = x.dim(0), C = x.dim(1);
  auto W = [&](size_t i) { return params_.value(i); };
  auto low = [&](Buffer& b) { return low_ ? b.tensor() : Tensor(); };
  Scratch& sc = *scratch_;
  {
    SF_PROFILE_SCOPE("attention projections forward");
    Tensor ln1 = (low_ ? sc.ln : a.ln1).get(be, dt, {N, C});
    be.layer_norm_forward(ln1, a.ln1_saved.get(be, dt, {N, 2}), x, W(k.ln1_w), W(k.ln1_b),
                          kLayerNormEps);
    linear_forward(be, a.qkv.get(be, dt, {N, 3 * C}), ln1, a.ln1_low, W(k.attn_w), low(k.attn_low),
                   W(k.attn_b));
  }
  Tensor att = a.att.get(be, dt, {N, C});
  {
    SF_PROFILE_SCOPE("attention forward");
    be.attention_forward({.shape = s,
                          .qkv = a.qkv.tensor().data(),
                          .out = att.data(),
                          .lse = a.lse.get(be, dt, {s.batch, s.heads, s.seq}).data()},
                         dt);
  }
  SF_PROFILE_SCOPE("block forward");
  const bool drop = dropping_;
  Tensor branch = sc.branch.get(be, dt, {N, C});
  linear_forward(be, branch, att, a.att_low, W(k.proj_w), low(k.proj_low), W(k.proj_b));
  if (drop) {
    Tensor mask = a.mask1.get(be, dt, {N, C});
    be.dropout_mask(mask, opt_.dropout, mix_seed(k.seed, 1));
    be.mul(branch, branch, mask);
  }
  Tensor mid = a.mid.get(be, dt, {N, C});
  be.copy(mid, x);
  be.add(mid, branch);
  Tensor ln2 = (low_ ? sc.ln : a.ln2).get(be, dt, {N, C});
  be.layer_norm_forward(ln2, a.ln2_saved.get(be, dt, {N, 2}), mid, W(k.ln2_w), W(k.ln2_b),
                        kLayerNormEps);
  Tensor fc = a.fc.get(be, dt, {N, 4 * C});
  linear_forward(be, fc, ln2, a.ln2_low, W(k.fc_w), low(k.fc_low), W(k.fc_b));
  Tensor gelu = (low_ ? sc.gelu : a.gelu).get(be, dt, {N, 4 * C});
  {
    SF_PROFILE_SCOPE("gelu");
    be.gelu_forward(gelu, fc);
  }
  linear_forward(be, branch, gelu, a.gelu_low, W(k.mproj_w), low(k.mproj_low), W(k.mproj_b));
  if (drop) {
    Tensor mask = a.mask2.get(be, dt, {N, C});
    be.dropout_mask(mask, opt_.dropout, mix_seed(k.seed, 2));
    be.mul(branch, branch, mask);
  }
  Tensor out = k.out.get(be, dt, {N, C});
  be.copy(out, mid);
  be.add(out, branch);
}

// dout (N, C) at the block's output -> dx (N, C) at its input x, into `dx`.
void Transformer::block_backward(Backend& be, Block& k, Acts& a, Tensor x, Tensor dout, Tensor dx) {
  SF_PROFILE_SCOPE("block backward");
  const AttentionShape& s = shape_;
  const DType dt = params_.dtype();
  const int64_t N = x.dim(0), C = x.dim(1);
  auto W = [&](size_t i) { return params_.value(i); };
  auto G = [&](size_t i) { return params_.grad(i); };
  // A GEMM operand as forward used it: the bf16 copy, or the f32 tensor.
  auto op = [&](Buffer& low, Tensor full) { return low_ ? low.tensor() : full; };
  Scratch& sc = *scratch_;
  // MLP branch: out = mid + drop(gelu(fc) W_mproj^T + b).
  Tensor dbranch = dout;
  if (dropping_) {
    dbranch = sc.dc1.get(be, dt, {N, C});
    be.mul(dbranch, dout, a.mask2.tensor());
  }
  Tensor d4 = sc.d4.get(be, dt, {N, 4 * C});  // (N, 4C) d gelu, then d fc in place
  linear_backward(be, d4, G(k.mproj_w), G(k.mproj_b), dbranch, sc.d_low,
                  op(a.gelu_low, a.gelu.tensor()), op(k.mproj_low, W(k.mproj_w)), low_);
  {
    SF_PROFILE_SCOPE("gelu");
    be.gelu_backward(d4, d4, a.fc.tensor());
  }
  Tensor dln2 = sc.dc2.get(be, dt, {N, C});
  linear_backward(be, dln2, G(k.fc_w), G(k.fc_b), d4, sc.d_low, op(a.ln2_low, a.ln2.tensor()),
                  op(k.fc_low, W(k.fc_w)), low_);
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
  linear_backward(be, datt, G(k.proj_w), G(k.proj_b), dbranch, sc.d_low,
                  op(a.att_low, a.att.tensor()), op(k.proj_low, W(k.proj_w)), low_);
  Tensor dqkv = sc.dqkv.get(be, dt, {N, 3 * C});
  {
    SF_PROFILE_SCOPE("attention backward");
    be.attention_backward({.shape = s,
                           .qkv = a.qkv.tensor().data(),
                           .out = a.att.tensor().data(),
                           .lse = a.lse.tensor().data(),
                           .dout = datt.data(),
                           .dqkv = dqkv.data()},
                          dt);
  }
  Tensor dln1 = sc.dc1.get(be, dt, {N, C});
  linear_backward(be, dln1, G(k.attn_w), G(k.attn_b), dqkv, sc.d_low, op(a.ln1_low, a.ln1.tensor()),
                  op(k.attn_low, W(k.attn_w)), low_);
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
  // One set of activations per block, or one for all when backward recomputes them.
  acts_.resize(opt_.checkpoint_activations ? 1 : blocks_.size());
  for (auto& a : acts_)
    if (!a) a = std::make_unique<Acts>();
  if (low_)  // the bf16 weights of this step
    for (auto& k : blocks_) {
      be.convert(k->attn_low.get(be, DType::bf16, {3 * C, C}), params_.value(k->attn_w));
      be.convert(k->proj_low.get(be, DType::bf16, {C, C}), params_.value(k->proj_w));
      be.convert(k->fc_low.get(be, DType::bf16, {4 * C, C}), params_.value(k->fc_w));
      be.convert(k->mproj_low.get(be, DType::bf16, {C, 4 * C}), params_.value(k->mproj_w));
    }
  ids_ = ids.reshape({N});
  Tensor x0 = x0_.get(be, dt, {N, C});  // (N, C) token + position embeddings
  be.embedding_forward(x0, params_.value(wte_), ids_);
  const Tensor positions = params_.value(wpe_).slice(0, T);  // (T, C)
  for (int64_t b = 0; b < B; ++b) be.add(x0.reshape({B, T * C}).slice(b, b + 1), positions);
  if (dropping_) {
    Tensor mask = scratch_->x0_mask.get(be, dt, {N, C});
    be.dropout_mask(mask, opt_.dropout, rng.next());
    be.mul(x0, x0, mask);
  }
  Tensor x = x0;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& k = *blocks_[i];
    if (dropping_) k.seed = rng.next();
    block_forward(be, k, *acts_[opt_.checkpoint_activations ? 0 : i], x);
    x = k.out.tensor();
  }
  z_ = z_buf_.get(be, dt, {N, C});  // (N, C) ln_f's output
  be.layer_norm_forward(z_, lnf_saved_.get(be, dt, {N, 2}), x, params_.value(lnf_w_),
                        params_.value(lnf_b_), kLayerNormEps);
  Tensor logits = logits_.get(be, dt, {N, opt_.vocab_size});  // (N, V) = z wte^T
  const GemmShape s{.trans_b = true,
                    .m = N,
                    .n = opt_.vocab_size,
                    .k = C,
                    .lda = C,
                    .ldb = C,
                    .ldc = opt_.vocab_size};
  be.gemm(s, dt, z_.data(), params_.value(wte_).data(), logits.data());
  return logits;
}

void Transformer::backward_logits(Backend& be, Tensor dlogits) {
  SF_PROFILE_SCOPE("backward");
  const int64_t N = ids_.numel(), C = opt_.n_embd, V = opt_.vocab_size;
  const int64_t B = shape_.batch, T = shape_.seq;
  SF_CHECK(dlogits.shape() == Shape({N, V}), "transformer backward: dlogits ",
           dlogits.shape().str());
  const DType dt = params_.dtype();
  Scratch& sc = *scratch_;
  // The tied head: dwte(V, C) += dlogits^T z, dz(N, C) = dlogits wte.
  const GemmShape dw{
      .trans_a = true, .m = V, .n = C, .k = N, .lda = V, .ldb = C, .ldc = C, .beta = 1.0f};
  be.gemm(dw, dt, dlogits.data(), z_.data(), params_.grad(wte_).data());
  Tensor dz = sc.dz.get(be, dt, {N, C});
  const GemmShape dzs{.m = N, .n = C, .k = V, .lda = V, .ldb = C, .ldc = C};
  be.gemm(dzs, dt, dlogits.data(), params_.value(wte_).data(), dz.data());
  const size_t L = blocks_.size();
  Tensor dx = sc.dx[L % 2].get(be, dt, {N, C});
  be.layer_norm_backward(dx, params_.grad(lnf_w_), params_.grad(lnf_b_), dz,
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
  be.embedding_backward(params_.grad(wte_), dx, ids_);
  // Each position's gradient summed over the batch.
  be.sum_rows_acc(params_.grad(wpe_).slice(0, T).reshape({T * C}), dx.reshape({B, T * C}));
  if (grad_ready_) grad_ready_(0, params_.size());
}

}  // namespace seqforge
