#include "seqforge/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>

namespace seqforge {

Optimizer::Optimizer(Backend& be, Parameters& params, const OptimizerOptions& options)
    : be_(be), params_(params), opt_(options) {
  if (opt_.kind != "adam" && opt_.kind != "adamw" && opt_.kind != "sgd")
    fail("optim.kind: unknown optimizer '", opt_.kind, "' (expected adam, adamw or sgd)");
  if (!(opt_.lr >= 0)) fail("optim.lr: must be >= 0, got ", opt_.lr);
  if (!(opt_.weight_decay >= 0)) fail("optim.weight_decay: must be >= 0, got ", opt_.weight_decay);
  if (opt_.kind == "sgd") {
    if (!(opt_.momentum >= 0)) fail("optim.momentum: must be >= 0, got ", opt_.momentum);
    if (opt_.nesterov && (opt_.momentum <= 0 || opt_.dampening != 0))
      fail("optim.nesterov: needs momentum > 0 and dampening 0");
  } else {
    if (!(opt_.beta1 >= 0 && opt_.beta1 < 1)) fail("optim.beta1: outside [0, 1): ", opt_.beta1);
    if (!(opt_.beta2 >= 0 && opt_.beta2 < 1)) fail("optim.beta2: outside [0, 1): ", opt_.beta2);
    if (!(opt_.eps >= 0)) fail("optim.eps: must be >= 0, got ", opt_.eps);
  }
  // Laid out as the gradients: nothing for a fixed parameter.
  m_ = params.grads().like(be);
  if (opt_.kind != "sgd") v_ = params.grads().like(be);
  for (size_t i = 0; i < params.size(); ++i) any_fixed_ = any_fixed_ || params.fixed(i);
}

void Optimizer::set_frozen(std::vector<bool> frozen) {
  SF_CHECK(frozen.size() == params_.size(), "frozen flags for ", frozen.size(), " of ",
           params_.size(), " parameters");
  frozen_ = std::move(frozen);
}

bool Optimizer::decays(size_t i) const {
  return !opt_.decay_matrices_only || params_.value(i).shape().rank() >= 2;
}

void Optimizer::set_steps(int64_t steps, std::vector<int64_t> param_steps) {
  SF_CHECK(param_steps.size() == params_.size(), "step counts for ", param_steps.size(), " of ",
           params_.size(), " parameters");
  steps_ = steps;
  param_steps_ = std::move(param_steps);
}

void Optimizer::step(double grad_scale, bool zero_grads, const GradClip& clip) {
  if (param_steps_.empty()) param_steps_.assign(params_.size(), 0);
  before_steps_ = steps_;
  before_param_steps_ = param_steps_;
  ++steps_;
  const bool all_decay = !opt_.decay_matrices_only || opt_.weight_decay == 0;
  const bool uniform = all_decay && !any_fixed_ &&
                       std::none_of(frozen_.begin(), frozen_.end(), [](bool f) { return f; }) &&
                       std::all_of(param_steps_.begin(), param_steps_.end(),
                                   [&](int64_t s) { return s == param_steps_[0]; });
  // One pass over the flat arena when every parameter moves in step; else parameter by parameter.
  auto update = [&](Tensor p, Tensor g, Tensor m, Tensor v, int64_t step, double decay) {
    if (opt_.kind == "sgd") {
      SgdParams s;
      s.lr = opt_.lr;
      s.momentum = opt_.momentum;
      s.dampening = opt_.dampening;
      s.weight_decay = decay;
      s.nesterov = opt_.nesterov;
      s.first_step = step == 1;
      s.grad_scale = grad_scale;
      s.clip = clip;
      be_.sgd_step(p, g, m, s);
      if (zero_grads) be_.fill(g, 0.0);
    } else {
      AdamParams a;
      a.lr = opt_.lr;
      a.beta1 = opt_.beta1;
      a.beta2 = opt_.beta2;
      a.eps = opt_.eps;
      a.weight_decay = decay;
      a.decoupled = opt_.kind == "adamw";
      a.step = step;
      a.grad_scale = grad_scale;
      a.clip = clip;
      a.zero_grads = zero_grads;
      be_.adam_step(p, g, m, v, a);
    }
  };
  if (uniform) {
    for (auto& s : param_steps_) ++s;
    update(params_.values().flat(), params_.grads().flat(), m_.flat(),
           opt_.kind == "sgd" ? Tensor() : v_.flat(),
           param_steps_.empty() ? steps_ : param_steps_[0], opt_.weight_decay);
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_.fixed(i)) continue;
    if (!frozen_.empty() && frozen_[i]) {
      if (zero_grads) be_.fill(params_.grad(i), 0.0);
      continue;
    }
    update(params_.value(i), params_.grad(i), m_.view(i),
           opt_.kind == "sgd" ? Tensor() : v_.view(i), ++param_steps_[i],
           decays(i) ? opt_.weight_decay : 0.0);
  }
}

void Optimizer::undo_step_counts() {
  steps_ = before_steps_;
  param_steps_ = before_param_steps_;
}

double clip_grad_norm(Backend& be, Parameters& params, double max_norm) {
  const double total = std::sqrt(be.sum_squares(params.grads().flat()));
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) be.scale(params.grads().flat(), coef);
  return total;
}

LossScaler::LossScaler(const LossScalerOptions& options)
    : opt_(options), scale_(options.init_scale) {
  if (!(opt_.init_scale > 0)) fail("loss_scale.init_scale must be > 0, got ", opt_.init_scale);
  if (!(opt_.growth_factor > 1))
    fail("loss_scale.growth_factor must be > 1, got ", opt_.growth_factor);
  if (!(opt_.backoff_factor > 0 && opt_.backoff_factor < 1))
    fail("loss_scale.backoff_factor must be in (0, 1), got ", opt_.backoff_factor);
  if (opt_.growth_interval < 1)
    fail("loss_scale.growth_interval must be >= 1, got ", opt_.growth_interval);
}

bool LossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= opt_.backoff_factor;
    growth_tracker_ = 0;
    return false;
  }
  if (++growth_tracker_ == opt_.growth_interval) {
    scale_ *= opt_.growth_factor;
    growth_tracker_ = 0;
  }
  return true;
}

void LossScaler::set_state(double scale, int64_t growth_tracker) {
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

void fused_step(Backend& be, Parameters& params, Optimizer& optimizer, double max_norm,
                const LossScaler* scaler, Tensor sum_squares) {
  be.sum_squares(params.grads().flat(), sum_squares);
  GradClip clip;
  clip.sum_squares = static_cast<const double*>(sum_squares.data());
  clip.loss_scale = scaler ? scaler->scale() : 1.0;
  clip.max_norm = max_norm;
  clip.skip_nonfinite = scaler != nullptr;
  optimizer.step(1.0, /*zero_grads=*/true, clip);
}

StepReport finish_step(double sum_squares, double max_norm, LossScaler* scaler,
                       Optimizer& optimizer) {
  StepReport r;
  r.loss_scale = scaler ? scaler->scale() : 1.0;
  r.grad_norm = std::sqrt(sum_squares) / r.loss_scale;
  if (scaler && !scaler->update(!std::isfinite(r.grad_norm))) {
    optimizer.undo_step_counts();  // as PyTorch's GradScaler, which skips optimizer.step()
    return r;
  }
  if (max_norm > 0) r.clip_coef = std::min(1.0, max_norm / (r.grad_norm + 1e-6));
  r.applied = true;
  return r;
}

StepReport fused_step(Backend& be, Parameters& params, Optimizer& optimizer, double max_norm,
                      LossScaler* scaler) {
  void* memory = be.alloc(sizeof(double));
  const Tensor sum_squares(memory, DType::f64, {1});
  double value = 0;
  try {
    fused_step(be, params, optimizer, max_norm, scaler, sum_squares);
    be.download(&value, sum_squares);
  } catch (...) {
    be.free(memory);
    throw;
  }
  be.free(memory);
  return finish_step(value, max_norm, scaler, optimizer);
}

}  // namespace seqforge
