#pragma once
// The training loop's settings, read and checked once from the config.
#include <string>
#include <vector>

#include "loop_state.hpp"
#include "run.hpp"
#include "seqforge/train/config.hpp"

namespace seqforge {

struct LoopSettings {
  int64_t batch_size = 0, epochs = 0;
  int64_t micro_batch = 0;       // rows per forward and backward: batch_size or fewer
  int64_t max_batches = 0;       // per epoch; 0: the whole split
  int64_t warmup_steps = 0;      // linear warm-up before the schedule
  std::string schedule;          // constant | step | cosine | plateau
  double gamma = 0;              // step and plateau: the factor
  int64_t step_epochs = 0;       // step: epochs per factor
  int64_t plateau_patience = 0;  // plateau: epochs without improvement per factor
  std::string monitor, mode;     // early stopping's metric; min | max
  double min_delta = 0;
  int64_t patience = 0;  // 0: no early stopping
  std::string save;      // best | last | every_n
  int64_t save_every = 1;
  double clip = 0;  // gradient norm; 0: none
  std::vector<std::string> freeze_modules;
  int64_t freeze_epochs = 0;
  double progress_seconds = 0;  // without a terminal
  bool test_after = true;
  bool stateful = false;  // states carried from batch to batch (truncated BPTT)
  double dist_timeout = 0, bucket_mb = 0;

  // Every value checked; errors name the config and key.
  static LoopSettings from(const Config& c, const Task& task);
  // Whether `value` improves on `best` by more than min_delta.
  bool improves(double value, double best) const {
    return mode == "min" ? value < best - min_delta : value > best + min_delta;
  }
};

// The learning rate of a step: linear warm-up to `base`, then the schedule (the plateau
// schedule's reductions are in lr_factor).
double learning_rate(const LoopSettings& s, double base, int64_t step, int64_t epoch,
                     int64_t total_steps, double lr_factor);

}  // namespace seqforge
