#pragma once
// A regression loss's term (RegressionLoss in ops.hpp), shared by the reference kernel and the
// CUDA kernel so that both compute it alike.
#include "kernels/counter_hash.hpp"  // SF_HOST_DEVICE
#include "seqforge/backend/ops.hpp"

namespace seqforge::ref {

// One error d = pred - target of a regression loss, value `column` of its row: its term and the
// term's derivative. The pinball loss's derivative at d = 0 is the mean of its two slopes, as
// torch.maximum's gradient splits between equal arguments.
SF_HOST_DEVICE inline void regression_term(const RegressionLoss& l, double d, int64_t column,
                                           double* value, double* grad) {
  const double a = d < 0 ? -d : d;
  switch (l.kind) {
    case LossKind::quantile: {
      const double q = l.quantiles[column % l.num_quantiles];
      *value = d < 0 ? -q * d : (1 - q) * d;
      *grad = d < 0 ? -q : d > 0 ? 1 - q : 0.5 - q;
      return;
    }
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
