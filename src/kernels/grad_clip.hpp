#pragma once
// Scalar rules shared by the host kernels and the CUDA kernels: the factor an optimizer step
// multiplies the gradients by, decided from their sum of squares where the gradients are
// (GradClip in ops.hpp, so that no value travels to the host inside a step), and a regression
// loss's term.
#include <math.h>

#include "kernels/counter_hash.hpp"  // SF_HOST_DEVICE
#include "seqforge/backend/ops.hpp"

namespace seqforge::ref {

// grad_scale times the unscaling and clipping factor min(1, max_norm / (norm + 1e-6)) /
// loss_scale, the norm that of the unscaled gradients; *skip when the norm is inf or NaN and the
// step must then be skipped (loss scaling).
SF_HOST_DEVICE inline double gradient_factor(double grad_scale, const GradClip& c, bool* skip) {
  *skip = false;
  if (!c.sum_squares) return grad_scale;
  const double norm = sqrt(*c.sum_squares) / c.loss_scale;
  *skip = c.skip_nonfinite && !(norm - norm == 0);  // inf - inf and NaN are NaN
  double coef = 1.0;
  if (c.max_norm > 0) {
    const double bound = c.max_norm / (norm + 1e-6);
    coef = bound < coef ? bound : coef;  // as std::min(1.0, bound): NaN keeps 1
  }
  return grad_scale * coef / c.loss_scale;
}

// One error d = pred - target of a regression loss: its term and the term's derivative.
SF_HOST_DEVICE inline void regression_term(const RegressionLoss& l, double d, double* value,
                                           double* grad) {
  const double a = d < 0 ? -d : d;
  switch (l.kind) {
    case LossKind::mae:
      *value = a;
      *grad = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
      return;
    case LossKind::huber:
      *value = a < l.delta ? 0.5 * d * d : l.delta * (a - 0.5 * l.delta);
      *grad = a < l.delta ? d : d > 0 ? l.delta : -l.delta;
      return;
    default:
      *value = d * d;
      *grad = 2.0 * d;
  }
}

}  // namespace seqforge::ref
