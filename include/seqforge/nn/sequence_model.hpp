#pragma once
// SequenceModel: [Embedding] -> recurrent layer (LSTM, GRU) -> Linear head, on the last step or
// on every step. Parameter names match a PyTorch module with attributes `embedding`, the cell's
// name (`lstm`, `gru`) and `head`.
//
// With adapters (options.adapter), the embedding and the layer's weights W0 are frozen and the
// recurrence runs on weights made each step from them, W0 + s B A (LoRA) or m V / ||V|| (DoRA);
// the gradient the recurrence gives those weights becomes the adapters'. The head trains.
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "seqforge/nn/layers.hpp"
#include "seqforge/nn/model.hpp"
#include "seqforge/nn/recurrent.hpp"

namespace seqforge {

class SequenceModel final : public Model {
 public:
  SequenceModel(const ModelOptions& options, DType dtype = DType::f32);
  ~SequenceModel() override;
  // Allocates and initialises the parameters (PyTorch's default distributions).
  void initialize(Backend& be, uint64_t seed) override;

  // x: features (B, T, I) / (T, B, I) per rnn.batch_first, or ids (B, T) / (T, B).
  // h0, c0 (D*L, B, H) or empty. Returns (B, out) for the last step, or one row per step
  // in the input's order: (B*T, out) batch-first, (T*B, out) time-first.
  Tensor forward(Backend& be, Tensor x, Tensor h0, Tensor c0, bool training, Rng& rng) override;
  // dy like the output; dh_n, dc_n optional. Parameter gradients accumulate.
  // Returns dx for feature inputs (empty for ids).
  Tensor backward(Backend& be, Tensor dy, Tensor dh_n, Tensor dc_n);
  Tensor backward(Backend& be, Tensor dy) override { return backward(be, dy, {}, {}); }

  // GEMM operand dtype of the recurrent layer (bf16: mixed precision); the head stays in full
  // precision.
  void set_gemm_dtype(DType dtype) override { rnn_->set_gemm_dtype(dtype); }
  // Whether backward returns dx for feature inputs (on by default).
  void set_input_grad(bool on) override {
    rnn_->set_input_grad(on || (embedding_ != nullptr && adapters_.empty()));
  }

  // Called during backward with parameters [first, end) whose gradients are final (the head's,
  // then the recurrent layer's, then the embedding's), so gradient all-reduces can start early.
  void set_grad_ready_hook(GradReadyHook hook) override { grad_ready_ = std::move(hook); }

  Parameters& parameters() override { return params_; }
  Recurrent& rnn() { return *rnn_; }
  Recurrent* recurrent() override { return rnn_.get(); }
  const ModelOptions& options() const override { return opt_; }
  std::vector<bool> frozen_parameters() const override;
  std::vector<std::string> fresh_parameters() const override;
  void init_adapters(Backend& be, const std::vector<std::string>& loaded) override;

 private:
  struct Adapter;
  void declare_adapters();
  void prepare_weights(Backend& be, bool training, Rng& rng);
  void adapter_backward(Backend& be);
  struct Span {  // a part of the head's input: columns [col, col + cols) of step t
    int64_t t, col, cols;
  };
  std::array<Span, 2> head_spans() const;  // no allocation: it runs every step
  void* at(Tensor x, int64_t t, int64_t col) const;
  int64_t ld() const;

  ModelOptions opt_;
  Parameters params_;
  Parameters work_;  // under adapters: the weights the recurrence uses, and their gradients
  std::vector<Adapter> adapters_;
  size_t adapters_first_ = 0;
  bool a_dropped_ = false;  // this step's adapters run on a dropped A (adapter dropout)
  std::unique_ptr<Embedding> embedding_;
  std::unique_ptr<Recurrent> rnn_;
  std::unique_ptr<Linear> head_;
  int64_t T_ = 0, B_ = 0;
  size_t rnn_first_ = 0, head_first_ = 0;  // parameter indices where each module starts
  GradReadyHook grad_ready_;
  Buffer last_, dy_full_;  // (B, D*H) the head's input; (.., D*H) scattered gradient
  Buffer dh_n_;            // (D*L, B, H) the last step's gradient as the top layer's dh_n
};

}  // namespace seqforge
