#pragma once
// Optimizers over the flat parameter arena: Adam, AdamW, SGD (momentum, Nesterov), with
// PyTorch's exact update rules; clip_grad_norm over all gradients.
#include <limits>
#include <string>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/nn/parameters.hpp"

namespace seqforge {

struct OptimizerOptions {
  std::string kind = "adamw";  // adam | adamw | sgd
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 1e-2;        // AdamW: decoupled; Adam and SGD: L2 added to the gradient
  bool decay_matrices_only = false;  // nanoGPT's groups: no decay on biases and norm parameters
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
};

class Optimizer {
 public:
  // Throws seqforge::Error naming the bad option (e.g. "optim.kind", "optim.lr").
  Optimizer(Backend& be, Parameters& params, const OptimizerOptions& options);
  // One update from the current gradients, first multiplied by grad_scale (and by what `clip`
  // decides where the gradients are: fused_step). With zero_grads the same pass leaves the
  // gradients zeroed for the next accumulation (no separate zero_grad).
  void step(double grad_scale = 1.0, bool zero_grads = false, const GradClip& clip = {});
  // Takes back the step counts of the last step(), whose update the backend skipped (an
  // overflowed fp16 step).
  void undo_step_counts();
  int64_t steps() const { return steps_; }
  // Frozen parameters (by index) are not updated; their gradients are still zeroed (fixed ones
  // have neither gradients nor state). Each
  // parameter counts its own updates (Adam's bias correction, SGD's first momentum step), as
  // PyTorch does for parameters that start training late.
  void set_frozen(std::vector<bool> frozen);
  // Zeroes the frozen parameters' gradients, so that the step's norm (and clipping) counts only
  // what trains, as PyTorch's clip_grad_norm_ counts only parameters that have gradients.
  void zero_frozen_grads();
  const std::vector<int64_t>& param_steps() const { return param_steps_; }
  void set_steps(int64_t steps, std::vector<int64_t> param_steps);  // when resuming
  // The update's segments (OptimizerStep), runs of parameters that step together.
  int64_t segment_count() const { return segment_count_; }
  // The learning rate of the next steps, in backend memory at once (not inside a step).
  void set_lr(double lr);
  // The host's update counts of a step the backend ran without step(): a replayed graph of it.
  void count_step();
  const OptimizerOptions& options() const { return opt_; }
  Arena& state(int i) { return i == 0 ? m_ : v_; }  // Adam: exp_avg, exp_avg_sq; SGD: momentum

 private:
  bool decays(size_t i) const;  // whether weight decay applies to parameter i
  bool frozen(size_t i) const;
  void build_segments();  // and uploads them with their update counts
  void upload_lr();       // when it changed

  Backend& be_;
  Parameters& params_;
  OptimizerOptions opt_;
  Arena m_, v_;
  int64_t steps_ = 0, before_steps_ = 0;
  std::vector<int64_t> before_param_steps_;
  std::vector<bool> frozen_;
  std::vector<int64_t> param_steps_;
  // The update's description in backend memory (OptimizerStep): segments, their update counts
  // (which the backend advances), the learning rate.
  Buffer segments_, segment_steps_, lr_;
  int64_t segment_count_ = 0;
  double uploaded_lr_ = std::numeric_limits<double>::quiet_NaN();
};

// Scales gradients so that their total L2 norm is at most max_norm (coefficient
// min(1, max_norm / (total + 1e-6))). Returns the total norm before clipping.
double clip_grad_norm(Backend& be, Parameters& params, double max_norm);

// Dynamic loss scaling with torch.cuda.amp.GradScaler's semantics: the loss (its gradient) is
// multiplied by scale(); after backward, gradients with an inf or NaN skip the step and multiply
// the scale by backoff_factor; growth_interval clean steps in a row multiply it by growth_factor.
struct LossScalerOptions {
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});
  double scale() const { return scale_; }
  // Records one step's outcome; returns whether the optimizer step may run (no inf/NaN).
  bool update(bool found_inf);
  int64_t growth_tracker() const { return growth_tracker_; }
  void set_state(double scale, int64_t growth_tracker);

 private:
  LossScalerOptions opt_;
  double scale_;
  int64_t growth_tracker_ = 0;
};

// What one optimizer update did.
struct StepReport {
  bool applied = false;   // false: skipped for inf/NaN gradients
  double grad_norm = 0;   // total L2 norm of the unscaled gradients (inf/NaN when skipped)
  double clip_coef = 1;   // min(1, max_norm / (grad_norm + 1e-6)), 1 without clipping
  double loss_scale = 1;  // the scale the gradients carried
};

// The fused update, decided where the gradients are (no read-back): one pass for their sum of
// squares into `sum_squares` (one f64 in the backend's memory), one pass that unscales, clips,
// steps and zeroes them, or, with a scaler and an inf or NaN norm, only zeroes them. max_norm <= 0:
// no clipping. scaler may be null (no loss scaling: inf/NaN gradients are then applied as
// PyTorch would). Then finish_step with the sum of squares once it is read back.
void fused_step(Backend& be, Parameters& params, Optimizer& optimizer, double max_norm,
                const LossScaler* scaler, Tensor sum_squares);
// What the step did, from its sum of squares: updates the scaler (GradScaler's update()), and
// takes back the optimizer's step counts of a skipped step.
StepReport finish_step(double sum_squares, double max_norm, LossScaler* scaler,
                       Optimizer& optimizer);
// Both, reading the sum of squares back in between.
StepReport fused_step(Backend& be, Parameters& params, Optimizer& optimizer, double max_norm,
                      LossScaler* scaler);

}  // namespace seqforge
