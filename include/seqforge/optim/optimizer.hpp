#pragma once
// Optimizers over the flat parameter arena: Adam, AdamW, SGD (momentum, Nesterov), with
// PyTorch's exact update rules; clip_grad_norm over all gradients.
#include <string>

#include "seqforge/backend/backend.hpp"
#include "seqforge/nn/parameters.hpp"

namespace seqforge {

struct OptimizerOptions {
  std::string kind = "adamw";  // adam | adamw | sgd
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 1e-2;  // AdamW: decoupled; Adam and SGD: L2 added to the gradient
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
};

class Optimizer {
 public:
  // Throws seqforge::Error naming the bad option (e.g. "optim.kind", "optim.lr").
  Optimizer(Backend& be, Parameters& params, const OptimizerOptions& options);
  // One update from the current gradients, first multiplied by grad_scale.
  void step(double grad_scale = 1.0);
  int64_t steps() const { return steps_; }
  void set_lr(double lr) { opt_.lr = lr; }
  const OptimizerOptions& options() const { return opt_; }
  Arena& state(int i) { return i == 0 ? m_ : v_; }  // Adam: exp_avg, exp_avg_sq; SGD: momentum

 private:
  Backend& be_;
  Parameters& params_;
  OptimizerOptions opt_;
  Arena m_, v_;
  int64_t steps_ = 0;
};

// Scales gradients so that their total L2 norm is at most max_norm (coefficient
// min(1, max_norm / (total + 1e-6))). Returns the total norm before clipping.
double clip_grad_norm(Backend& be, Parameters& params, double max_norm);

}  // namespace seqforge
