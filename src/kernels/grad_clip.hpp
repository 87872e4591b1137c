#pragma once
// The factor an optimizer step multiplies the gradients by, decided from their sum of squares
// where the gradients are (GradClip in ops.hpp): shared by the host kernels and the CUDA kernels,
// so that no value travels to the host inside a step.
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

}  // namespace seqforge::ref
