#pragma once
// The Llama family of decoders as Hugging Face's transformers defines them (Llama 2 and 3,
// SmolLM2, Qwen2 and 2.5), forward and backward: token embeddings, blocks of RMS norm,
// grouped-query attention with rotary position embeddings and a gated MLP, each branch added
// to the stream, a final RMS norm and an output head (tied to the embeddings or not).
// Parameter names are HF's (model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
// .self_attn.{q,k,v,o}_proj.weight (Qwen2: q, k, v biases), .post_attention_layernorm.weight,
// .mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight); so is the initialisation
// (N(0, initializer_range) weights, zero biases, unit norms).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "seqforge/backend/buffer.hpp"
#include "seqforge/backend/ops.hpp"
#include "seqforge/nn/model.hpp"

namespace seqforge {

// Reads a Hugging Face config.json strictly: every field that changes the function is honoured
// or refused by name, and fields seqforge does not know are refused too.
DecoderOptions read_decoder_config(const std::string& path);

// The rotary frequencies 1 / theta^(2i / head_dim), i < head_dim / 2, after any scaling; a
// Gemma 3 local layer's with its own base and no scaling.
std::vector<double> rope_inverse_frequencies(const DecoderOptions& options, bool local = false);

class Decoder;
// Loads a Hugging Face folder's weights (model.safetensors, or the shards its index names) into
// `model` by HF's names, converting bf16, f16, f32 or f64 to the parameters' dtype. A missing,
// extra, mis-shaped or non-finite tensor, or an index naming a missing shard, is one error
// naming it; a tied head saved as lm_head.weight alone is read from there. Adapters keep their
// values; so does a classifier's head, unless the folder is a classifier's too (score.weight of
// the same shape, loaded: returns true; a language model leaves it, as transformers does). A
// folder that holds adapters beside its base (a run's, unmerged) is refused.
bool load_hf_weights(const std::string& folder, Decoder& model, Backend& be);
// A classifier's folder lends its score head only to a run of the same classes in the same
// order: its config.json's id2label (unless transformers' defaults, LABEL_0 ...) must be
// `classes`, else one error naming both lists.
void check_classifier_labels(const std::string& folder, const std::vector<std::string>& classes);

class Decoder final : public Model {
 public:
  explicit Decoder(const DecoderOptions& options, DType dtype = DType::f32);
  ~Decoder() override;
  void initialize(Backend& be, uint64_t seed) override;

  // ids (B, T) i64 -> logits (B*T, V), or (B, num_labels) for a classifier.
  Tensor forward(Backend& be, Tensor ids, bool training, Rng& rng);
  // dlogits like forward's logits; parameter gradients accumulate.
  void backward_logits(Backend& be, Tensor dlogits);

  // Generation with a key/value cache: decode_start() empties it and makes room for `capacity`
  // tokens in all; decode(ids (1, n)) runs the n new tokens after those cached and returns their
  // logits (n, V), as forward's last n rows of the whole sequence.
  void decode_start(Backend& be, int64_t capacity);
  Tensor decode(Backend& be, Tensor ids);
  int64_t decoded() const { return decode_pos_; }

  Tensor forward(Backend& be, Tensor ids, Tensor h0, Tensor c0, bool training, Rng& rng) override;
  Tensor backward(Backend& be, Tensor dlogits) override {
    backward_logits(be, dlogits);
    return Tensor();
  }
  Parameters& parameters() override { return params_; }
  const ModelOptions& options() const override { return model_opt_; }
  const DecoderOptions& decoder_options() const { return opt_; }
  void set_gemm_dtype(DType dtype) override;
  void set_input_grad(bool) override {}
  void set_grad_ready_hook(GradReadyHook hook) override { grad_ready_ = std::move(hook); }
  std::vector<bool> frozen_parameters() const override;
  void init_adapters(Backend& be, const std::vector<std::string>& loaded) override;
  void set_token_layout(Tensor lengths, Tensor segments) override;
  std::vector<std::string> fresh_parameters() const override;
  std::vector<std::string> unused_base_tensors() const override;
  std::map<std::string, std::string> tied_base_tensors() const override;

 private:
  struct Proj;
  struct Acts;
  struct Layer;
  struct Scratch;
  // Binds layer i to its activations: its own set, or with activation checkpointing the one set
  // every layer shares.
  void bind_activations(size_t i);
  void declare_adapters();
  void prepare_weights(Backend& be);
  // With bf16 GEMMs, x (rows, cols), rows ld apart, as a packed bf16 operand in `low`; null with
  // f32 GEMMs.
  const void* low_operand(Backend& be, Buffer& low, const void* x, int64_t rows, int64_t cols,
                          int64_t ld);
  bool low() const { return gemm_dt_ != params_.dtype(); }
  // The bf16 operand of a Linear's weight: a base held in bf16 itself, else its bf16 copy (DoRA:
  // of V).
  const void* low_weight(const Proj& p) const;
  const void* base_low_weight(const Proj& p) const;
  // A Linear forward and backward; `unscaled`: the caller applies DoRA's column scaling (the
  // forward stops at the product before it, p.pre; dy is the gradient there and m's is done).
  void proj_forward(Backend& be, Proj& p, void* y, int64_t ldy, const void* x, int64_t ldx,
                    const void* x_low, const void* residual, bool unscaled = false);
  void proj_backward(Backend& be, Proj& p, void* dx, double dx_beta, const void* dy, int64_t ldy,
                     const void* x, int64_t ldx, const void* x_low, bool unscaled = false);
  // Whether the gated activation applies gate_proj's or up_proj's DoRA column scaling (and bias)
  // itself, reading the product before it: DoRA without adapter dropout.
  bool scaled_in_glu(const Proj& p) const;
  struct GluInputs {
    Tensor gate, up;
    GluAffine affine;
  };
  // The gated activation's inputs after the forward's gate_proj and up_proj: their outputs, or
  // where scaled_in_glu, their products before the scaling with the scaling as column maps.
  GluInputs glu_inputs(Layer& l) const;
  void head_forward(Backend& be, Tensor logits, Tensor z);
  void head_product(Backend& be, Tensor logits, Tensor z);
  Tensor norm_grad(Backend& be, size_t i);
  void project_qkv(Backend& be, Layer& l, Tensor h1, const void* h1_low, Tensor qkv, int64_t seq,
                   int64_t first_pos);
  void layer_tail(Backend& be, Layer& l, Tensor x, const void* att);
  void layer_forward(Backend& be, Layer& l, Tensor x);
  void layer_backward(Backend& be, Layer& l, Tensor x, Tensor dout, Tensor dx);
  void prepare_rope(Backend& be, int64_t seq);
  // The rotation of q and k in rows of x: `rows` rows at positions first_pos + row % seq.
  Rotary rotary_of(void* x, int64_t rows, int64_t seq, int64_t first_pos, bool local) const;
  double norm_offset() const { return opt_.gemma ? 1.0 : 0.0; }
  // The attention of `seq` tokens in `batch` rows in a layer: causal, grouped-query, a local
  // layer's sliding window, attention_scale().
  AttentionShape attention_shape(const Layer& l, int64_t batch, int64_t seq) const;
  // 1 / sqrt(head_dim), or Gemma 3's query_pre_attn_scalar^-1/2.
  double attention_scale() const {
    return 1.0 / std::sqrt(opt_.query_pre_attn_scalar > 0 ? opt_.query_pre_attn_scalar
                                                          : double(opt_.head_dim));
  }
  // Gemma 3's embedding scale: sqrt(hidden) rounded to the parameters' dtype, as HF rounds it.
  double embed_scale() const {
    const double s = std::sqrt(double(opt_.hidden_size));
    return params_.dtype() == DType::f32 ? double(float(s)) : s;
  }

  DecoderOptions opt_;
  ModelOptions model_opt_;
  GradReadyHook grad_ready_;
  Parameters params_;
  static constexpr size_t kNone = SIZE_MAX;
  size_t embed_ = 0, norm_ = 0, head_ = 0, score_ = kNone;
  size_t base_params_ = 0;  // parameters [0, base_params_) are the model's, the rest adapters
  bool train_base_ = true;  // false under adapters: the base is frozen
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<Scratch> scratch_;
  int64_t batch_ = 0, seq_ = 0;          // of the last forward
  Tensor ids_;                           // (N) its ids
  Buffer x0_, z_, norm_saved_, logits_;  // (N, C), (N, C), (N), (N, V) or (B, K)
  Buffer dlogits_uncapped_;              // (N, V) the gradient at the logits before soft-capping
  Buffer cos_, sin_;                     // (positions, head_dim / 2)
  Buffer local_cos_, local_sin_;         // Gemma 3's local layers' tables
  int64_t rope_positions_ = 0;
  Tensor lengths_;             // (B) set_token_layout's
  Buffer last_rows_, pooled_;  // a classifier's: (B) i64 each row's last token, (B, C)
  std::vector<Buffer> kv_;     // decoding: per layer (capacity, W), every token's q, k, v
  std::vector<std::unique_ptr<Acts>> acts_;  // per layer, or one with checkpointing
  // The GEMMs' operand dtype: the parameters' (f32), or bf16 (f32 accumulation) with bf16
  // copies of the weights, made each step, a frozen weight's once (frozen_low_ready_).
  DType gemm_dt_;
  bool frozen_low_ready_ = false;
  bool adapter_dropping_ = false;          // this forward is a training one with adapter dropout
  Buffer head_low_, z_low_, dlogits_low_;  // bf16 GEMMs: the head's weight, its input and dlogits
  int64_t decode_pos_ = 0, decode_capacity_ = 0;
};

}  // namespace seqforge
