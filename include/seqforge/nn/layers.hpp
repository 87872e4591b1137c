#pragma once
// Linear, Embedding and Dropout: forward and backward side by side. Each layer owns the
// activations it returns and the gradients it hands back; the next call reuses them.
#include <string>

#include "seqforge/backend/buffer.hpp"
#include "seqforge/nn/parameters.hpp"

namespace seqforge {

// y = x W^T + b. PyTorch names: <prefix>.weight (out, in), <prefix>.bias (out).
class Linear {
 public:
  Linear(Parameters& params, const std::string& prefix, int64_t in, int64_t out, bool bias = true);
  Tensor forward(Backend& be, Tensor x);    // x (N, in) -> y (N, out)
  Tensor backward(Backend& be, Tensor dy);  // dy (N, out) -> dx (N, in); dW, db accumulate
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  Parameters& params_;
  int64_t in_, out_;
  size_t weight_, bias_ = SIZE_MAX;
  Tensor x_;       // (N, in) saved input
  Buffer y_, dx_;  // (N, out), (N, in)
};

// y = table[ids]. PyTorch name: <prefix>.weight (vocab, dim), initialised N(0, 1).
class Embedding {
 public:
  Embedding(Parameters& params, const std::string& prefix, int64_t vocab, int64_t dim);
  Tensor forward(Backend& be, Tensor ids);  // ids (N) i32/i64 -> (N, dim)
  void backward(Backend& be, Tensor dy);    // dy (N, dim); dtable accumulates
  int64_t vocab() const { return vocab_; }
  int64_t dim() const { return dim_; }

 private:
  Parameters& params_;
  int64_t vocab_, dim_;
  size_t table_;
  Tensor ids_;
  Buffer y_;
};

// Inverted dropout: in training, zero with probability p and scale the rest by 1 / (1 - p).
class Dropout {
 public:
  explicit Dropout(double p);
  Tensor forward(Backend& be, Tensor x, bool training, Rng& rng);
  Tensor backward(Backend& be, Tensor dy);
  double p() const { return p_; }

 private:
  double p_;
  bool active_ = false;
  Buffer mask_, y_, dx_;
};

}  // namespace seqforge
