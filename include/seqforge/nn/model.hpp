#pragma once
// The model-family seam: what training, evaluation, prediction and generation need of a model,
// whichever family it is (a recurrent SequenceModel, a Transformer). make_model builds the one
// ModelOptions names.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "seqforge/backend/ops.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/nn/parameters.hpp"
#include "seqforge/nn/recurrent.hpp"

namespace seqforge {

enum class ModelFamily { recurrent, transformer, decoder };

// Low-rank adapters on a frozen model's Linear weights W0 (out, in), PEFT's LoRA and DoRA:
//   lora: y = x W0^T + b + s (drop(x) A^T) B^T,  s = alpha / rank, A (rank, in), B (out, rank)
//   dora: y = (m / ||V||) (x V^T) + b,  V = W0 + s B A, the norm per output row and treated as a
//         constant in backward (the DoRA paper's choice, as PEFT), m (out) starting at ||W0||
// A is drawn U(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform, a = sqrt 5), B starts at zero. Only
// the adapters train (and a new head); names are PEFT's: base_model.model.<linear>.lora_A.weight,
// .lora_B.weight, .lora_magnitude_vector. On a recurrent layer's weight W0 (a gate block
// per row group, lstm.weight_ih_l0, ...) the same update makes the weight the recurrence uses,
// under base_model.model.<weight name>.lora_A.weight, ...; there adapter dropout drops entries
// of A instead (DropConnect), as no per-step input reaches the folded weight.
enum class AdapterKind { none, lora, dora };
struct AdapterOptions {
  AdapterKind kind = AdapterKind::none;
  int64_t rank = 8;
  double alpha = 16.0;
  double dropout = 0.0;  // on the adapter's input (a recurrent layer: on A's entries)
  // The Linears of each block that get one: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj; or a
  // recurrent layer's weights in every layer and direction: lstm.weight_ih, lstm.weight_hh (the
  // cell's name first: gru.weight_ih, ...), lstm.weight_hr.
  std::vector<std::string> targets = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  bool bf16_base = false;  // the targeted base weights held in bf16 (a transformer: bf16 GEMMs)
  bool operator==(const AdapterOptions&) const = default;
};

struct TransformerOptions {
  int64_t vocab_size = 0;
  int64_t block_size = 0;  // the longest sequence: rows of the position embedding
  int64_t n_layer = 0, n_head = 0, n_embd = 0;
  double dropout = 0.0;  // on the embeddings, the attention probabilities and each residual branch
  // true: each position attends to itself and those before it (a decoder); false: to all.
  bool causal = true;
  // Activation checkpointing: forward keeps only each block's output, and backward recomputes a
  // block's activations just before its gradients, so one block's activations live at a time.
  bool checkpoint_activations = false;
  // Biases in the Linears and LayerNorms (nanoGPT's `bias`); false: none, as nanoGPT's train.py
  // defaults to.
  bool bias = true;
  AdapterOptions adapter{};
  // > 0: a classification head (classifier.weight (K, C), classifier.bias (K)) on the mean of
  // the final LayerNorm's outputs over each sequence's tokens, instead of the tied LM head.
  int64_t num_classes = 0;
  // > 0: segment embeddings transformer.wse.weight (segments, C) added to the tokens (text A
  // and text B of a pair); they and the classifier train under adapters too.
  int64_t segments = 0;
};

// rope_scaling: Llama 3's frequency-dependent stretch of the rotary frequencies (rope_type
// llama3), or every frequency divided by `factor` (rope_type linear).
struct RopeScaling {
  bool llama3 = false, linear = false;
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position_embeddings = 8192;
  bool operator==(const RopeScaling&) const = default;
};

struct DecoderOptions {
  std::string model_type = "llama";  // config.json's: llama, qwen2, gemma3_text
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0;
  int64_t num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t max_positions = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  RopeScaling rope_scaling{};
  bool qkv_bias = false;  // Qwen2's biases on q, k and v (Llama's attention_bias: on o too)
  bool o_bias = false;
  bool mlp_bias = false;
  GluKind activation = GluKind::silu;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  // LoRA or DoRA on the Linears AdapterOptions::targets names by HF's module names (q_proj,
  // k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj), the base frozen.
  AdapterOptions adapter{.targets = {"q_proj", "v_proj"}};
  // > 0: HF's sequence classification head, score.weight (num_labels, hidden) without a bias,
  // on each row's last token (set_token_layout's lengths) that is not pad_token_id, as
  // transformers finds it (the row's first where every one is), giving (B, num_labels) logits.
  int64_t num_labels = 0;
  int64_t pad_token_id = -1;  // config.json's; -1: none
  // Gemma 3: norms scale by 1 + w, the embeddings by sqrt(hidden) (in the parameters' dtype), q
  // and k are normed per head before the rotation, each branch is normed before it joins the
  // stream, attention scales by query_pre_attn_scalar^-1/2, and the local (sliding-window)
  // layers rotate with their own base and no scaling.
  std::vector<int64_t> eos_token_ids;  // config.json's eos_token_id: where generation stops
  bool gemma = false;
  double query_pre_attn_scalar = 0;  // 0: head_dim
  double rope_local_theta = 10000;
  std::vector<bool> sliding;   // per layer: a local layer, attending sliding_window keys back
  int64_t sliding_window = 0;  // 0: none
  // > 0: attention scores, and the language-model head's logits, x -> cap tanh(x / cap)
  // (attn_logit_softcapping, final_logit_softcapping); 0: none.
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  // Forward keeps each layer's output only; backward recomputes a layer's activations first.
  bool checkpoint_activations = false;
  bool operator==(const DecoderOptions&) const = default;
};

struct ModelOptions {
  ModelFamily family = ModelFamily::recurrent;
  int64_t vocab_size = 0;          // > 0: inputs are token ids, embedded first
  int64_t embedding_dim = 0;       // the recurrent layer's input size when vocab_size > 0
  RecurrentOptions rnn;            // recurrent: the layer's cell, sizes, layers, directions
  AdapterOptions adapter;          // either family's adapters (make_model hands a transformer them)
  TransformerOptions transformer;  // transformer: its sizes (vocab_size is the one above)
  DecoderOptions decoder;          // decoder: a Llama-family model (its own vocab_size)
  int64_t output_size = 1;
  bool per_step = false;  // outputs on every step; otherwise on the last step
  // Without per_step: the head reads each direction's final state (the forward direction's last
  // step, the backward's first: PyTorch's h_n), not the last step's output.
  bool final_states = false;
};

class Model {
 public:
  virtual ~Model() = default;
  // Allocates and initialises the parameters (the family's distributions) from `seed`.
  virtual void initialize(Backend& be, uint64_t seed) = 0;
  // x: features (B, T, I) or token ids (B, T), batch-first. Returns (B, out), or (B*T, out) with
  // per_step. h0, c0: a recurrent model's initial states (empty: zeros); others take none.
  virtual Tensor forward(Backend& be, Tensor x, Tensor h0, Tensor c0, bool training, Rng& rng) = 0;
  // dy like forward's output. Parameter gradients accumulate. Returns dx for feature inputs
  // (empty for ids).
  virtual Tensor backward(Backend& be, Tensor dy) = 0;

  virtual Parameters& parameters() = 0;
  virtual const ModelOptions& options() const = 0;
  // GEMM operand dtype (bf16: mixed precision).
  virtual void set_gemm_dtype(DType dtype) = 0;
  // Whether backward returns dx for feature inputs.
  virtual void set_input_grad(bool on) = 0;
  // Called during backward with parameters [first, end) whose gradients are final, so gradient
  // all-reduces can start early.
  using GradReadyHook = std::function<void(size_t first, size_t end)>;
  virtual void set_grad_ready_hook(GradReadyHook hook) = 0;
  // The recurrent layer, whose final states carry on (stateful training, generation); null for
  // other families.
  virtual Recurrent* recurrent() { return nullptr; }
  // Parameters that never train (a base model under adapters); empty: none.
  virtual std::vector<bool> frozen_parameters() const { return {}; }
  // Sets adapters that start from the base weights (DoRA's magnitudes: ||W0 + s B A|| per row),
  // after the base weights are loaded; parameters in `loaded` (from the same file) are kept.
  virtual void init_adapters(Backend& be, const std::vector<std::string>& loaded) {
    (void)be, (void)loaded;
  }
  // Padded token inputs: lengths (B) i64, the tokens of each row (the rest is padding, never
  // attended to nor pooled); segments (B, T) i64, each token's segment. Empty: none. Applies to
  // the forward calls that follow.
  virtual void set_token_layout(Tensor lengths, Tensor segments) { (void)lengths, (void)segments; }
  // Parameters a base model's checkpoint may lack (adapters, a new head): initialised, not
  // loaded; and the checkpoint's tensors this model does not use (the LM head of a model
  // fine-tuned as a classifier, nanoGPT's attention-mask buffers).
  virtual std::vector<std::string> fresh_parameters() const { return {}; }
  virtual std::vector<std::string> unused_base_tensors() const { return {}; }
  // Parameters a base model's checkpoint may hold under another name only, {parameter, name}: a
  // tied weight saved once (safetensors' save_model keeps nanoGPT's embedding as lm_head.weight).
  virtual std::map<std::string, std::string> tied_base_tensors() const { return {}; }
  // After a training step, a line on what activation checkpointing saved (measured from the
  // buffers the step kept for backward); empty when the model does not checkpoint.
  virtual std::string activation_note() const { return {}; }
};

std::unique_ptr<Model> make_model(const ModelOptions& options, DType dtype = DType::f32);

// The backend op groups training such a model runs: a device backend must run them all.
std::vector<Op> ops_needed(const ModelOptions& options);

}  // namespace seqforge
