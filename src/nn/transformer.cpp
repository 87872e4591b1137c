// The transformer's forward and backward, block by block, llm.c style: every activation a buffer
// with its shape, the backward pass the forward one read in reverse.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include "seqforge/nn/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "nn/dense.hpp"
#include "nn/transformer_parts.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

using nn::gemm;
using nn::linear_forward;

namespace {

constexpr double kLayerNormEps = 1e-5;

}  // namespace

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
    if (o.bias) p.b = params_.declare(name + ".bias", {out}, zero);
  };
  for (int64_t i = 0; i < o.n_layer; ++i) {
    const std::string h = "transformer.h." + std::to_string(i);
    auto k = std::make_unique<Block>();
    k->ln1_w = params_.declare(h + ".ln_1.weight", {C}, one);
    if (o.bias) k->ln1_b = params_.declare(h + ".ln_1.bias", {C}, zero);
    linear(k->p[0], h + ".attn.c_attn", C, 3 * C, w);
    linear(k->p[1], h + ".attn.c_proj", C, C, w_proj);
    k->ln2_w = params_.declare(h + ".ln_2.weight", {C}, one);
    if (o.bias) k->ln2_b = params_.declare(h + ".ln_2.bias", {C}, zero);
    linear(k->p[2], h + ".mlp.c_fc", C, 4 * C, w);
    linear(k->p[3], h + ".mlp.c_proj", 4 * C, C, w_proj);
    blocks_.push_back(std::move(k));
  }
  lnf_w_ = params_.declare("transformer.ln_f.weight", {C}, one);
  if (o.bias) lnf_b_ = params_.declare("transformer.ln_f.bias", {C}, zero);
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

std::vector<std::string> Transformer::fresh_parameters() const {
  std::vector<std::string> out;
  const auto& entries = params_.values().entries();
  for (size_t i : {wse_, cls_w_, cls_b_})
    if (i != kNone) out.push_back(entries[i].name);
  for (size_t i = base_params_; i < params_.size(); ++i) out.push_back(entries[i].name);
  return out;
}

// nanoGPT's checkpoints from PyTorch without fused attention also hold each block's causal mask
// as a buffer (attn.bias; attn.masked_bias in older GPT-2 ports): not parameters.
std::vector<std::string> Transformer::unused_base_tensors() const {
  std::vector<std::string> out;
  if (opt_.num_classes > 0) out.push_back("lm_head.weight");
  for (int64_t i = 0; i < opt_.n_layer; ++i)
    for (const char* buffer : {"attn.bias", "attn.masked_bias"})
      out.push_back("transformer.h." + std::to_string(i) + "." + buffer);
  return out;
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

void Transformer::initialize(Backend& be, uint64_t seed) {
  Rng rng(seed);
  params_.allocate(be, rng);
  init_adapters(be, {});
}

void Transformer::set_gemm_dtype(DType dtype) {
  SF_CHECK(dtype == params_.dtype() || dtype == DType::bf16 || dtype == DType::f16,
           "transformer GEMMs in ", dtype_name(dtype));
  low_ = dtype == DType::bf16 || dtype == DType::f16;
  if (low_) low_type_ = dtype;
}

Tensor Transformer::forward(Backend& be, Tensor ids, Tensor h0, Tensor c0, bool training,
                            Rng& rng) {
  SF_CHECK(h0.empty() && c0.empty(), "a transformer takes no initial states");
  return forward(be, ids, training, rng);
}

// x *= a dropout mask drawn from `seed` into `mask` (kept for backward), when dropping.
void Transformer::drop(Backend& be, Tensor x, Buffer& mask, uint64_t seed) {
  if (!dropping_) return;
  Tensor m = mask.get(be, x.dtype(), x.shape());
  be.dropout_mask(m, opt_.dropout, seed);
  be.mul(x, x, m);
}

// stream (N, C) += drop(the Linear j of block k on x), the dropout mask drawn from mask_seed: by
// the Linear itself, adding into the stream, when no dropout comes between them.
void Transformer::join_branch(Backend& be, Block& k, Acts& a, int j, Tensor stream, Tensor x,
                              Buffer& x_low, Buffer& mask, uint64_t mask_seed) {
  Proj& p = k.p[j];
  if (!dropping_) return proj_forward(be, p, a, j, stream, x, x_low, k.seed, true);
  Tensor branch = scratch_->branch.get(be, params_.dtype(), stream.shape());
  proj_forward(be, p, a, j, branch, x, x_low, k.seed);
  drop(be, branch, mask, mask_seed);
  be.add(stream, branch);
}

// The attention of block k: with bf16 or fp16 products when the GEMMs are; with dropout in
// training, on the probabilities too (nanoGPT's attn_dropout), its mask drawn from the block's
// seed.
AttentionShape Transformer::block_attention(const Block& k) const {
  AttentionShape s = shape_;
  s.bf16_products = low_ && low_type_ == DType::bf16;
  s.fp16_products = low_ && low_type_ == DType::f16;
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
  // With half GEMMs the LayerNorm and GELU outputs are read only as GEMM operands: written
  // directly in the half type into their copies, or, where adapter dropout reads them in f32, into
  // scratch (their copies made by the GEMMs' caller).
  auto norm_or_gelu_out = [&](Buffer& kept, Buffer& scratch, Buffer& low, int64_t width) {
    if (!low_) return kept.get(be, dt, {N, width});
    if (!adapter_dropping_) return low.get(be, low_type_, {N, width});
    return scratch.get(be, dt, {N, width});
  };
  {
    SF_PROFILE_SCOPE("attention projections forward");
    Tensor ln1 = norm_or_gelu_out(a.ln1, sc.ln, a.ln1_low, C);
    be.layer_norm_forward(ln1, a.ln1_saved.get(be, dt, {N, 2}), x, W(k.ln1_w),
                          norm_bias(be, k.ln1_b), kLayerNormEps);
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
  Tensor mid = a.mid.get(be, dt, {N, C});
  be.copy(mid, x);
  join_branch(be, k, a, 1, mid, att, a.att_low, a.mask1, mix_seed(k.seed, 1));
  Tensor ln2 = norm_or_gelu_out(a.ln2, sc.ln, a.ln2_low, C);
  be.layer_norm_forward(ln2, a.ln2_saved.get(be, dt, {N, 2}), mid, W(k.ln2_w),
                        norm_bias(be, k.ln2_b), kLayerNormEps);
  // With DoRA, GELU applies the first Linear's column scaling to the product before it.
  const ColumnMap map = fc_map(k.p[2]);
  Tensor fc = map.empty() ? a.fc.get(be, dt, {N, 4 * C}) : Tensor();
  proj_forward(be, k.p[2], a, 2, fc, ln2, a.ln2_low, k.seed, false, !map.empty());
  Tensor gelu = norm_or_gelu_out(a.gelu, sc.gelu, a.gelu_low, 4 * C);
  {
    SF_PROFILE_SCOPE("gelu");
    be.gelu_forward(gelu, map.empty() ? fc : a.pre[2].tensor(), map);
  }
  Tensor out = k.out.get(be, dt, {N, C});
  be.copy(out, mid);
  join_branch(be, k, a, 3, out, gelu, a.gelu_low, a.mask2, mix_seed(k.seed, 2));
}

// dout (N, C) at the block's output -> dx (N, C) at its input x, into `dx`.
void Transformer::block_backward(Backend& be, Block& k, Acts& a, Tensor x, Tensor dout, Tensor dx) {
  SF_PROFILE_SCOPE("block backward");
  const AttentionShape s = block_attention(k);
  const DType dt = params_.dtype();
  const int64_t N = x.dim(0), C = x.dim(1);
  auto W = [&](size_t i) { return params_.value(i); };
  // LayerNorm weight gradients, or scratch to discard them in when the base is frozen.
  auto G = [&](size_t i) {
    return train_base_ ? params_.grad(i) : scratch_->dnorm_w.get(be, dt, {C});
  };
  // A GEMM's x operand as forward used it: the half copy, or the f32 tensor.
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
  ColumnMap map = fc_map(k.p[2]);  // d4 then holds d(pre) and m's gradient is added here
  {
    SF_PROFILE_SCOPE("gelu");
    if (!map.empty()) map.dscale = sc.dscale.get(be, dt, {4 * C});
    be.gelu_backward(d4, d4, map.empty() ? a.fc.tensor() : a.pre[2].tensor(), map);
    if (!map.empty()) {
      be.mul(map.dscale, map.dscale, k.p[2].inv_norm.tensor());
      be.add(params_.grad(k.p[2].m), map.dscale);
    }
  }
  Tensor dln2 = sc.dc2.get(be, dt, {N, C});
  proj_backward(be, k.p[2], a, 2, dln2, d4, a.ln2.tensor(), op(a.ln2_low, a.ln2), !map.empty());
  Tensor dmid = sc.dmid.get(be, dt, {N, C});
  be.layer_norm_backward(dmid, G(k.ln2_w), norm_bias_grad(be, k.ln2_b), dln2, a.mid.tensor(),
                         W(k.ln2_w), a.ln2_saved.tensor(), dout);
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
  be.layer_norm_backward(dx, G(k.ln1_w), norm_bias_grad(be, k.ln1_b), dln1, x, W(k.ln1_w),
                         a.ln1_saved.tensor(), dmid);
}

Tensor Transformer::bias(size_t i) const { return i == kNone ? Tensor() : params_.value(i); }

Tensor Transformer::norm_bias(Backend& be, size_t i) {
  if (i != kNone) return params_.value(i);
  Buffer& zeros = scratch_->zero_bias;
  if (!zeros.tensor().empty()) return zeros.tensor();  // filled on first use
  be.fill(zeros.get(be, params_.dtype(), {opt_.n_embd}), 0.0);
  return zeros.tensor();
}

Tensor Transformer::norm_bias_grad(Backend& be, size_t i) {
  if (train_base_ && i != kNone) return params_.grad(i);
  return scratch_->dnorm_b.get(be, params_.dtype(), {opt_.n_embd});
}

Tensor Transformer::forward(Backend& be, Tensor ids, bool training, Rng& rng) {
  SF_PROFILE_SCOPE("forward");
  SF_CHECK(ids.shape().rank() == 2, "transformer input: ids (B, T), got ", ids.shape().str());
  const int64_t B = ids.dim(0), T = ids.dim(1), N = B * T, C = opt_.n_embd;
  if (N == 0) fail("transformer input ", ids.shape().str(), ": no tokens to predict from");
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
                        norm_bias(be, lnf_b_), kLayerNormEps);
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
    be.layer_norm_forward(ln1, a.ln1_saved.get(be, dt, {n, 2}), x, W(k.ln1_w),
                          norm_bias(be, k.ln1_b), kLayerNormEps);
    proj_forward(be, k.p[0], a, 0, cache.slice(decode_pos_, T), ln1, a.ln1_low, 0);
    Tensor att = a.att.get(be, dt, {T, C});  // (T, C): the new rows, the last n, computed
    be.attention_forward({.shape = s,
                          .qkv = cache.data(),
                          .out = att.data(),
                          .lse = a.lse.get(be, dt, {1, s.heads, T}).data(),
                          .first_row = decode_pos_},
                         dt);
    Tensor mid = a.mid.get(be, dt, {n, C});
    be.copy(mid, x);
    join_branch(be, k, a, 1, mid, att.slice(decode_pos_, T), a.att_low, a.mask1, 0);
    Tensor ln2 = a.ln2.get(be, dt, {n, C});
    be.layer_norm_forward(ln2, a.ln2_saved.get(be, dt, {n, 2}), mid, W(k.ln2_w),
                          norm_bias(be, k.ln2_b), kLayerNormEps);
    Tensor fc = a.fc.get(be, dt, {n, 4 * C});
    proj_forward(be, k.p[2], a, 2, fc, ln2, a.ln2_low, 0);
    Tensor gelu = a.gelu.get(be, dt, {n, 4 * C});
    be.gelu_forward(gelu, fc);
    x = k.out.get(be, dt, {n, C});
    be.copy(x, mid);
    join_branch(be, k, a, 3, x, gelu, a.gelu_low, a.mask2, 0);
  }
  decode_pos_ = T;
  Tensor z = z_buf_.get(be, dt, {n, C});
  be.layer_norm_forward(z, lnf_saved_.get(be, dt, {n, 2}), x, W(lnf_w_), norm_bias(be, lnf_b_),
                        kLayerNormEps);
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
                         norm_bias_grad(be, lnf_b_), dz, blocks_[L - 1]->out.tensor(),
                         params_.value(lnf_w_), lnf_saved_.tensor());
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
