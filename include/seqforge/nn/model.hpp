#pragma once
// The model-family seam: what training, evaluation, prediction and generation need of a model,
// whichever family it is (a recurrent SequenceModel, a Transformer). make_model builds the one
// ModelOptions names.
#include <functional>
#include <memory>

#include "seqforge/core/rng.hpp"
#include "seqforge/nn/parameters.hpp"
#include "seqforge/nn/recurrent.hpp"

namespace seqforge {

enum class ModelFamily { recurrent, transformer };

struct TransformerOptions {
  int64_t vocab_size = 0;
  int64_t block_size = 0;  // the longest sequence: rows of the position embedding
  int64_t n_layer = 0, n_head = 0, n_embd = 0;
  double dropout = 0.0;  // on the embeddings and on each residual branch
  // true: each position attends to itself and those before it (a decoder); false: to all.
  bool causal = true;
  // Activation checkpointing: forward keeps only each block's output, and backward recomputes a
  // block's activations just before its gradients, so one block's activations live at a time.
  bool checkpoint_activations = false;
};

struct ModelOptions {
  ModelFamily family = ModelFamily::recurrent;
  int64_t vocab_size = 0;          // > 0: inputs are token ids, embedded first
  int64_t embedding_dim = 0;       // the recurrent layer's input size when vocab_size > 0
  RecurrentOptions rnn;            // recurrent: the layer's cell, sizes, layers, directions
  TransformerOptions transformer;  // transformer: its sizes (vocab_size is the one above)
  int64_t output_size = 1;
  bool per_step = false;  // outputs on every step; otherwise on the last step
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
};

std::unique_ptr<Model> make_model(const ModelOptions& options, DType dtype = DType::f32);

}  // namespace seqforge
