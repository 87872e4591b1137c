#pragma once
// A GPT-2 style transformer (pre-LayerNorm blocks of causal multi-head self-attention and a GELU
// MLP, learned positions, a final LayerNorm and an output head tied to the token embedding),
// forward and backward. Parameter names and initialisation are nanoGPT's (model.py):
// transformer.wte.weight (V, C), transformer.wpe.weight (block_size, C),
// transformer.h.{i}.ln_1, .attn.c_attn (3C, C), .attn.c_proj (C, C), .ln_2, .mlp.c_fc (4C, C),
// .mlp.c_proj (C, 4C), transformer.ln_f; N(0, 0.02) weights, the c_proj weights
// N(0, 0.02 / sqrt(2 n_layer)), zero biases, LayerNorms 1 and 0.
//
// As a sequence classifier (num_classes > 0, an encoder when not causal): padded token rows
// (set_token_layout), optional segment embeddings transformer.wse.weight, and a head
// classifier.weight, classifier.bias (N(0, 0.02), zeros) on the mean of ln_f's outputs over
// each row's tokens, giving (B, num_classes) logits.
#include <memory>
#include <vector>

#include "seqforge/backend/buffer.hpp"
#include "seqforge/backend/ops.hpp"
#include "seqforge/nn/model.hpp"

namespace seqforge {

class Transformer final : public Model {
 public:
  explicit Transformer(const TransformerOptions& options, DType dtype = DType::f32);
  ~Transformer() override;
  void initialize(Backend& be, uint64_t seed) override;

  // ids (B, T) i64 with T <= block_size -> logits (B*T, V), or (B, K) for a classifier.
  Tensor forward(Backend& be, Tensor ids, bool training, Rng& rng);
  // dlogits like forward's logits. Parameter gradients accumulate.
  void backward_logits(Backend& be, Tensor dlogits);

  Tensor forward(Backend& be, Tensor ids, Tensor h0, Tensor c0, bool training, Rng& rng) override;
  Tensor backward(Backend& be, Tensor dlogits) override {
    backward_logits(be, dlogits);
    return Tensor();
  }
  Parameters& parameters() override { return params_; }
  const ModelOptions& options() const override { return model_opt_; }
  const TransformerOptions& transformer_options() const { return opt_; }
  void set_gemm_dtype(DType dtype) override;
  void set_input_grad(bool) override {}
  void set_grad_ready_hook(GradReadyHook hook) override { grad_ready_ = std::move(hook); }
  std::vector<bool> frozen_parameters() const override;

  // Generation with a key/value cache: decode_start() empties it; decode(ids (1, n)) runs the n
  // new tokens after those cached (at most block_size in all) and returns their logits (n, V).
  void decode_start(Backend& be);
  Tensor decode(Backend& be, Tensor ids);
  int64_t decoded() const { return decode_pos_; }
  void init_adapters(Backend& be, const std::vector<std::string>& loaded) override;
  void set_token_layout(Tensor lengths, Tensor segments) override {
    lengths_ = lengths;
    segments_ = segments;
  }
  std::vector<std::string> fresh_parameters() const override;
  std::vector<std::string> unused_base_tensors() const override;
  std::map<std::string, std::string> tied_base_tensors() const override {
    return {{"transformer.wte.weight", "lm_head.weight"}};  // nanoGPT ties them
  }
  std::string activation_note() const override;

 private:
  struct Proj;
  struct Block;
  struct Acts;
  struct Scratch;
  void declare_adapters();
  void prepare_weights(Backend& be);
  Tensor low_weight(const Proj& p) const;
  // The dtype of the GEMMs' operands: the half type, or the parameters'.
  DType operand_type() const { return low_ ? low_type_ : params_.dtype(); }
  Tensor base_weight(const Proj& p) const;
  // y = (or with `add`, y +=) the Linear j of a block on x, its adapter included; `unscaled`:
  // the caller applies DoRA's column scaling (the forward stops at the product before it,
  // a.pre[j]; dy is the gradient there and m's is done).
  void proj_forward(Backend& be, Proj& p, Acts& a, int j, Tensor y, Tensor x, Buffer& x_low,
                    uint64_t seed, bool add = false, bool unscaled = false);
  void proj_backward(Backend& be, Proj& p, Acts& a, int j, Tensor dx, Tensor dy, Tensor x,
                     Tensor x_op, bool unscaled = false);
  // The map GELU applies to the MLP's first Linear's product: DoRA's column scaling and the
  // bias, where DoRA runs without adapter dropout (the Linear then stops before it); else none.
  ColumnMap fc_map(const Proj& p) const;
  void adapter_input(Backend& be, Proj& p, Tensor xa, Tensor x, Buffer& x_low);
  void adapter_grad_a(Backend& be, Proj& p, Tensor g, Tensor x, Tensor x_op, double s);
  void drop(Backend& be, Tensor x, Buffer& mask, uint64_t seed);
  void join_branch(Backend& be, Block& k, Acts& a, int j, Tensor stream, Tensor x, Buffer& x_low,
                   Buffer& mask, uint64_t mask_seed);
  AttentionShape block_attention(const Block& k) const;
  void block_forward(Backend& be, Block& k, Acts& a, Tensor x);
  void block_backward(Backend& be, Block& k, Acts& a, Tensor x, Tensor dout, Tensor dx);
  Tensor head_forward(Backend& be);
  Tensor bias(size_t i) const;                   // a Linear's bias; empty without biases
  Tensor norm_bias(Backend& be, size_t i);       // a LayerNorm's bias; zeros without biases
  Tensor norm_bias_grad(Backend& be, size_t i);  // its gradient, or scratch to discard it in
  Tensor head_backward(Backend& be, Tensor dlogits);

  TransformerOptions opt_;
  ModelOptions model_opt_;
  GradReadyHook grad_ready_;
  Parameters params_;
  static constexpr size_t kNone = SIZE_MAX;
  size_t wte_, wpe_, lnf_w_, lnf_b_ = kNone;
  size_t wse_ = kNone, cls_w_ = kNone, cls_b_ = kNone;  // a classifier's
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<std::unique_ptr<Acts>> acts_;
  std::unique_ptr<Scratch> scratch_;
  std::vector<Buffer> kv_;  // per block: (block_size, 3C) q, k, v of the tokens decoded
  int64_t decode_pos_ = 0;
  size_t base_params_ = 0;  // parameters [0, base_params_) are the model's, the rest adapters
  bool train_base_ = true;  // false under adapters: no base gradient is computed
  bool low_ = false, dropping_ = false, adapter_dropping_ = false;
  DType low_type_ = DType::bf16;  // with low_: the half type of the GEMMs' operands, bf16 or f16
  AttentionShape shape_;
  Tensor ids_, z_;                            // (N) the last forward's ids, (N, C) ln_f's output
  Buffer x0_, z_buf_, lnf_saved_, logits_;    // (N, C), (N, C), (N, 2), (N, V) or (B, K)
  Tensor lengths_, segments_;                 // (B), (B, T): set_token_layout's
  Buffer seg_emb_, pool_, pooled_, dpooled_;  // (N, C); (B, N) mean-pooling weights; (B, C); (B, C)
};

}  // namespace seqforge
