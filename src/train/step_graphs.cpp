#include "step_graphs.hpp"

#include <utility>

#include "seqforge/core/error.hpp"

namespace seqforge {

StepGraphs::StepGraphs(Backend& be, Hooks hooks) : be_(be), hooks_(std::move(hooks)) {
  SF_CHECK(be_.captures(), "the ", be_.name(), " backend records no op sequences");
}

const Batch& StepGraphs::stage(const Batch& batch) {
  auto copy = [&](Buffer& into, Tensor from) {
    if (from.empty()) return Tensor();
    Tensor t = into.get(be_, from.dtype(), from.shape());
    be_.copy(t, from);
    return t;
  };
  staged_.size = batch.size;
  staged_.input = copy(input_, batch.input);
  staged_.target = copy(target_, batch.target);
  staged_.labels = copy(labels_, batch.labels);
  staged_.mask = copy(mask_, batch.mask);
  staged_.lengths = copy(lengths_, batch.lengths);
  staged_.segments = copy(segments_, batch.segments);
  return staged_;
}

std::vector<Shape> StepGraphs::shapes(const Batch& b) const {
  return {b.input.shape(), b.target.shape(),  b.labels.shape(),
          b.mask.shape(),  b.lengths.shape(), b.segments.shape()};
}

void StepGraphs::turn_off(std::string reason) {
  on_ = false;
  off_reason_ = std::move(reason);
  graph_.reset();
}

void StepGraphs::step(const Batch& batch) {
  if (!on_) return hooks_.enqueue(batch);
  const Batch& b = stage(batch);
  const std::vector<Shape> now = shapes(b);
  if (graph_ && now == graph_shapes_ && be_.memory_epoch() == graph_epoch_ &&
      hooks_.host_key() == graph_key_) {
    hooks_.replayed();
    graph_->replay();
    ++replayed_steps_;
    return;
  }
  graph_.reset();
  // Eager until the warm-up is done, and for a step after anything changed: it makes whatever
  // buffers the step needs, which a capture may not.
  const int64_t warmup = captures_ == 0 ? kWarmupSteps : 1;
  if (eager_steps_ < warmup) {
    hooks_.enqueue(b);
    ++eager_steps_;
    return;
  }
  hooks_.save();
  be_.begin_capture();
  try {
    hooks_.enqueue(b);
    graph_ = be_.end_capture();
  } catch (const Error& e) {
    be_.abort_capture();
    hooks_.restore();
    turn_off(std::string("the step could not be captured (") + e.what() + "): it runs eagerly");
    return hooks_.enqueue(b);
  } catch (...) {  // not a capture's problem: the step's own, which the caller handles
    be_.abort_capture();
    hooks_.restore();
    throw;
  }
  ++captures_;
  eager_steps_ = 0;
  graph_shapes_ = now;
  graph_epoch_ = be_.memory_epoch();
  graph_key_ = hooks_.host_key();
  graph_->replay();
  ++replayed_steps_;
}

}  // namespace seqforge
