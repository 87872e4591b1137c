#pragma once
// The first training step on a device (a GPU) against the same step on the CPU: the same
// parameters, rows of the batch and dropout masks, forward and backward on both, the loss and
// every parameter's gradient compared. The CPU's kernels are the ones held to PyTorch; so a
// defect that only a real GPU shows in any of the device's ops, or in how the model drives them
// there, is reported before it trains a wrong model silently.
#include <cstdint>
#include <string>

#include "run.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/data/loader.hpp"
#include "seqforge/nn/model.hpp"

namespace seqforge {

struct DeviceCheck {
  bool ran = false;     // false: the step is too large to repeat on the CPU, or cannot be
  bool agrees = true;   // the loss and every gradient within `bound`
  std::string summary;  // what was compared, the worst difference and where
  double worst = 0, bound = 0;
};

// Runs `model`'s forward and backward on rows of `batch` (at most `max_rows`, the step's
// micro-batch) on `device` and on a copy of the model on the CPU (gradients summed into `model`'s
// are zeroed again), with `seed_base` (device memory, the dropout masks' base) set to the same
// value on both. `gemm` is the device's GEMM dtype, `reduced` whether its f32 GEMMs round their
// products (TF32), `loss_scale` what the loss's gradient is scaled by (fp16). The copy is not made
// where its parameters and gradients would take more than a quarter of `host_bytes`.
struct DeviceCheckSettings {
  DType gemm = DType::f32;
  bool reduced = false;
  double loss_scale = 1.0;
  int64_t max_rows = 0;
  double host_bytes = 0;
};
DeviceCheck check_step_on_cpu(Model& model, Backend& device, const Task& task,
                              const DeviceCheckSettings& settings, const Batch& batch,
                              Tensor seed_base);

}  // namespace seqforge
