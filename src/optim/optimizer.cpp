#include "seqforge/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace seqforge {

Optimizer::Optimizer(Backend& be, Parameters& params, const OptimizerOptions& options)
    : be_(be), params_(params), opt_(options) {
  if (opt_.kind != "adam" && opt_.kind != "adamw" && opt_.kind != "sgd")
    fail("optim.kind: unknown optimizer '", opt_.kind, "' (expected adam, adamw or sgd)");
  // PyTorch takes an infinite rate or epsilon; here it is a mistyped config.
  const auto finite_non_negative = [](const char* key, double v) {
    if (!(v >= 0 && std::isfinite(v))) fail(key, ": must be a finite number >= 0, got ", v);
  };
  finite_non_negative("optim.lr", opt_.lr);
  finite_non_negative("optim.weight_decay", opt_.weight_decay);
  if (opt_.kind == "sgd") {
    finite_non_negative("optim.momentum", opt_.momentum);
    if (!std::isfinite(opt_.dampening))
      fail("optim.dampening: must be finite, got ", opt_.dampening);
    if (opt_.nesterov && opt_.momentum <= 0)
      fail("optim.nesterov: needs optim.momentum > 0, got ", opt_.momentum);
    if (opt_.nesterov && opt_.dampening != 0)
      fail("optim.nesterov: needs dampening 0, got ", opt_.dampening);
  } else {
    if (!(opt_.beta1 >= 0 && opt_.beta1 < 1)) fail("optim.beta1: outside [0, 1): ", opt_.beta1);
    if (!(opt_.beta2 >= 0 && opt_.beta2 < 1)) fail("optim.beta2: outside [0, 1): ", opt_.beta2);
    finite_non_negative("optim.eps", opt_.eps);
  }
  if (!params.values().allocated())
    fail(
        "optimizer: the model's parameters are not allocated: initialize the model first (also "
        "before loading a checkpoint into it)");
  // Laid out as the gradients: nothing for a fixed parameter.
  m_ = params.grads().like(be);
  if (opt_.kind != "sgd") v_ = params.grads().like(be);
  param_steps_.assign(params.size(), 0);
  build_segments();
}

void Optimizer::set_frozen(std::vector<bool> frozen) {
  SF_CHECK(frozen.size() == params_.size(), "frozen flags for ", frozen.size(), " of ",
           params_.size(), " parameters");
  frozen_ = std::move(frozen);
  build_segments();
}

bool Optimizer::decays(size_t i) const {
  return !opt_.decay_matrices_only || params_.value(i).shape().rank() >= 2;
}

void Optimizer::set_steps(int64_t steps, std::vector<int64_t> param_steps) {
  SF_CHECK(param_steps.size() == params_.size(), "step counts for ", param_steps.size(), " of ",
           params_.size(), " parameters");
  steps_ = steps;
  param_steps_ = std::move(param_steps);
  build_segments();
}

// Runs of parameters that move together (the same flags and update count, laid out alike in the
// values and the gradients) form one segment: a model without groups is one pass over the arenas,
// whose padding between parameters is zero and stays zero.
void Optimizer::build_segments() {
  std::vector<OptimizerSegment> segments;
  std::vector<int64_t> steps;
  const auto& values = params_.values().entries();
  const auto& grads = params_.grads().entries();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_.fixed(i)) continue;
    OptimizerSegment seg;
    seg.value_offset = static_cast<int64_t>(values[i].offset);
    seg.grad_offset = static_cast<int64_t>(grads[i].offset);
    seg.numel = values[i].shape.numel();
    seg.flags =
        (frozen(i) ? OptimizerSegment::kFrozen : 0) | (decays(i) ? OptimizerSegment::kDecays : 0);
    if (!segments.empty()) {
      OptimizerSegment& last = segments.back();
      const bool joins = last.flags == seg.flags && steps.back() == param_steps_[i] &&
                         seg.value_offset - last.value_offset == seg.grad_offset - last.grad_offset;
      if (joins) {
        last.numel = seg.grad_offset + seg.numel - last.grad_offset;
        continue;
      }
    }
    segments.push_back(seg);
    steps.push_back(param_steps_[i]);
  }
  const auto S = static_cast<int64_t>(segments.size());
  segment_count_ = S;
  static_assert(sizeof(OptimizerSegment) == 4 * sizeof(int64_t));
  if (S) {
    be_.upload(segments_.get(be_, DType::i64, {S, 4}), segments.data());
    be_.upload(segment_steps_.get(be_, DType::i64, {S}), steps.data());
  }
}

bool Optimizer::frozen(size_t i) const { return !frozen_.empty() && frozen_[i]; }

void Optimizer::zero_frozen_grads() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (frozen(i) && !params_.fixed(i)) be_.fill(params_.grad(i), 0.0);
}

void Optimizer::count_step() {
  before_steps_ = steps_;
  before_param_steps_ = param_steps_;
  ++steps_;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_.fixed(i) && !frozen(i)) ++param_steps_[i];
}

void Optimizer::set_lr(double lr) {
  opt_.lr = lr;
  upload_lr();
}

void Optimizer::upload_lr() {
  if (opt_.lr == uploaded_lr_) return;
  be_.upload(lr_.get(be_, DType::f64, {1}), &opt_.lr);
  uploaded_lr_ = opt_.lr;
}

void Optimizer::step(double grad_scale, bool zero_grads, const GradClip& clip) {
  count_step();
  upload_lr();
  OptimizerStep a;
  a.kind = opt_.kind == "sgd"    ? OptimizerKind::sgd
           : opt_.kind == "adam" ? OptimizerKind::adam
                                 : OptimizerKind::adamw;
  a.beta1 = opt_.beta1;
  a.beta2 = opt_.beta2;
  a.eps = opt_.eps;
  a.momentum = opt_.momentum;
  a.dampening = opt_.dampening;
  a.nesterov = opt_.nesterov;
  a.weight_decay = opt_.weight_decay;
  a.grad_scale = grad_scale;
  a.clip = clip;
  a.zero_grads = zero_grads;
  a.params = params_.values().flat().data();
  a.grads = params_.grads().flat().data();
  a.m = m_.flat().data();
  a.v = v_.allocated() ? v_.flat().data() : nullptr;
  a.grad_elements = static_cast<int64_t>(params_.grads().elements());
  a.segments = static_cast<const OptimizerSegment*>(segments_.tensor().data());
  a.segment_count = segment_count_;
  a.steps = static_cast<int64_t*>(segment_steps_.tensor().data());
  a.lr = static_cast<const double*>(lr_.tensor().data());
  be_.optimizer_step(a, params_.dtype());
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
  optimizer.zero_frozen_grads();
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
