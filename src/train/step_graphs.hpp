#pragma once
// Training steps replayed as one recorded graph (train.cuda_graphs: auto, on a backend that
// captures: CUDA graphs). After warm-up steps, one step's ops are captured, and every later step
// whose batch has the captured shapes replays them, while the backend's memory is as it was at the
// capture (no buffer allocated or freed since) and the host values the capture baked in are
// unchanged (the loss scale). Any other step runs eagerly, and the next one is captured again. A
// step that cannot be captured turns replay off for the run, with one note. (Dropout draws from a
// seed base in device memory: Backend::set_seed_base.)
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/data/loader.hpp"

namespace seqforge {

class StepGraphs {
 public:
  struct Hooks {
    std::function<void(const Batch&)> enqueue;  // the step's ops for a batch
    // The host values a captured step bakes in (the loss scale): a replay's must be the capture's.
    // The masks' seeds are among them, so a step must draw the same ones every time (its masks
    // change through the backend's seed base).
    std::function<std::string()> host_key;
    // The host's bookkeeping of a step the graph ran (the optimizer's update counts).
    std::function<void()> replayed;
    // Host state a failed capture must not leave changed: saved before, put back after.
    std::function<void()> save, restore;
  };
  static constexpr int kWarmupSteps = 5;  // eager steps first: the autotuner settles in them

  StepGraphs(Backend& be, Hooks hooks);
  // One step for `batch`: replayed, captured and replayed, or eager.
  void step(const Batch& batch);
  // Drops the graph: the next steps run eagerly and capture again (what trains changed).
  void invalidate() { graph_.reset(); }
  bool on() const { return on_; }
  // Why replay turned off ("" while it is on); said once by the caller.
  const std::string& off_reason() const { return off_reason_; }
  int64_t replayed_steps() const { return replayed_steps_; }
  int64_t captures() const { return captures_; }

 private:
  // The batch copied into buffers of fixed addresses, which the captured ops read.
  const Batch& stage(const Batch& batch);
  std::vector<Shape> shapes(const Batch& b) const;
  void turn_off(std::string reason);

  Backend& be_;
  Hooks hooks_;
  bool on_ = true;
  std::string off_reason_;
  Batch staged_;
  Buffer input_, target_, labels_, mask_, lengths_, segments_;
  std::unique_ptr<StepGraph> graph_;
  std::vector<Shape> graph_shapes_;
  uint64_t graph_epoch_ = 0;
  std::string graph_key_;
  int64_t eager_steps_ = 0;  // since the last change
  int64_t replayed_steps_ = 0, captures_ = 0;
};

}  // namespace seqforge
