#pragma once
// The training loop's state: what it carries from step to step, saved with the training state
// for --resume (and checked when read back) and sent from rank 0 to the other ranks.
#include <cstdint>
#include <string>
#include <vector>

#include "seqforge/dist/communicator.hpp"

namespace seqforge {

struct LoopState {
  int64_t epochs_done = 0;  // complete epochs
  int64_t step = 0;         // training steps taken
  int64_t optimizer_steps = 0;
  std::vector<int64_t> param_steps;  // per parameter (frozen ones lag)
  double best = 0, plateau_best = 0, lr_factor = 1;
  int64_t since_best = 0, since_plateau = 0;
  // fp16's dynamic loss scale and its count of clean steps since it last changed; 0: no scaler.
  double loss_scale = 0;
  int64_t loss_scale_growth = 0;
  // Stopped part-way through epoch epochs_done + 1 (a signal): its windows already shuffled,
  // `batch` batches done, their loss summed over `seen` windows.
  bool in_epoch = false;
  int64_t batch = 0;
  double loss_sum = 0, seen = 0;
  // The windows a batch took then, over all ranks (0: not saved), which `batch` counts in.
  int64_t batch_windows = 0;
  // Of the epoch's batches done, those whose step was skipped (fp16's inf or NaN gradients).
  int64_t skipped_steps = 0;

  static LoopState start(const std::string& mode);  // before the first epoch; mode min | max
  std::string to_json() const;                      // reals as exact text
  static LoopState from_json(const std::string& json, const std::string& source);
  // Refuses, naming `source` and the field, a state no run could have saved: negative or
  // inconsistent counts, step counts for another number of parameters, a batch past the epoch.
  void check(const std::string& source, size_t parameters, int64_t batches_per_epoch) const;
  // Rank 0's state to every rank; the batches' loss sums stay rank 0's alone.
  void broadcast(dist::Communicator& comm);
};

}  // namespace seqforge
