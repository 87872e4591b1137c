#include "seqforge/optim/optimizer.hpp"

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
  m_ = params.values().like(be);
  if (opt_.kind != "sgd") v_ = params.values().like(be);
}

void Optimizer::step(double grad_scale) {
  ++steps_;
  Tensor p = params_.values().flat(), g = params_.grads().flat();
  if (opt_.kind == "sgd") {
    SgdParams s{.lr = opt_.lr,
                .momentum = opt_.momentum,
                .dampening = opt_.dampening,
                .weight_decay = opt_.weight_decay,
                .nesterov = opt_.nesterov,
                .first_step = steps_ == 1,
                .grad_scale = grad_scale};
    be_.sgd_step(p, g, m_.flat(), s);
  } else {
    AdamParams a{.lr = opt_.lr,
                 .beta1 = opt_.beta1,
                 .beta2 = opt_.beta2,
                 .eps = opt_.eps,
                 .weight_decay = opt_.weight_decay,
                 .decoupled = opt_.kind == "adamw",
                 .step = steps_,
                 .grad_scale = grad_scale};
    be_.adam_step(p, g, m_.flat(), v_.flat(), a);
  }
}

double clip_grad_norm(Backend& be, Parameters& params, double max_norm) {
  const double total = std::sqrt(be.sum_squares(params.grads().flat()));
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) be.scale(params.grads().flat(), coef);
  return total;
}

}  // namespace seqforge
