// The Llama-family decoder's forward and backward, layer by layer, llm.c style: every activation
// a buffer with its shape, the backward pass the forward one read in reverse.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include "seqforge/nn/decoder.hpp"

#include <cmath>

#include "nn/decoder_parts.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/core/profiler.hpp"

namespace seqforge {

namespace {

// y (rows, out) = x (rows, in) W (out, in)^T, all packed.
void times_transposed(Backend& be, Tensor y, Tensor x, Tensor w) {
  const int64_t out = w.dim(0), in = w.dim(1);
  const GemmShape s{
      .trans_b = true, .m = x.dim(0), .n = out, .k = in, .lda = in, .ldb = in, .ldc = out};
  be.gemm(s, w.dtype(), x.data(), w.data(), y.data());
}

std::byte* at(void* p, int64_t elements, DType dt) {
  return static_cast<std::byte*>(p) + elements * int64_t(dtype_size(dt));
}

}  // namespace

std::vector<double> rope_inverse_frequencies(const DecoderOptions& o, bool local) {
  const int64_t half = o.head_dim / 2;
  const double theta = local ? o.rope_local_theta : o.rope_theta;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[size_t(i)] = 1.0 / std::pow(theta, double(2 * i) / double(o.head_dim));
  if (local) return inv;
  if (o.rope_scaling.linear)
    for (double& f : inv) f /= o.rope_scaling.factor;
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

Decoder::Decoder(const DecoderOptions& o, DType dtype) : opt_(o), params_(dtype), gemm_dt_(dtype) {
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
             one = Init::Constant(1.0), norm = o.gemma ? zero : one;  // Gemma scales by 1 + w
  embed_ = params_.declare("model.embed_tokens.weight", {o.vocab_size, C}, w);
  const auto linear_param = [&](Proj& p, const std::string& name, int64_t in, int64_t out,
                                bool bias) {
    p.name = name;
    p.in = in;
    p.out = out;
    p.w = params_.declare(name + ".weight", {out, in}, w);
    if (bias) p.b = params_.declare(name + ".bias", {out}, zero);
  };
  for (int64_t i = 0; i < o.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    auto l = std::make_unique<Layer>();
    l->ln1 = params_.declare(p + ".input_layernorm.weight", {C}, norm);
    l->local = !o.sliding.empty() && o.sliding[size_t(i)];
    linear_param(l->q, p + ".self_attn.q_proj", C, o.num_heads * D, o.qkv_bias);
    linear_param(l->k, p + ".self_attn.k_proj", C, o.num_kv_heads * D, o.qkv_bias);
    linear_param(l->v, p + ".self_attn.v_proj", C, o.num_kv_heads * D, o.qkv_bias);
    linear_param(l->o, p + ".self_attn.o_proj", o.num_heads * D, C, o.o_bias);
    if (o.gemma) {
      l->q_norm = params_.declare(p + ".self_attn.q_norm.weight", {D}, norm);
      l->k_norm = params_.declare(p + ".self_attn.k_norm.weight", {D}, norm);
      l->post_attn = params_.declare(p + ".post_attention_layernorm.weight", {C}, norm);
      l->ln2 = params_.declare(p + ".pre_feedforward_layernorm.weight", {C}, norm);
      l->post_mlp = params_.declare(p + ".post_feedforward_layernorm.weight", {C}, norm);
    } else {
      l->ln2 = params_.declare(p + ".post_attention_layernorm.weight", {C}, one);
    }
    linear_param(l->gate, p + ".mlp.gate_proj", C, F, o.mlp_bias);
    linear_param(l->up, p + ".mlp.up_proj", C, F, o.mlp_bias);
    linear_param(l->down, p + ".mlp.down_proj", F, C, o.mlp_bias);
    layers_.push_back(std::move(l));
  }
  norm_ = params_.declare("model.norm.weight", {C}, norm);
  if (o.num_labels > 0) {
    score_ = params_.declare("score.weight", {o.num_labels, C}, w);
    model_opt_.output_size = o.num_labels;
    model_opt_.per_step = false;
  } else if (o.tie_word_embeddings) {
    head_ = embed_;
    params_.alias("lm_head.weight", embed_);
  } else {
    head_ = params_.declare("lm_head.weight", {o.vocab_size, C}, w);
  }
  base_params_ = params_.size();
  declare_adapters();
  scratch_ = std::make_unique<Scratch>();
}

Decoder::~Decoder() = default;

void Decoder::bind_activations(size_t i) {
  acts_.resize(opt_.checkpoint_activations ? 1 : layers_.size());
  std::unique_ptr<Acts>& set = acts_[opt_.checkpoint_activations ? 0 : i];
  if (!set) set = std::make_unique<Acts>();
  layers_[i]->bind(*set);
}

void Decoder::initialize(Backend& be, uint64_t seed) {
  Rng rng(seed);
  params_.allocate(be, rng);
  init_adapters(be, {});
}

void Decoder::set_gemm_dtype(DType dtype) {
  if (dtype != params_.dtype() && !(dtype == DType::bf16 && params_.dtype() == DType::f32))
    fail("a ", opt_.model_type, " decoder runs its GEMMs in its parameters' dtype (",
         dtype_name(params_.dtype()), ") or, with f32 parameters, in bf16; ", dtype_name(dtype),
         " GEMMs are not supported");
  gemm_dt_ = dtype;
  frozen_low_ready_ = false;
}

// logits (N, V) = z (N, C) W_head^T: in bf16 from the head's bf16 copy, or in f32; soft-capped
// where the model caps its logits.
void Decoder::head_forward(Backend& be, Tensor logits, Tensor z) {
  head_product(be, logits, z);
  if (opt_.final_logit_softcapping > 0)
    be.soft_cap_forward(logits, logits, opt_.final_logit_softcapping);
}

void Decoder::head_product(Backend& be, Tensor logits, Tensor z) {
  if (!low()) return times_transposed(be, logits, z, params_.value(head_));
  const int64_t N = z.dim(0), C = z.dim(1);
  const void* z_low = low_operand(be, z_low_, z.data(), N, C, C);
  be.gemm({.trans_b = true,
           .m = N,
           .n = opt_.vocab_size,
           .k = C,
           .lda = C,
           .ldb = C,
           .ldc = opt_.vocab_size},
          gemm_dt_, z_low, head_low_.tensor().data(), logits.data());
}

std::vector<std::string> Decoder::unused_base_tensors() const {
  std::vector<std::string> unused;  // rotary tables some checkpoints keep as buffers
  for (int64_t i = 0; i < opt_.num_layers; ++i)
    unused.push_back("model.layers." + std::to_string(i) + ".self_attn.rotary_emb.inv_freq");
  if (score_ != kNone) unused.push_back("lm_head.weight");  // a classifier has its own head
  return unused;
}

std::map<std::string, std::string> Decoder::tied_base_tensors() const {
  if (!opt_.tie_word_embeddings || score_ != kNone) return {};
  return {{"model.embed_tokens.weight", "lm_head.weight"}};
}

// Segments are not the decoder's: a pair reaches it through its tokenizer's template.
void Decoder::set_token_layout(Tensor lengths, Tensor) { lengths_ = lengths; }

void Decoder::prepare_rope(Backend& be, int64_t seq) {
  if (seq <= rope_positions_) return;
  const int64_t half = opt_.head_dim / 2;
  // cos and sin (seq, half) of each position's angles, from the given frequencies.
  const auto tables = [&](bool local, Buffer& cos, Buffer& sin) {
    const std::vector<double> inv = rope_inverse_frequencies(opt_, local);
    std::vector<double> c(size_t(seq * half)), s(size_t(seq * half));
    for (int64_t p = 0; p < seq; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(p) * inv[size_t(i)];
        c[size_t(p * half + i)] = std::cos(angle);
        s[size_t(p * half + i)] = std::sin(angle);
      }
    upload_doubles(be, cos.get(be, params_.dtype(), {seq, half}), c);
    upload_doubles(be, sin.get(be, params_.dtype(), {seq, half}), s);
  };
  tables(false, cos_, sin_);
  if (opt_.gemma) tables(true, local_cos_, local_sin_);  // the local layers' own base
  rope_positions_ = seq;
}

Rotary Decoder::rotary_of(void* x, int64_t rows, int64_t seq, int64_t first_pos, bool local) const {
  const bool own_base = local && opt_.gemma;  // Gemma 3's local layers rotate by their own base
  const Buffer& cos = own_base ? local_cos_ : cos_;
  const Buffer& sin = own_base ? local_sin_ : sin_;
  return Rotary{.x = x,
                .ld = (opt_.num_heads + 2 * opt_.num_kv_heads) * opt_.head_dim,
                .rows = rows,
                .seq = seq,
                .first_pos = first_pos,
                .heads = opt_.num_heads + opt_.num_kv_heads,
                .head_dim = opt_.head_dim,
                .cos = cos.tensor().data(),
                .sin = sin.tensor().data()};
}

// A frozen norm's weight gradient goes to scratch.
Tensor Decoder::norm_grad(Backend& be, size_t i) {
  if (train_base_) return params_.grad(i);
  return scratch_->dnorm_w.get(be, params_.dtype(), {opt_.hidden_size});
}

Tensor Decoder::forward(Backend& be, Tensor ids, Tensor h0, Tensor c0, bool training, Rng& rng) {
  SF_CHECK(h0.empty() && c0.empty(), "a decoder takes no initial states");
  return forward(be, ids, training, rng);
}

Tensor Decoder::forward(Backend& be, Tensor ids, bool training, Rng& rng) {
  SF_CHECK(ids.shape().rank() == 2, "decoder input ", ids.shape().str(), ": expected (B, T) ids");
  if (ids.numel() == 0) fail("decoder input ", ids.shape().str(), ": no tokens to predict from");
  batch_ = ids.shape()[0];
  seq_ = ids.shape()[1];
  if (seq_ > opt_.max_positions)
    fail("a sequence of ", seq_, " tokens is longer than the model's ", opt_.max_positions,
         " positions (max_position_embeddings)");
  const int64_t N = batch_ * seq_, C = opt_.hidden_size;
  const DType dt = params_.dtype();
  ids_ = ids.reshape({N});
  prepare_rope(be, seq_);
  prepare_weights(be);
  be.fill(scratch_->ones.get(be, dt, {N}), 1.0);
  const Tensor x0 = x0_.get(be, dt, {N, C});
  be.embedding_forward(x0, params_.value(embed_), ids_);
  if (opt_.gemma) be.scale(x0, embed_scale());
  Tensor x = x0;
  // Adapter dropout: a seed per layer from rng, its Linear j's mask hashed from (seed, 16 + j).
  adapter_dropping_ =
      training && opt_.adapter.kind != AdapterKind::none && opt_.adapter.dropout > 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (adapter_dropping_) {
      const uint64_t seed = rng.next();
      for (int j = 0; j < 7; ++j) layers_[i]->projs()[j].seed = mix_seed(seed, 16 + uint64_t(j));
    }
    bind_activations(i);
    layer_forward(be, *layers_[i], x);
    x = layers_[i]->out.tensor();
  }
  const Tensor z = z_.get(be, dt, {N, C});
  be.rms_norm_forward(z, norm_saved_.get(be, dt, {N}), x, params_.value(norm_), norm_offset(),
                      opt_.rms_norm_eps);
  if (score_ == kNone) {
    const Tensor logits = logits_.get(be, dt, {N, opt_.vocab_size});
    head_forward(be, logits, z);
    return logits;
  }
  // A classifier scores each row's last token that is not pad_token_id, as transformers' does
  // (a template that ends in the end-of-text token, when it is also the pad, is scored on the
  // token before it); the row's first token where every one is.
  std::vector<int64_t> last(static_cast<size_t>(batch_), seq_ - 1);
  if (!lengths_.empty()) {
    const std::vector<int64_t> lengths = download_vector<int64_t>(be, lengths_);
    SF_CHECK(int64_t(lengths.size()) == batch_, "token lengths for ", lengths.size(), " rows, ",
             batch_, " in the batch");
    for (int64_t b = 0; b < batch_; ++b) {
      SF_CHECK(lengths[size_t(b)] >= 1 && lengths[size_t(b)] <= seq_, "row ", b, " length ",
               lengths[size_t(b)]);
      last[size_t(b)] = lengths[size_t(b)] - 1;
    }
  }
  if (opt_.pad_token_id >= 0) {
    const std::vector<int64_t> ids = download_vector<int64_t>(be, ids_);
    for (int64_t b = 0; b < batch_; ++b) {
      int64_t& at = last[size_t(b)];
      while (at > 0 && ids[size_t(b * seq_ + at)] == opt_.pad_token_id) --at;
    }
  }
  for (int64_t b = 0; b < batch_; ++b) last[size_t(b)] += b * seq_;
  const Tensor rows = last_rows_.get(be, DType::i64, {batch_});
  be.upload(rows, last.data());
  const Tensor pooled = pooled_.get(be, dt, {batch_, C});
  be.embedding_forward(pooled, z, rows);  // a gather of the rows
  const Tensor logits = logits_.get(be, dt, {batch_, opt_.num_labels});
  times_transposed(be, logits, pooled, params_.value(score_));
  return logits;
}

// q, k and v of the N rows of h1 (N, C) (h1_low: its bf16 operand, or null) side by side in qkv
// (N, W), q and k normed (Gemma 3) and rotated for positions first_pos + row % seq.
void Decoder::project_qkv(Backend& be, Layer& l, Tensor h1, const void* h1_low, Tensor qkv,
                          int64_t seq, int64_t first_pos) {
  const int64_t N = h1.shape()[0], C = opt_.hidden_size;
  const int64_t H = opt_.num_heads, KV = opt_.num_kv_heads, D = opt_.head_dim;
  const int64_t W = (H + 2 * KV) * D, HD = H * D;
  const DType dt = params_.dtype();
  const double offset = norm_offset(), eps = opt_.rms_norm_eps;
  if (opt_.gemma) {  // q and k projected apart, normed per head, then placed in qkv
    const Tensor q = l.a->q_raw.get(be, dt, {N * H, D}), k = l.a->k_raw.get(be, dt, {N * KV, D});
    proj_forward(be, l.q, q.data(), HD, h1.data(), C, h1_low, nullptr);
    proj_forward(be, l.k, k.data(), KV * D, h1.data(), C, h1_low, nullptr);
    const Tensor qn = scratch_->dq_normed.get(be, dt, {N * H, D});
    be.rms_norm_forward(qn, l.a->q_saved.get(be, dt, {N * H}), q, params_.value(l.q_norm), offset,
                        eps);
    be.copy_rows(qkv.data(), W, qn.data(), HD, N, HD, dt);
    const Tensor kn = scratch_->dq_normed.get(be, dt, {N * KV, D});
    be.rms_norm_forward(kn, l.a->k_saved.get(be, dt, {N * KV}), k, params_.value(l.k_norm), offset,
                        eps);
    be.copy_rows(at(qkv.data(), HD, dt), W, kn.data(), KV * D, N, KV * D, dt);
  } else {
    proj_forward(be, l.q, qkv.data(), W, h1.data(), C, h1_low, nullptr);
    proj_forward(be, l.k, at(qkv.data(), HD, dt), W, h1.data(), C, h1_low, nullptr);
  }
  proj_forward(be, l.v, at(qkv.data(), HD + KV * D, dt), W, h1.data(), C, h1_low, nullptr);
  be.rotary(rotary_of(qkv.data(), N, seq, first_pos, l.local), dt);
}

AttentionShape Decoder::attention_shape(const Layer& l, int64_t batch, int64_t seq) const {
  return {.batch = batch,
          .seq = seq,
          .heads = opt_.num_heads,
          .head_dim = opt_.head_dim,
          .causal = true,
          .kv_heads = opt_.num_kv_heads,
          .window = l.local ? opt_.sliding_window : 0,
          .scale = attention_scale(),
          .softcap = opt_.attn_logit_softcapping};
}

// The layer after its attention: o_proj of att (N, H D) joins x (N, C) into l.a->mid, then the MLP
// branch, down(act(gate(h2)) * up(h2)), into l.out.
void Decoder::layer_tail(Backend& be, Layer& l, Tensor x, const void* att) {
  const int64_t N = x.shape()[0], C = opt_.hidden_size, F = opt_.intermediate_size;
  const int64_t HD = opt_.num_heads * opt_.head_dim;
  const DType dt = params_.dtype();
  const double offset = norm_offset(), eps = opt_.rms_norm_eps;
  const auto value = [&](size_t i) { return params_.value(i); };
  const void* att_low = low_operand(be, l.a->att_low, att, N, HD, HD);
  const Tensor mid = l.a->mid.get(be, dt, {N, C});
  if (opt_.gemma) {  // o_proj's output normed, then added
    const Tensor o = l.a->o_out.get(be, dt, {N, C}),
                 normed = scratch_->dbranch_out.get(be, dt, {N, C});
    proj_forward(be, l.o, o.data(), C, att, HD, att_low, nullptr);
    be.rms_norm_forward(normed, l.a->o_saved.get(be, dt, {N}), o, value(l.post_attn), offset, eps);
    be.copy(mid, x);
    be.add(mid, normed);
  } else {
    proj_forward(be, l.o, mid.data(), C, att, HD, att_low, x.data());
  }

  const Tensor h2 = l.a->h2.get(be, dt, {N, C});
  be.rms_norm_forward(h2, l.a->saved2.get(be, dt, {N}), mid, value(l.ln2), offset, eps);
  const void* h2_low = low_operand(be, l.a->h2_low, h2.data(), N, C, C);
  for (Proj* p : {&l.gate, &l.up}) {
    const bool unscaled = scaled_in_glu(*p);
    const Tensor y =
        unscaled ? Tensor() : (p == &l.gate ? l.a->gate_out : l.a->up_out).get(be, dt, {N, F});
    proj_forward(be, *p, y.data(), F, h2.data(), C, h2_low, nullptr, unscaled);
  }
  const GluInputs in = glu_inputs(l);
  const Tensor act = l.a->act.get(be, dt, {N, F});
  be.glu_forward(act, in.gate, in.up, opt_.activation, in.affine);
  const void* act_low = low_operand(be, l.a->act_low, act.data(), N, F, F);
  const Tensor out = l.out.get(be, dt, {N, C});
  if (opt_.gemma) {
    const Tensor m = l.a->mlp_out.get(be, dt, {N, C}),
                 normed = scratch_->dbranch_out.get(be, dt, {N, C});
    proj_forward(be, l.down, m.data(), C, act.data(), F, act_low, nullptr);
    be.rms_norm_forward(normed, l.a->mlp_saved.get(be, dt, {N}), m, value(l.post_mlp), offset, eps);
    be.copy(out, mid);
    be.add(out, normed);
  } else {
    proj_forward(be, l.down, out.data(), C, act.data(), F, act_low, mid.data());
  }
}

void Decoder::layer_forward(Backend& be, Layer& l, Tensor x) {
  const int64_t N = batch_ * seq_, C = opt_.hidden_size;
  const int64_t H = opt_.num_heads, KV = opt_.num_kv_heads, D = opt_.head_dim;
  const int64_t W = (H + 2 * KV) * D, HD = H * D;
  const DType dt = params_.dtype();
  const Tensor h1 = l.a->h1.get(be, dt, {N, C});
  be.rms_norm_forward(h1, l.a->saved1.get(be, dt, {N}), x, params_.value(l.ln1), norm_offset(),
                      opt_.rms_norm_eps);
  const Tensor qkv = l.a->qkv.get(be, dt, {N, W});
  project_qkv(be, l, h1, low_operand(be, l.a->h1_low, h1.data(), N, C, C), qkv, seq_, 0);
  AttentionForward a;
  a.shape = attention_shape(l, batch_, seq_);
  a.qkv = qkv.data();
  a.out = l.a->att.get(be, dt, {N, HD}).data();
  a.lse = l.a->lse.get(be, dt, {batch_, H, seq_}).data();
  be.attention_forward(a, dt);
  layer_tail(be, l, x, a.out);
}

void Decoder::decode_start(Backend& be, int64_t capacity) {
  SF_CHECK(score_ == kNone, "decoding needs a language model, not a classifier");
  if (capacity > opt_.max_positions)
    fail("generating ", capacity, " tokens in all needs more than the model's ", opt_.max_positions,
         " positions (max_position_embeddings)");
  // Each position keeps its q, k and v rows in every layer, its attention output and its rotary
  // angles (as doubles on the host while they are made): refused by name before any is allocated.
  const double unit = double(dtype_size(params_.dtype()));
  const double qkv = double(opt_.num_heads + 2 * opt_.num_kv_heads) * double(opt_.head_dim);
  const double per_position = double(layers_.size()) * qkv * unit +
                              double(opt_.num_heads * opt_.head_dim) * unit +
                              double(opt_.head_dim) * (8 + unit) * (opt_.gemma ? 2 : 1);
  size_t free = 0, total = 0;
  std::string device;
  const double room =
      be.device_memory(&free, &total, &device) ? double(free) : double(available_memory_bytes());
  if (double(capacity) * per_position > room)
    fail("generating ", capacity, " tokens in all keeps ",
         int64_t(double(capacity) * per_position / (1 << 20)),
         " MB of keys, values and rotary angles, more than the ", int64_t(room / (1 << 20)),
         " MB available: generate at most ", int64_t(room / per_position),
         " tokens in all (the prompt's and --length)");
  decode_pos_ = 0;
  decode_capacity_ = capacity;
  adapter_dropping_ = false;
  prepare_rope(be, capacity);
  prepare_weights(be);  // the weights hold still while generating
  kv_.resize(layers_.size());
}

Tensor Decoder::decode(Backend& be, Tensor ids) {
  SF_PROFILE_SCOPE("decode");
  const int64_t n = ids.numel(), T = decode_pos_ + n, C = opt_.hidden_size;
  SF_CHECK(n > 0 && T <= decode_capacity_, "decode: ", decode_pos_, " cached + ", n,
           " new tokens exceed the ", decode_capacity_, " decode_start made room for");
  const int64_t H = opt_.num_heads, KV = opt_.num_kv_heads, D = opt_.head_dim;
  const int64_t W = (H + 2 * KV) * D, HD = H * D;
  const DType dt = params_.dtype();
  batch_ = 1, seq_ = n;  // the rows the Linears run on
  const Tensor x0 = x0_.get(be, dt, {n, C});
  be.embedding_forward(x0, params_.value(embed_), ids.reshape({n}));
  if (opt_.gemma) be.scale(x0, embed_scale());
  be.fill(scratch_->ones.get(be, dt, {n}), 1.0);
  Tensor x = x0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    bind_activations(i);
    Layer& l = *layers_[i];
    // (capacity, W) the q, k and v rows of every token so far.
    const Tensor cache = kv_[i].get(be, dt, {decode_capacity_, W});
    const Tensor h1 = l.a->h1.get(be, dt, {n, C});
    be.rms_norm_forward(h1, l.a->saved1.get(be, dt, {n}), x, params_.value(l.ln1), norm_offset(),
                        opt_.rms_norm_eps);
    const Tensor qkv = cache.slice(decode_pos_, T);
    project_qkv(be, l, h1, low_operand(be, l.a->h1_low, h1.data(), n, C, C), qkv, n, decode_pos_);
    const Tensor att = l.a->att.get(be, dt, {T, HD});  // the new rows, the last n, computed
    be.attention_forward({.shape = attention_shape(l, 1, T),
                          .qkv = cache.data(),
                          .out = att.data(),
                          .lse = l.a->lse.get(be, dt, {1, H, T}).data(),
                          .first_row = decode_pos_},
                         dt);
    layer_tail(be, l, x, att.slice(decode_pos_, T).data());
    x = l.out.tensor();
  }
  decode_pos_ = T;
  const Tensor z = z_.get(be, dt, {n, C});
  be.rms_norm_forward(z, norm_saved_.get(be, dt, {n}), x, params_.value(norm_), norm_offset(),
                      opt_.rms_norm_eps);
  const Tensor logits = logits_.get(be, dt, {n, opt_.vocab_size});
  head_forward(be, logits, z);
  return logits;
}

void Decoder::backward_logits(Backend& be, Tensor dlogits) {
  const int64_t N = batch_ * seq_, C = opt_.hidden_size;
  const DType dt = params_.dtype();
  Scratch& s = *scratch_;
  // Head: dz = dlogits W_head, dW_head += dlogits^T z (a classifier: through its rows).
  const Tensor dz = s.dh.get(be, dt, {N, C});
  if (score_ == kNone) {
    const int64_t V = opt_.vocab_size;
    if (opt_.final_logit_softcapping > 0) {  // through the cap, from the capped logits kept
      SF_CHECK(dlogits.data() != logits_.tensor().data(),
               "the decoder's logits are needed in backward: dlogits must not overwrite them");
      const Tensor d = dlogits_uncapped_.get(be, dt, dlogits.shape());
      be.soft_cap_backward(d, dlogits, logits_.tensor(), opt_.final_logit_softcapping);
      dlogits = d;
    }
    // In bf16 from dlogits' and z's bf16 operands and the head's bf16 copy, or in f32.
    const DType gt = low() ? gemm_dt_ : dt;
    const void* d = low() ? low_operand(be, dlogits_low_, dlogits.data(), N, V, V) : dlogits.data();
    be.gemm({.m = N, .n = C, .k = V, .lda = V, .ldb = C, .ldc = C}, gt, d,
            (low() ? head_low_.tensor() : params_.value(head_)).data(), dz.data());
    if (train_base_)
      be.gemm({.trans_a = true, .m = V, .n = C, .k = N, .lda = V, .ldb = C, .ldc = C, .beta = 1},
              gt, d, (low() ? z_low_.tensor() : z_.tensor()).data(), params_.grad(head_).data());
  } else {
    const int64_t B = batch_, K = opt_.num_labels;
    const Tensor dpooled = s.dpooled.get(be, dt, {B, C});
    be.gemm({.m = B, .n = C, .k = K, .lda = K, .ldb = C, .ldc = C}, dt, dlogits.data(),
            params_.value(score_).data(), dpooled.data());
    be.gemm({.trans_a = true, .m = K, .n = C, .k = B, .lda = K, .ldb = C, .ldc = C, .beta = 1}, dt,
            dlogits.data(), pooled_.tensor().data(), params_.grad(score_).data());
    be.fill(dz, 0.0);
    be.embedding_backward(dz, dpooled, last_rows_.tensor());  // a scatter back to the rows
  }
  const Tensor x_last = layers_.back()->out.tensor();
  Tensor dx = s.dx[0].get(be, dt, {N, C});
  be.rms_norm_backward(dx, norm_grad(be, norm_), dz, x_last, params_.value(norm_), norm_offset(),
                       norm_saved_.tensor());
  for (size_t i = layers_.size(); i-- > 0;) {
    const Tensor x = i == 0 ? x0_.tensor() : layers_[i - 1]->out.tensor();
    if (opt_.checkpoint_activations && i + 1 < layers_.size()) {  // the set holds the last layer's
      SF_PROFILE_SCOPE("recompute");
      bind_activations(i);
      layer_forward(be, *layers_[i], x);
    }
    const Tensor dnext = s.dx[(layers_.size() - i) % 2].get(be, dt, {N, C});
    layer_backward(be, *layers_[i], x, dx, dnext);
    dx = dnext;
  }
  if (train_base_) {
    if (opt_.gemma) be.scale(dx, embed_scale());
    be.embedding_backward(params_.grad(embed_), dx, ids_);
  }
  if (grad_ready_) grad_ready_(0, params_.size());
}

void Decoder::layer_backward(Backend& be, Layer& l, Tensor x, Tensor dout, Tensor dx) {
  const int64_t N = batch_ * seq_, C = opt_.hidden_size, F = opt_.intermediate_size;
  const int64_t H = opt_.num_heads, KV = opt_.num_kv_heads, D = opt_.head_dim;
  const int64_t W = (H + 2 * KV) * D, HD = H * D;
  const DType dt = params_.dtype();
  const double offset = norm_offset();
  Scratch& s = *scratch_;
  const auto value = [&](size_t i) { return params_.value(i); };
  // A Linear input's bf16 operand of the forward pass, or null with f32 GEMMs.
  const auto low_of = [&](const Buffer& b) -> const void* {
    return low() ? b.tensor().data() : nullptr;
  };

  // MLP branch: dout reaches (Gemma: the branch's norm,) down_proj, the gated product, gate_proj
  // and up_proj, the norm before them.
  const void* dbranch = dout.data();
  if (opt_.gemma) {
    const Tensor d = s.dbranch_out.get(be, dt, {N, C});
    be.rms_norm_backward(d, norm_grad(be, l.post_mlp), dout, l.a->mlp_out.tensor(),
                         value(l.post_mlp), offset, l.a->mlp_saved.tensor());
    dbranch = d.data();
  }
  const Tensor dact = s.dact.get(be, dt, {N, F});
  proj_backward(be, l.down, dact.data(), 0.0, dbranch, C, l.a->act.tensor().data(), F,
                low_of(l.a->act_low));
  // With DoRA's scaling in the activation, its backward gives the gradients at the products
  // before it and the scales' gradients, from which m's: dm += dscale / ||V||.
  const Tensor dgate = s.dgate.get(be, dt, {N, F}), dup = s.dup.get(be, dt, {N, F});
  GluInputs in = glu_inputs(l);
  const bool gate_unscaled = scaled_in_glu(l.gate), up_unscaled = scaled_in_glu(l.up);
  if (gate_unscaled) in.affine.gate.dscale = s.dscale[0].get(be, dt, {F});
  if (up_unscaled) in.affine.up.dscale = s.dscale[1].get(be, dt, {F});
  be.glu_backward(dgate, dup, dact, in.gate, in.up, opt_.activation, in.affine);
  for (const auto& [p, dscale] :
       {std::pair{&l.gate, in.affine.gate.dscale}, std::pair{&l.up, in.affine.up.dscale}}) {
    if (dscale.empty()) continue;
    be.mul(dscale, dscale, p->inv_norm.tensor());
    be.add(params_.grad(p->m), dscale);
  }
  const Tensor dh = s.dh.get(be, dt, {N, C}), h2 = l.a->h2.tensor();
  proj_backward(be, l.gate, dh.data(), 0.0, dgate.data(), F, h2.data(), C, low_of(l.a->h2_low),
                gate_unscaled);
  proj_backward(be, l.up, dh.data(), 1.0, dup.data(), F, h2.data(), C, low_of(l.a->h2_low),
                up_unscaled);
  const Tensor dmid = s.dmid.get(be, dt, {N, C});
  be.rms_norm_backward(dmid, norm_grad(be, l.ln2), dh, l.a->mid.tensor(), value(l.ln2), offset,
                       l.a->saved2.tensor(), dout);

  // Attention branch: (Gemma: its norm,) o_proj, attention, the rotation undone, (Gemma: q's and
  // k's norms,) the projections.
  dbranch = dmid.data();
  if (opt_.gemma) {
    const Tensor d = s.dbranch_out.get(be, dt, {N, C});
    be.rms_norm_backward(d, norm_grad(be, l.post_attn), dmid, l.a->o_out.tensor(),
                         value(l.post_attn), offset, l.a->o_saved.tensor());
    dbranch = d.data();
  }
  const Tensor datt = s.datt.get(be, dt, {N, HD});
  proj_backward(be, l.o, datt.data(), 0.0, dbranch, C, l.a->att.tensor().data(), HD,
                low_of(l.a->att_low));
  const Tensor dqkv = s.dqkv.get(be, dt, {N, W});
  AttentionBackward a;
  a.shape = attention_shape(l, batch_, seq_);
  a.qkv = l.a->qkv.tensor().data();
  a.out = l.a->att.tensor().data();
  a.lse = l.a->lse.tensor().data();
  a.dout = datt.data();
  a.dqkv = dqkv.data();
  be.attention_backward(a, dt);
  Rotary back = rotary_of(dqkv.data(), N, seq_, 0, l.local);
  back.inverse = true;
  be.rotary(back, dt);
  const Tensor h1 = l.a->h1.tensor();
  if (opt_.gemma) {  // through q's and k's norms (head_dim wide), packed
    for (const bool is_q : {true, false}) {
      const int64_t heads = is_q ? H : KV;
      const Tensor dn = s.dq_normed.get(be, dt, {N * heads, D});
      be.copy_rows(dn.data(), heads * D, at(dqkv.data(), is_q ? 0 : HD, dt), W, N, heads * D, dt);
      const Tensor draw = s.dq_raw.get(be, dt, {N * heads, D});
      const size_t w = is_q ? l.q_norm : l.k_norm;
      be.rms_norm_backward(draw, train_base_ ? params_.grad(w) : s.dhead_w.get(be, dt, {D}), dn,
                           (is_q ? l.a->q_raw : l.a->k_raw).tensor(), value(w), offset,
                           (is_q ? l.a->q_saved : l.a->k_saved).tensor());
      proj_backward(be, is_q ? l.q : l.k, dh.data(), is_q ? 0.0 : 1.0, draw.data(), heads * D,
                    h1.data(), C, low_of(l.a->h1_low));
    }
  } else {
    proj_backward(be, l.q, dh.data(), 0.0, dqkv.data(), W, h1.data(), C, low_of(l.a->h1_low));
    proj_backward(be, l.k, dh.data(), 1.0, at(dqkv.data(), HD, dt), W, h1.data(), C,
                  low_of(l.a->h1_low));
  }
  proj_backward(be, l.v, dh.data(), 1.0, at(dqkv.data(), HD + KV * D, dt), W, h1.data(), C,
                low_of(l.a->h1_low));
  be.rms_norm_backward(dx, norm_grad(be, l.ln1), dh, x, value(l.ln1), offset, l.a->saved1.tensor(),
                       dmid);
}

}  // namespace seqforge
