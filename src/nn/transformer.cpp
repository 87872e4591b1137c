#include "seqforge/nn/transformer.hpp"

#include <cmath>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/nn/layers.hpp"

namespace seqforge {

namespace {

Init weight_init(double std) { return Init::Normal(0.0, std); }

}  // namespace

// One pre-LayerNorm block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
struct Transformer::Block {
  Block(Parameters& p, const std::string& prefix, const TransformerOptions& o)
      : ln_1(p, prefix + ".ln_1", o.n_embd),
        c_attn(p, prefix + ".attn.c_attn", o.n_embd, 3 * o.n_embd, true, weight_init(0.02),
               Init::Constant(0.0)),
        attn_proj(p, prefix + ".attn.c_proj", o.n_embd, o.n_embd, true,
                  weight_init(0.02 / std::sqrt(2.0 * double(o.n_layer))), Init::Constant(0.0)),
        attn_drop(o.dropout),
        ln_2(p, prefix + ".ln_2", o.n_embd),
        c_fc(p, prefix + ".mlp.c_fc", o.n_embd, 4 * o.n_embd, true, weight_init(0.02),
             Init::Constant(0.0)),
        mlp_proj(p, prefix + ".mlp.c_proj", 4 * o.n_embd, o.n_embd, true,
                 weight_init(0.02 / std::sqrt(2.0 * double(o.n_layer))), Init::Constant(0.0)),
        mlp_drop(o.dropout) {}

  // x (N, C) -> (N, C), the block's own buffer.
  Tensor forward(Backend& be, Tensor x, const AttentionShape& s, bool training, Rng& rng) {
    const DType dt = x.dtype();
    const int64_t N = x.dim(0), C = x.dim(1);
    {
      SF_PROFILE_SCOPE("attention projections forward");
      qkv = c_attn.forward(be, ln_1.forward(be, x));  // (N, 3C)
    }
    Tensor y = y_.get(be, dt, {N, C});                         // (N, C) heads side by side
    Tensor lse = lse_.get(be, dt, {s.batch, s.heads, s.seq});  // (B, H, T)
    {
      SF_PROFILE_SCOPE("attention forward");
      be.attention_forward({.shape = s, .qkv = qkv.data(), .out = y.data(), .lse = lse.data()}, dt);
    }
    SF_PROFILE_SCOPE("block forward");
    Tensor branch = attn_drop.forward(be, attn_proj.forward(be, y), training, rng);
    Tensor mid = mid_.get(be, dt, {N, C});  // (N, C) x + attention branch
    be.copy(mid, x);
    be.add(mid, branch);
    h = c_fc.forward(be, ln_2.forward(be, mid));  // (N, 4C)
    Tensor g = g_.get(be, dt, h.shape());         // (N, 4C) GELU(h)
    {
      SF_PROFILE_SCOPE("gelu");
      be.gelu_forward(g, h);
    }
    branch = mlp_drop.forward(be, mlp_proj.forward(be, g), training, rng);
    Tensor out = out_.get(be, dt, {N, C});  // (N, C) mid + MLP branch
    be.copy(out, mid);
    be.add(out, branch);
    return out;
  }

  // dout (N, C) -> dx (N, C); parameter gradients accumulate.
  Tensor backward(Backend& be, Tensor dout, const AttentionShape& s) {
    const DType dt = dout.dtype();
    SF_PROFILE_SCOPE("block backward");
    Tensor dg = mlp_proj.backward(be, mlp_drop.backward(be, dout));  // (N, 4C)
    Tensor dh = dh_.get(be, dt, dg.shape());                         // (N, 4C)
    {
      SF_PROFILE_SCOPE("gelu");
      be.gelu_backward(dh, dg, h);
    }
    Tensor dmid = dmid_.get(be, dt, dout.shape());  // (N, C) through the residual and ln_2
    be.copy(dmid, dout);
    be.add(dmid, ln_2.backward(be, c_fc.backward(be, dh)));
    Tensor dy = attn_proj.backward(be, attn_drop.backward(be, dmid));  // (N, C)
    Tensor dqkv = dqkv_.get(be, dt, qkv.shape());                      // (N, 3C)
    {
      SF_PROFILE_SCOPE("attention backward");
      be.attention_backward({.shape = s,
                             .qkv = qkv.data(),
                             .out = y_.tensor().data(),
                             .lse = lse_.tensor().data(),
                             .dout = dy.data(),
                             .dqkv = dqkv.data()},
                            dt);
    }
    Tensor dx = dx_.get(be, dt, dout.shape());  // (N, C) through the residual and ln_1
    be.copy(dx, dmid);
    be.add(dx, ln_1.backward(be, c_attn.backward(be, dqkv)));
    return dx;
  }

  LayerNorm ln_1;
  Linear c_attn, attn_proj;
  Dropout attn_drop;
  LayerNorm ln_2;
  Linear c_fc, mlp_proj;
  Dropout mlp_drop;
  Tensor qkv, h;  // (N, 3C) c_attn's output, (N, 4C) c_fc's, kept for backward
  Buffer y_, lse_, mid_, g_, out_;
  Buffer dh_, dmid_, dqkv_, dx_;
};

struct Transformer::Final {
  Final(Parameters& p, const TransformerOptions& o)
      : embed_drop(o.dropout), ln_f(p, "transformer.ln_f", o.n_embd) {}
  Dropout embed_drop;
  LayerNorm ln_f;
  Tensor z;  // (N, C) ln_f's output
};

Transformer::Transformer(const TransformerOptions& o, DType dtype) : opt_(o), params_(dtype) {
  model_opt_.family = ModelFamily::transformer;
  model_opt_.vocab_size = o.vocab_size;
  model_opt_.embedding_dim = o.n_embd;
  model_opt_.transformer = o;
  model_opt_.output_size = o.vocab_size;
  model_opt_.per_step = true;
  SF_CHECK(o.vocab_size > 0 && o.block_size > 0 && o.n_layer > 0 && o.n_head > 0 && o.n_embd > 0 &&
               o.n_embd % o.n_head == 0,
           "transformer sizes: vocabulary ", o.vocab_size, ", block ", o.block_size, ", layers ",
           o.n_layer, ", heads ", o.n_head, ", width ", o.n_embd);
  wte_ = params_.declare("transformer.wte.weight", {o.vocab_size, o.n_embd}, weight_init(0.02));
  wpe_ = params_.declare("transformer.wpe.weight", {o.block_size, o.n_embd}, weight_init(0.02));
  for (int64_t i = 0; i < o.n_layer; ++i)
    blocks_.push_back(std::make_unique<Block>(params_, "transformer.h." + std::to_string(i), o));
  final_ = std::make_unique<Final>(params_, o);
  params_.alias("lm_head.weight", wte_);  // the tied output head
}

Transformer::~Transformer() = default;

void Transformer::initialize(Backend& be, uint64_t seed) {
  Rng rng(seed);
  params_.allocate(be, rng);
}

Tensor Transformer::forward(Backend& be, Tensor ids, Tensor h0, Tensor c0, bool training,
                            Rng& rng) {
  SF_CHECK(h0.empty() && c0.empty(), "a transformer takes no initial states");
  return forward(be, ids, training, rng);
}

void Transformer::set_gemm_dtype(DType dtype) {
  SF_CHECK(dtype == params_.dtype() || dtype == DType::bf16, "transformer GEMMs in ",
           dtype_name(dtype));
  for (auto& b : blocks_)
    for (Linear* l : {&b->c_attn, &b->attn_proj, &b->c_fc, &b->mlp_proj}) l->set_gemm_dtype(dtype);
}

Tensor Transformer::forward(Backend& be, Tensor ids, bool training, Rng& rng) {
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
  ids_ = ids.reshape({N});
  Tensor x0 = x0_.get(be, dt, {N, C});  // (N, C) token + position embeddings
  be.embedding_forward(x0, params_.value(wte_), ids_);
  const Tensor positions = params_.value(wpe_).slice(0, T);  // (T, C)
  for (int64_t b = 0; b < B; ++b) be.add(x0.reshape({B, T * C}).slice(b, b + 1), positions);
  Tensor x = final_->embed_drop.forward(be, x0, training, rng);
  for (auto& block : blocks_) x = block->forward(be, x, shape_, training, rng);
  final_->z = final_->ln_f.forward(be, x);
  Tensor logits = logits_.get(be, dt, {N, opt_.vocab_size});  // (N, V) = z wte^T
  const GemmShape s{.trans_b = true,
                    .m = N,
                    .n = opt_.vocab_size,
                    .k = C,
                    .lda = C,
                    .ldb = C,
                    .ldc = opt_.vocab_size};
  be.gemm(s, dt, final_->z.data(), params_.value(wte_).data(), logits.data());
  return logits;
}

void Transformer::backward_logits(Backend& be, Tensor dlogits) {
  const int64_t N = ids_.numel(), C = opt_.n_embd, V = opt_.vocab_size;
  const int64_t B = shape_.batch, T = shape_.seq;
  SF_CHECK(dlogits.shape() == Shape({N, V}), "transformer backward: dlogits ",
           dlogits.shape().str());
  const DType dt = params_.dtype();
  // The tied head: dwte(V, C) += dlogits^T z, dz(N, C) = dlogits wte.
  const GemmShape dw{
      .trans_a = true, .m = V, .n = C, .k = N, .lda = V, .ldb = C, .ldc = C, .beta = 1.0f};
  be.gemm(dw, dt, dlogits.data(), final_->z.data(), params_.grad(wte_).data());
  Tensor dz = dz_.get(be, dt, {N, C});
  const GemmShape dzs{.m = N, .n = C, .k = V, .lda = V, .ldb = C, .ldc = C};
  be.gemm(dzs, dt, dlogits.data(), params_.value(wte_).data(), dz.data());
  Tensor dx = final_->ln_f.backward(be, dz);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) dx = (*it)->backward(be, dx, shape_);
  dx = final_->embed_drop.backward(be, dx);
  be.embedding_backward(params_.grad(wte_), dx, ids_);
  // Each position's gradient summed over the batch.
  be.sum_rows_acc(params_.grad(wpe_).slice(0, T).reshape({T * C}), dx.reshape({B, T * C}));
  if (grad_ready_) grad_ready_(0, params_.size());
}

}  // namespace seqforge
