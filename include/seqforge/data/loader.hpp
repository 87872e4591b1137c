#pragma once
// The batch loader: persistent worker threads assemble batches ahead of the training loop into
// a bounded ring of reused buffers. Every batch's random draws (masks, augmentations) come from
// a seed derived from the pass's seed and the batch's index, so batches are identical for any
// number of workers.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/data/augment.hpp"
#include "seqforge/data/datasets.hpp"

namespace seqforge {

// One batch, in buffers allocated once and reused.
struct Batch {
  int64_t size = 0;
  Tensor input;   // (B, T, F) f32 windows, or (B, T) i64 character ids (charlm, text_classify)
  Tensor target;  // forecast: (B, O) f32; mae: (B*T, F) f32, the windows before masking
  Tensor labels;  // classify, text_classify: (B) i64 class ids; charlm: (B*T) i64 next ids
  Tensor mask;    // mae: (B*T) f32, 1 where a time step is masked
  // text_classify: (B) i64 each example's characters (the rest of its row of `input` is
  // padding; T is the batch's longest), (B, T) i64 each character's segment.
  Tensor lengths, segments;
  StagedBuffer input_buf, target_buf, labels_buf, mask_buf, lengths_buf, segments_buf;
};

// What shapes a batch beyond its windows: augmentations (training only) and their cache.
struct BatchRecipe {
  const AugmentOptions* augment = nullptr;  // null: no augmentation
  const AugmentCache* cache = nullptr;      // with augment: windows come from the cache
  // mae: the masked steps of the window at `start` are drawn from mix_seed(mask_seed, start), so
  // that a window's mask does not depend on the batch it lands in (its size, its rank). Training
  // gives each epoch's seed; evaluation 0, the same masks every time.
  uint64_t mask_seed = 0;
};

// Assembles windows starts[begin, end) into `b`; `rng` draws augmentations.
void assemble_batch(Backend& backend, const Dataset& data, const std::vector<int64_t>& starts,
                    size_t begin, size_t end, const BatchRecipe& recipe, Rng& rng, Batch* b);

// Examples [first, end) of `b`: views of its tensors, without its host staging. Each tensor's
// outer dimension holds b.size examples of equal rows (B, B*T, (B, T, F), ...).
Batch batch_rows(const Batch& b, int64_t first, int64_t end);

struct LoaderOptions {
  int workers = 1;          // 0: batches are assembled on the calling thread, when asked for
  int prefetch_factor = 2;  // batches assembled ahead, per worker
  std::string reason;       // why this many workers
};

// The workers asked for (a count, or -1 for auto) and the batches each prefetches. Auto takes a
// quarter of the cores (at least one worker), fewer when the prefetched batches would take more
// than an eighth of the available memory (long sequences, big batches).
LoaderOptions loader_options(int workers, int prefetch_factor, int64_t batch_bytes);

class Loader {
 public:
  Loader(Backend& backend, const Dataset& data, int64_t batch_size, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Begins a pass of `batches` batches over `starts` (copied) at batch `first` (a pass resumed
  // part-way gets the batches it would have had); ends any pass still under way. `seed` keys the
  // batches' random draws.
  void start(const std::vector<int64_t>& starts, int64_t batches, const BatchRecipe& recipe,
             uint64_t seed, int64_t first = 0);
  // The pass's next batch, valid until the next call; waits while it is being assembled.
  // Rethrows an error met while assembling it (a data file that changed, say).
  const Batch& next();
  // Seconds next() spent waiting (or assembling, without workers) in this pass.
  double wait_seconds() const;
  const LoaderOptions& options() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace seqforge
