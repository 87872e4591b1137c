#pragma once
// A regression loss's term (RegressionLoss in ops.hpp), shared by the reference kernel and the
// CUDA kernel so that both compute it alike.
#include "kernels/counter_hash.hpp"  // SF_HOST_DEVICE
#include "seqforge/backend/ops.hpp"

namespace seqforge::ref {

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
