#pragma once
// Parameters: the model's weights and their gradients, each one arena with PyTorch's names.
#include <string>
#include <vector>

#include "seqforge/backend/arena.hpp"
#include "seqforge/core/rng.hpp"

namespace seqforge {

struct Init {
  enum Kind { zeros, uniform, normal, constant } kind = zeros;
  double a = 0, b = 0;  // uniform: [a, b); normal: mean a, std b; constant: a
  static Init Uniform(double bound) { return {uniform, -bound, bound}; }
  static Init Constant(double value) { return {constant, value, 0}; }
  static Init Normal(double mean, double std) { return {normal, mean, std}; }
};

class Parameters {
 public:
  explicit Parameters(DType dtype = DType::f32) : values_(dtype), grads_(dtype) {}

  // Declares a parameter; returns its index. Only before allocate().
  size_t declare(std::string name, Shape shape, Init init);
  // Marks parameter i as never trained (a base model under adapters): its gradient and its
  // optimizer state are empty views, so it costs only its value, held in `storage` (the
  // parameters' dtype, or narrower: bf16). Only before allocate().
  void fix(size_t i);
  void fix(size_t i, DType storage);
  bool fixed(size_t i) const { return fixed_[i]; }
  // Allocates values and gradients and draws every value from its Init, in declaration order.
  void allocate(Backend& backend, Rng& rng);
  void zero_grad(Backend& backend);

  Tensor value(size_t i) const { return values_.view(i); }
  Tensor grad(size_t i) const { return grads_.view(i); }
  Arena& values() { return values_; }
  Arena& grads() { return grads_; }
  const Arena& values() const { return values_; }
  const Arena& grads() const { return grads_; }
  DType dtype() const { return values_.dtype(); }  // of every parameter but narrower fixed ones
  size_t size() const { return values_.entries().size(); }
  int64_t count() const;  // total number of scalars
  const Init& init(size_t i) const { return inits_[i]; }

  // A second name for parameter `index` (a tied weight: nanoGPT's lm_head.weight is
  // transformer.wte.weight). Checkpoints hold it under both names; loading accepts either.
  void alias(std::string name, size_t index) { aliases_.emplace_back(std::move(name), index); }
  const std::vector<std::pair<std::string, size_t>>& aliases() const { return aliases_; }

 private:
  Arena values_, grads_;  // grads_ gets its layout in allocate(), once fixed_ is known
  std::vector<Init> inits_;
  std::vector<bool> fixed_;
  std::vector<std::pair<std::string, size_t>> aliases_;
};

}  // namespace seqforge
