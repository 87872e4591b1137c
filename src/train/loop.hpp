#pragma once
// The training loop's settings, read and checked once from the config, and its state: what it
// carries from step to step, saved with the training state for --resume and sent from rank 0
// to the other ranks.
#include <string>
#include <vector>

#include "run.hpp"
#include "seqforge/dist/communicator.hpp"
#include "seqforge/train/config.hpp"

namespace seqforge {

struct LoopSettings {
  int64_t batch_size = 0, epochs = 0;
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

struct LoopState {
  int64_t epochs_done = 0;  // complete epochs
  int64_t step = 0;         // training steps taken
  int64_t optimizer_steps = 0;
  std::vector<int64_t> param_steps;  // per parameter (frozen ones lag)
  double best = 0, plateau_best = 0, lr_factor = 1;
  int64_t since_best = 0, since_plateau = 0;
  // Stopped part-way through epoch epochs_done + 1 (a signal): its windows already shuffled,
  // `batch` batches done, their loss summed over `seen` windows.
  bool in_epoch = false;
  int64_t batch = 0;
  double loss_sum = 0, seen = 0;

  static LoopState start(const LoopSettings& s);  // before the first epoch
  std::string to_json() const;                    // reals as exact text
  static LoopState from_json(const std::string& json, const std::string& source);
  // Refuses, naming `source` and the field, a state no run could have saved: negative or
  // inconsistent counts, step counts for another number of parameters, a batch past the epoch.
  void check(const std::string& source, size_t parameters, int64_t batches_per_epoch) const;
  // Rank 0's state to every rank; the batches' loss sums stay rank 0's alone.
  void broadcast(dist::Communicator& comm);
};

}  // namespace seqforge
