// The Llama-family decoder's forward and backward, layer by layer, llm.c style: every activation
// a buffer with its shape, the backward pass the forward one read in reverse.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include "seqforge/nn/decoder.hpp"

#include <cmath>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

// A layer's parameters and what its backward needs of its forward. N = batch * seq rows;
// C hidden, H query heads and KV key/value heads of D, F the MLP's width, W = (H + 2 KV) D.
struct Decoder::Layer {
  size_t ln1 = 0, ln2 = 0, q = 0, k = 0, v = 0, o = 0, gate = 0, up = 0, down = 0;
  size_t bq = kNone, bk = kNone, bv = kNone, bo = kNone, bgate = kNone, bup = kNone, bdown = kNone;
  Buffer h1, saved1;        // (N, C) input_layernorm's output, (N) its 1 / rms
  Buffer qkv;               // (N, W) q, k (rotated) and v of every head
  Buffer qkv3;              // (N, 3 H D) with each key/value head repeated for its query heads
  Buffer att, lse;          // (N, H D) the heads side by side, (B, H, T)
  Buffer mid;               // (N, C) the stream after the attention branch
  Buffer h2, saved2;        // (N, C), (N) post_attention_layernorm's
  Buffer gate_out, up_out;  // (N, F) before the product
  Buffer act;               // (N, F) act(gate) * up
  Buffer out;               // (N, C) the next layer's input
};

struct Decoder::Scratch {
  Buffer dact, dgate, dup;  // (N, F)
  Buffer dh, dnorm, dmid;   // (N, C)
  Buffer datt;              // (N, H D)
  Buffer dqkv3, dqkv;       // (N, 3 H D), (N, W)
  Buffer kv_sum, kv_part;   // (N, D) a key/value head's gradient summed over its query heads
  Buffer ones;              // (N) for the bias gradients of column slices
  Buffer dx[2];             // (N, C) the gradient flowing down
};

namespace {

// y(N, out), rows ldy apart, (beta y +)= x(N, in) W(out, in)^T (+ b).
void linear(Backend& be, DType dt, void* y, int64_t ldy, const void* x, int64_t ldx, int64_t n,
            Tensor w, Tensor b, double beta = 0.0) {
  const int64_t out = w.shape()[0], in = w.shape()[1];
  const GemmShape s{.trans_b = true,
                    .m = n,
                    .n = out,
                    .k = in,
                    .lda = ldx,
                    .ldb = in,
                    .ldc = ldy,
                    .beta = beta,
                    .bias = !b.empty()};
  be.gemm(s, dt, x, w.data(), y, b.empty() ? nullptr : b.data());
}

// dx(N, in) (beta dx +)= dy(N, out) W; dW(out, in) += dy^T x; db(out) += the column sums of dy.
void linear_backward(Backend& be, DType dt, void* dx, const void* dy, int64_t ldy, const void* x,
                     int64_t ldx, int64_t n, Tensor w, Tensor dw, Tensor db, Tensor ones,
                     double beta) {
  const int64_t out = w.shape()[0], in = w.shape()[1];
  if (dx) {
    const GemmShape s{.m = n, .n = in, .k = out, .lda = ldy, .ldb = in, .ldc = in, .beta = beta};
    be.gemm(s, dt, dy, w.data(), dx);
  }
  if (!dw.empty()) {
    const GemmShape s{
        .trans_a = true, .m = out, .n = in, .k = n, .lda = ldy, .ldb = ldx, .ldc = in, .beta = 1};
    be.gemm(s, dt, dy, x, dw.data());
  }
  if (!db.empty()) {
    const GemmShape s{.m = 1, .n = out, .k = n, .lda = n, .ldb = ldy, .ldc = out, .beta = 1};
    be.gemm(s, dt, ones.data(), dy, db.data());
  }
}

const std::byte* at(const void* p, int64_t elements, DType dt) {
  return static_cast<const std::byte*>(p) + elements * int64_t(dtype_size(dt));
}
std::byte* at(void* p, int64_t elements, DType dt) {
  return static_cast<std::byte*>(p) + elements * int64_t(dtype_size(dt));
}

}  // namespace

std::vector<double> rope_inverse_frequencies(const DecoderOptions& o) {
  const int64_t half = o.head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[size_t(i)] = 1.0 / std::pow(o.rope_theta, double(2 * i) / double(o.head_dim));
  if (!o.rope_scaling.llama3) return inv;
  // Llama 3: long wavelengths stretched by `factor`, short ones kept, a smooth blend between.
  const RopeScaling& s = o.rope_scaling;
  const double old_len = double(s.original_max_position_embeddings);
  const double low_wavelen = old_len / s.low_freq_factor,
               high_wavelen = old_len / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen > low_wavelen) {
      f /= s.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1 - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv;
}

Decoder::Decoder(const DecoderOptions& o, DType dtype) : opt_(o), params_(dtype) {
  SF_CHECK(o.vocab_size > 0 && o.hidden_size > 0 && o.intermediate_size > 0 && o.num_layers > 0 &&
               o.num_heads > 0 && o.num_kv_heads > 0 && o.num_heads % o.num_kv_heads == 0 &&
               o.head_dim > 0 && o.head_dim % 2 == 0,
           "decoder sizes: vocabulary ", o.vocab_size, ", hidden ", o.hidden_size, ", MLP ",
           o.intermediate_size, ", layers ", o.num_layers, ", heads ", o.num_heads, " (",
           o.num_kv_heads, " key/value), head size ", o.head_dim);
  model_opt_.family = ModelFamily::decoder;
  model_opt_.vocab_size = o.vocab_size;
  model_opt_.embedding_dim = o.hidden_size;
  model_opt_.output_size = o.vocab_size;
  model_opt_.per_step = true;
  const int64_t C = o.hidden_size, F = o.intermediate_size, D = o.head_dim;
  const Init w = Init::Normal(0.0, o.initializer_range), zero = Init::Constant(0.0),
             one = Init::Constant(1.0);
  embed_ = params_.declare("model.embed_tokens.weight", {o.vocab_size, C}, w);
  const auto linear_param = [&](const std::string& name, int64_t in, int64_t out, bool bias,
                                size_t* b) {
    const size_t i = params_.declare(name + ".weight", {out, in}, w);
    if (bias) *b = params_.declare(name + ".bias", {out}, zero);
    return i;
  };
  for (int64_t i = 0; i < o.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    auto l = std::make_unique<Layer>();
    l->ln1 = params_.declare(p + ".input_layernorm.weight", {C}, one);
    l->q = linear_param(p + ".self_attn.q_proj", C, o.num_heads * D, o.qkv_bias, &l->bq);
    l->k = linear_param(p + ".self_attn.k_proj", C, o.num_kv_heads * D, o.qkv_bias, &l->bk);
    l->v = linear_param(p + ".self_attn.v_proj", C, o.num_kv_heads * D, o.qkv_bias, &l->bv);
    l->o = linear_param(p + ".self_attn.o_proj", o.num_heads * D, C, o.o_bias, &l->bo);
    l->ln2 = params_.declare(p + ".post_attention_layernorm.weight", {C}, one);
    l->gate = linear_param(p + ".mlp.gate_proj", C, F, o.mlp_bias, &l->bgate);
    l->up = linear_param(p + ".mlp.up_proj", C, F, o.mlp_bias, &l->bup);
    l->down = linear_param(p + ".mlp.down_proj", F, C, o.mlp_bias, &l->bdown);
    layers_.push_back(std::move(l));
  }
  norm_ = params_.declare("model.norm.weight", {C}, one);
  if (o.tie_word_embeddings) {
    head_ = embed_;
    params_.alias("lm_head.weight", embed_);
  } else {
    head_ = params_.declare("lm_head.weight", {o.vocab_size, C}, w);
  }
  scratch_ = std::make_unique<Scratch>();
}

Decoder::~Decoder() = default;

void Decoder::initialize(Backend& be, uint64_t seed) {
  Rng rng(seed);
  params_.allocate(be, rng);
}

void Decoder::set_gemm_dtype(DType dtype) {
  if (dtype != params_.dtype())
    fail("a ", opt_.model_type, " decoder runs its GEMMs in its parameters' dtype (",
         dtype_name(params_.dtype()), ") so far; ", dtype_name(dtype), " GEMMs are not supported");
}

std::vector<std::string> Decoder::unused_base_tensors() const {
  std::vector<std::string> unused;  // rotary tables some checkpoints keep as buffers
  for (int64_t i = 0; i < opt_.num_layers; ++i)
    unused.push_back("model.layers." + std::to_string(i) + ".self_attn.rotary_emb.inv_freq");
  return unused;
}

std::map<std::string, std::string> Decoder::tied_base_tensors() const {
  if (!opt_.tie_word_embeddings) return {};
  return {{"model.embed_tokens.weight", "lm_head.weight"}};
}

void Decoder::prepare_rope(Backend& be, int64_t seq) {
  if (seq <= rope_positions_) return;
  const std::vector<double> inv = rope_inverse_frequencies(opt_);
  const int64_t half = opt_.head_dim / 2;
  std::vector<double> c(size_t(seq * half)), s(size_t(seq * half));
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * inv[size_t(i)];
      c[size_t(p * half + i)] = std::cos(angle);
      s[size_t(p * half + i)] = std::sin(angle);
    }
  const DType dt = params_.dtype();
  const Tensor tc = cos_.get(be, dt, {seq, half}), ts = sin_.get(be, dt, {seq, half});
  std::vector<std::byte> host(size_t(seq * half) * dtype_size(dt));
  convert(c.data(), DType::f64, host.data(), dt, c.size());
  be.upload(tc, host.data());
  convert(s.data(), DType::f64, host.data(), dt, s.size());
  be.upload(ts, host.data());
  rope_positions_ = seq;
}

Rotary Decoder::rotary_of(void* x, int64_t heads) const {
  return Rotary{.x = x,
                .ld = (opt_.num_heads + 2 * opt_.num_kv_heads) * opt_.head_dim,
                .rows = batch_ * seq_,
                .seq = seq_,
                .heads = heads,
                .head_dim = opt_.head_dim,
                .cos = cos_.tensor().data(),
                .sin = sin_.tensor().data()};
}

Tensor Decoder::forward(Backend& be, Tensor ids, Tensor, Tensor, bool training, Rng& rng) {
  return forward(be, ids, training, rng);
}

Tensor Decoder::forward(Backend& be, Tensor ids, bool, Rng&) {
  SF_CHECK(ids.shape().rank() == 2, "decoder input ", ids.shape().str(), ": expected (B, T) ids");
  batch_ = ids.shape()[0];
  seq_ = ids.shape()[1];
  if (seq_ > opt_.max_positions)
    fail("a sequence of ", seq_, " tokens is longer than the model's ", opt_.max_positions,
         " positions (max_position_embeddings)");
  const int64_t N = batch_ * seq_, C = opt_.hidden_size;
  const DType dt = params_.dtype();
  ids_ = ids.reshape({N});
  prepare_rope(be, seq_);
  const Tensor x0 = x0_.get(be, dt, {N, C});
  be.embedding_forward(x0, params_.value(embed_), ids_);
  Tensor x = x0;
  for (auto& l : layers_) {
    layer_forward(be, *l, x);
    x = l->out.tensor();
  }
  const Tensor z = z_.get(be, dt, {N, C});
  be.rms_norm_forward(z, norm_saved_.get(be, dt, {N}), x, params_.value(norm_), 0.0,
                      opt_.rms_norm_eps);
  const Tensor logits = logits_.get(be, dt, {N, opt_.vocab_size});
  linear(be, dt, logits.data(), opt_.vocab_size, z.data(), C, N, params_.value(head_), {});
  return logits;
}

void Decoder::layer_forward(Backend& be, Layer& l, Tensor x) {
  const int64_t N = batch_ * seq_, C = opt_.hidden_size, F = opt_.intermediate_size;
  const int64_t H = opt_.num_heads, KV = opt_.num_kv_heads, D = opt_.head_dim;
  const int64_t W = (H + 2 * KV) * D, HD = H * D;
  const DType dt = params_.dtype();
  const auto p = [&](size_t i) { return i == kNone ? Tensor() : params_.value(i); };

  // Attention branch: q, k, v side by side in one buffer, q and k rotated in place.
  const Tensor h1 = l.h1.get(be, dt, {N, C});
  be.rms_norm_forward(h1, l.saved1.get(be, dt, {N}), x, p(l.ln1), 0.0, opt_.rms_norm_eps);
  const Tensor qkv = l.qkv.get(be, dt, {N, W});
  linear(be, dt, qkv.data(), W, h1.data(), C, N, p(l.q), p(l.bq));
  linear(be, dt, at(qkv.data(), HD, dt), W, h1.data(), C, N, p(l.k), p(l.bk));
  linear(be, dt, at(qkv.data(), HD + KV * D, dt), W, h1.data(), C, N, p(l.v), p(l.bv));
  be.rotary(rotary_of(qkv.data(), H + KV), dt);
  Tensor qkv3 = qkv;
  if (KV < H) {  // each key/value head repeated for the query heads of its group
    qkv3 = l.qkv3.get(be, dt, {N, 3 * HD});
    be.copy_rows(qkv3.data(), 3 * HD, qkv.data(), W, N, HD, dt);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      be.copy_rows(at(qkv3.data(), HD + h * D, dt), 3 * HD, at(qkv.data(), HD + g * D, dt), W, N, D,
                   dt);
      be.copy_rows(at(qkv3.data(), 2 * HD + h * D, dt), 3 * HD,
                   at(qkv.data(), HD + KV * D + g * D, dt), W, N, D, dt);
    }
  }
  AttentionForward a;
  a.shape = {.batch = batch_,
             .seq = seq_,
             .heads = H,
             .head_dim = D,
             .causal = true,
             .scale = 1.0 / std::sqrt(double(D))};
  a.qkv = qkv3.data();
  a.out = l.att.get(be, dt, {N, HD}).data();
  a.lse = l.lse.get(be, dt, {batch_, H, seq_}).data();
  be.attention_forward(a, dt);
  const Tensor mid = l.mid.get(be, dt, {N, C});
  be.copy(mid, x);
  linear(be, dt, mid.data(), C, a.out, HD, N, p(l.o), p(l.bo), 1.0);

  // MLP branch: down(act(gate(h2)) * up(h2)).
  const Tensor h2 = l.h2.get(be, dt, {N, C});
  be.rms_norm_forward(h2, l.saved2.get(be, dt, {N}), mid, p(l.ln2), 0.0, opt_.rms_norm_eps);
  const Tensor g = l.gate_out.get(be, dt, {N, F}), u = l.up_out.get(be, dt, {N, F});
  linear(be, dt, g.data(), F, h2.data(), C, N, p(l.gate), p(l.bgate));
  linear(be, dt, u.data(), F, h2.data(), C, N, p(l.up), p(l.bup));
  const Tensor act = l.act.get(be, dt, {N, F});
  be.glu_forward(act, g, u, opt_.activation);
  const Tensor out = l.out.get(be, dt, {N, C});
  be.copy(out, mid);
  linear(be, dt, out.data(), C, act.data(), F, N, p(l.down), p(l.bdown), 1.0);
}

void Decoder::backward_logits(Backend& be, Tensor dlogits) {
  const int64_t N = batch_ * seq_, C = opt_.hidden_size;
  const DType dt = params_.dtype();
  Scratch& s = *scratch_;
  be.fill(s.ones.get(be, dt, {N}), 1.0);
  // Head: dz = dlogits W_head, dW_head += dlogits^T z; then the final norm.
  const Tensor dz = s.dh.get(be, dt, {N, C});
  linear_backward(be, dt, dz.data(), dlogits.data(), opt_.vocab_size, z_.tensor().data(), C, N,
                  params_.value(head_), params_.grad(head_), {}, {}, 0.0);
  const Tensor x_last = layers_.back()->out.tensor();
  Tensor dx = s.dx[0].get(be, dt, {N, C});
  be.rms_norm_backward(dx, params_.grad(norm_), dz, x_last, params_.value(norm_), 0.0,
                       norm_saved_.tensor());
  for (size_t i = layers_.size(); i-- > 0;) {
    const Tensor x = i == 0 ? x0_.tensor() : layers_[i - 1]->out.tensor();
    const Tensor dnext = s.dx[(layers_.size() - i) % 2].get(be, dt, {N, C});
    layer_backward(be, *layers_[i], x, dx, dnext);
    dx = dnext;
  }
  be.embedding_backward(params_.grad(embed_), dx, ids_);
  if (grad_ready_) grad_ready_(0, params_.size());
}

void Decoder::layer_backward(Backend& be, Layer& l, Tensor x, Tensor dout, Tensor dx) {
  const int64_t N = batch_ * seq_, C = opt_.hidden_size, F = opt_.intermediate_size;
  const int64_t H = opt_.num_heads, KV = opt_.num_kv_heads, D = opt_.head_dim;
  const int64_t W = (H + 2 * KV) * D, HD = H * D;
  const DType dt = params_.dtype();
  Scratch& s = *scratch_;
  const Tensor ones = s.ones.tensor();
  const auto p = [&](size_t i) { return i == kNone ? Tensor() : params_.value(i); };
  const auto g = [&](size_t i) { return i == kNone ? Tensor() : params_.grad(i); };

  // MLP branch: dout reaches down_proj, the gated product, gate_proj and up_proj, the norm.
  const Tensor dact = s.dact.get(be, dt, {N, F});
  linear_backward(be, dt, dact.data(), dout.data(), C, l.act.tensor().data(), F, N, p(l.down),
                  g(l.down), g(l.bdown), ones, 0.0);
  const Tensor dgate = s.dgate.get(be, dt, {N, F}), dup = s.dup.get(be, dt, {N, F});
  be.glu_backward(dgate, dup, dact, l.gate_out.tensor(), l.up_out.tensor(), opt_.activation);
  const Tensor dh = s.dh.get(be, dt, {N, C}), h2 = l.h2.tensor();
  linear_backward(be, dt, dh.data(), dgate.data(), F, h2.data(), C, N, p(l.gate), g(l.gate),
                  g(l.bgate), ones, 0.0);
  linear_backward(be, dt, dh.data(), dup.data(), F, h2.data(), C, N, p(l.up), g(l.up), g(l.bup),
                  ones, 1.0);
  const Tensor dmid = s.dmid.get(be, dt, {N, C});
  be.rms_norm_backward(dmid, g(l.ln2), dh, l.mid.tensor(), p(l.ln2), 0.0, l.saved2.tensor());
  be.add(dmid, dout);

  // Attention branch: o_proj, attention, the repeated heads summed back, the rotation undone.
  const Tensor datt = s.datt.get(be, dt, {N, HD});
  linear_backward(be, dt, datt.data(), dmid.data(), C, l.att.tensor().data(), HD, N, p(l.o), g(l.o),
                  g(l.bo), ones, 0.0);
  const Tensor qkv = l.qkv.tensor();
  const Tensor qkv3 = KV < H ? l.qkv3.tensor() : qkv;
  const Tensor dqkv = s.dqkv.get(be, dt, {N, W});
  const Tensor dqkv3 = KV < H ? s.dqkv3.get(be, dt, {N, 3 * HD}) : dqkv;
  AttentionBackward a;
  a.shape = {.batch = batch_,
             .seq = seq_,
             .heads = H,
             .head_dim = D,
             .causal = true,
             .scale = 1.0 / std::sqrt(double(D))};
  a.qkv = qkv3.data();
  a.out = l.att.tensor().data();
  a.lse = l.lse.tensor().data();
  a.dout = datt.data();
  a.dqkv = dqkv3.data();
  be.attention_backward(a, dt);
  if (KV < H) {
    be.copy_rows(dqkv.data(), W, dqkv3.data(), 3 * HD, N, HD, dt);
    const int64_t group = H / KV;
    const Tensor sum = s.kv_sum.get(be, dt, {N, D}), part = s.kv_part.get(be, dt, {N, D});
    for (int64_t kv = 0; kv < KV; ++kv)
      for (const int64_t base : {int64_t(1), int64_t(2)}) {  // keys, then values
        be.copy_rows(sum.data(), D, at(dqkv3.data(), base * HD + kv * group * D, dt), 3 * HD, N, D,
                     dt);
        for (int64_t h = kv * group + 1; h < (kv + 1) * group; ++h) {
          be.copy_rows(part.data(), D, at(dqkv3.data(), base * HD + h * D, dt), 3 * HD, N, D, dt);
          be.add(sum, part);
        }
        be.copy_rows(at(dqkv.data(), HD + (base - 1) * KV * D + kv * D, dt), W, sum.data(), D, N, D,
                     dt);
      }
  }
  Rotary back = rotary_of(dqkv.data(), H + KV);
  back.inverse = true;
  be.rotary(back, dt);
  const Tensor h1 = l.h1.tensor();
  linear_backward(be, dt, dh.data(), dqkv.data(), W, h1.data(), C, N, p(l.q), g(l.q), g(l.bq), ones,
                  0.0);
  linear_backward(be, dt, dh.data(), at(dqkv.data(), HD, dt), W, h1.data(), C, N, p(l.k), g(l.k),
                  g(l.bk), ones, 1.0);
  linear_backward(be, dt, dh.data(), at(dqkv.data(), HD + KV * D, dt), W, h1.data(), C, N, p(l.v),
                  g(l.v), g(l.bv), ones, 1.0);
  be.rms_norm_backward(dx, g(l.ln1), dh, x, p(l.ln1), 0.0, l.saved1.tensor());
  be.add(dx, dmid);
}

}  // namespace seqforge
