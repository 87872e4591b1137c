#include "seqforge/data/loader.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <fstream>
#include <mutex>
#include <thread>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/core/threads.hpp"

namespace seqforge {

Batch batch_rows(const Batch& b, int64_t first, int64_t end) {
  SF_CHECK(0 <= first && first < end && end <= b.size, "examples [", first, ", ", end,
           ") of a batch of ", b.size);
  const auto rows = [&](Tensor t) {
    if (t.empty()) return t;
    const int64_t per = t.dim(0) / b.size;
    SF_CHECK(per * b.size == t.dim(0), "a batch of ", b.size, " with a tensor of ", t.dim(0),
             " rows");
    return t.slice(first * per, end * per);
  };
  Batch part;
  part.size = end - first;
  part.input = rows(b.input);
  part.target = rows(b.target);
  part.labels = rows(b.labels);
  part.mask = rows(b.mask);
  part.lengths = rows(b.lengths);
  part.segments = rows(b.segments);
  return part;
}

void assemble_batch(Backend& be, const Dataset& d, const std::vector<int64_t>& starts, size_t begin,
                    size_t end, const BatchRecipe& recipe, Rng& rng, Batch* b) {
  SF_PROFILE_SCOPE("batch assembly");
  const int64_t B = static_cast<int64_t>(end - begin);
  b->size = B;
  if (d.is_lm()) {
    const int64_t T = d.text.seq_len;
    b->input = b->input_buf.get(be, DType::i64, {B, T});
    b->labels = b->labels_buf.get(be, DType::i64, {B * T});
    auto* ids = b->input_buf.host<int64_t>();
    auto* next = b->labels_buf.host<int64_t>();
    for (int64_t i = 0; i < B; ++i) {
      const int64_t s = starts[begin + i];
      std::copy_n(d.text.ids.begin() + s, T, ids + i * T);
      std::copy_n(d.text.ids.begin() + s + 1, T, next + i * T);
    }
    b->input_buf.upload();
    b->labels_buf.upload();
    return;
  }
  if (d.kind == TaskKind::text_classify) {
    const TextData& t = d.text;
    int64_t T = 1;  // the batch's longest example
    for (int64_t i = 0; i < B; ++i) {
      const int64_t e = starts[begin + i];
      T = std::max(T, t.offsets[e + 1] - t.offsets[e]);
    }
    b->input = b->input_buf.get(be, DType::i64, {B, T});
    b->segments = b->segments_buf.get(be, DType::i64, {B, T});
    b->lengths = b->lengths_buf.get(be, DType::i64, {B});
    b->labels = b->labels_buf.get(be, DType::i64, {B});
    auto* ids = b->input_buf.host<int64_t>();
    auto* seg = b->segments_buf.host<int64_t>();
    auto* len = b->lengths_buf.host<int64_t>();
    auto* cls = b->labels_buf.host<int64_t>();
    std::fill_n(ids, B * T, 0);
    std::fill_n(seg, B * T, 0);
    for (int64_t i = 0; i < B; ++i) {
      const int64_t e = starts[begin + i], first = t.offsets[e], n = t.offsets[e + 1] - first;
      std::copy_n(t.ids.begin() + first, n, ids + i * T);
      if (t.segments > 0) std::fill(seg + i * T + t.first_lengths[e], seg + i * T + n, 1);
      len[i] = n;
      cls[i] = t.classes[e] >= 0 ? t.classes[e] : -100;  // -100: ignored by the loss (predict)
    }
    for (StagedBuffer* s : {&b->input_buf, &b->segments_buf, &b->lengths_buf, &b->labels_buf})
      s->upload();
    return;
  }
  const SeriesData& s = d.series;
  const int64_t T = s.lookback, F = s.num_features();
  b->input = b->input_buf.get(be, DType::f32, {B, T, F});
  auto* x = b->input_buf.host<float>();
  const std::vector<char> augmented = recipe.augment ? augmented_features(s) : std::vector<char>();
  for (int64_t i = 0; i < B; ++i) {
    float* w = x + i * T * F;
    const int64_t start = starts[begin + i];
    if (recipe.augment && recipe.cache) {
      const auto version = static_cast<int64_t>(rng.next() % recipe.cache->versions());
      std::copy_n(recipe.cache->window(start, version), T * F, w);
    } else {
      s.copy_window(start, w);
      if (recipe.augment) augment_window(*recipe.augment, s, augmented, start, w, rng);
    }
  }
  if (d.kind == TaskKind::mae) {
    // Mask a share of each window's steps (at least one): all their inputs zero in, the file's
    // features out (the derived ones, dates' phases or missing indicators, are no values to
    // learn). With data.missing mask only steps that hold every feature: a missing cell is no
    // value to reconstruct.
    const int64_t O = s.file_features;
    b->target = b->target_buf.get(be, DType::f32, {B * T, O});
    b->mask = b->mask_buf.get(be, DType::f32, {B * T});
    auto* y = b->target_buf.host<float>();
    auto* mask = b->mask_buf.host<float>();
    for (int64_t r = 0; r < B * T; ++r) std::copy_n(x + r * F, O, y + r * O);
    std::fill_n(mask, B * T, 0.0f);
    std::vector<int64_t> eligible;
    for (int64_t i = 0; i < B; ++i) {
      const int64_t start = starts[begin + i];
      Rng draw(mix_seed(recipe.mask_seed, static_cast<uint64_t>(start)));
      eligible.clear();
      bool any = false;
      for (int64_t u = 0; u < T; ++u) {
        const bool drawn = draw.uniform() < d.mask_ratio;
        if (s.masks_missing && !s.row_complete(start + u)) continue;
        eligible.push_back(u);
        any |= (mask[i * T + u] = drawn) != 0;
      }
      SF_CHECK(!eligible.empty(), "mae window ", start, " holds no complete step");
      if (!any) mask[i * T + eligible[draw.next() % static_cast<uint64_t>(eligible.size())]] = 1.0f;
      for (int64_t u = 0; u < T; ++u)
        if (mask[i * T + u] != 0.0f) std::fill_n(x + (i * T + u) * F, F, 0.0f);
    }
    b->target_buf.upload();
    b->mask_buf.upload();
  } else if (d.kind == TaskKind::forecast) {
    const int64_t O = s.num_outputs(), rows = s.output_rows();  // (B * rows, O)
    b->target = b->target_buf.get(be, DType::f32, {B * rows, O});
    auto* y = b->target_buf.host<float>();
    for (int64_t i = 0; i < B; ++i) s.copy_target(starts[begin + i], y + i * rows * O);
    b->target_buf.upload();
  } else {
    b->labels = b->labels_buf.get(be, DType::i64, {B});
    auto* labels = b->labels_buf.host<int64_t>();
    for (int64_t i = 0; i < B; ++i) labels[i] = s.classes[s.target_row(starts[begin + i])];
    b->labels_buf.upload();
  }
  b->input_buf.upload();
}

LoaderOptions loader_options(int workers, int prefetch_factor, int64_t batch_bytes) {
  LoaderOptions o;
  o.prefetch_factor = prefetch_factor;
  if (workers >= 0) {
    o.workers = workers;
    o.reason = "data.num_workers";
    return o;
  }
  const int cores = usable_cpus();
  o.workers = std::clamp((cores + 3) / 4, 1, 8);
  const int64_t budget = available_memory_bytes() / 8;
  while (o.workers > 1 && int64_t{o.workers} * o.prefetch_factor * batch_bytes > budget)
    --o.workers;
  o.reason = "auto: " + std::to_string(cores) + " cores, " +
             std::to_string(std::max<int64_t>(1, batch_bytes >> 10)) + " KiB per batch";
  return o;
}

// The ring: slot k holds batch k, k + S, k + 2S, ... of a pass; a worker fills a slot only once
// the consumer has released the batch that was in it.
struct Loader::State {
  struct Slot {
    Batch batch;
    int64_t index = -1;  // the pass's batch it holds, once assembled
    std::exception_ptr error;
  };
  Backend& backend;
  const Dataset& data;
  int64_t batch_size;
  LoaderOptions options;
  std::vector<Slot> slots;
  std::vector<std::thread> workers;

  std::mutex mutex;
  std::condition_variable work_ready, batch_ready;
  std::vector<int64_t> starts;
  BatchRecipe recipe;
  uint64_t seed = 0;
  int64_t batches = 0, claimed = 0, released = 0, current = -1;
  int in_flight = 0;
  bool stop = false;
  double wait_s = 0;

  State(Backend& be, const Dataset& d, int64_t bs, LoaderOptions o)
      : backend(be), data(d), batch_size(bs), options(std::move(o)) {
    slots.resize(std::max(1, options.workers * options.prefetch_factor));
  }

  void assemble(int64_t index, Slot& slot) {
    slot.error = nullptr;
    try {
      data.check_source();
      const size_t begin = static_cast<size_t>(index * batch_size);
      const size_t end = std::min(starts.size(), begin + static_cast<size_t>(batch_size));
      Rng rng(mix_seed(seed, static_cast<uint64_t>(index)));
      assemble_batch(backend, data, starts, begin, end, recipe, rng, &slot.batch);
    } catch (...) {
      slot.error = std::current_exception();
    }
  }

  void work(int id) {
    const CNumbers numbers;
    const std::string name = "sf-loader-" + std::to_string(id);
    pthread_setname_np(pthread_self(), name.c_str());
    std::unique_lock lock(mutex);
    for (;;) {
      const int64_t ring = static_cast<int64_t>(slots.size());
      work_ready.wait(lock,
                      [&] { return stop || (claimed < batches && claimed < released + ring); });
      if (stop) return;
      const int64_t index = claimed++;
      Slot& slot = slots[index % ring];
      ++in_flight;
      lock.unlock();
      assemble(index, slot);
      lock.lock();
      slot.index = index;
      --in_flight;
      batch_ready.notify_all();
    }
  }
};

Loader::Loader(Backend& backend, const Dataset& data, int64_t batch_size, LoaderOptions options)
    : state_(std::make_unique<State>(backend, data, batch_size, std::move(options))) {
  for (int i = 0; i < state_->options.workers; ++i)
    state_->workers.emplace_back([this, i] { state_->work(i); });
}

Loader::~Loader() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->work_ready.notify_all();
  for (auto& t : state_->workers) t.join();
}

void Loader::start(const std::vector<int64_t>& starts, int64_t batches, const BatchRecipe& recipe,
                   uint64_t seed, int64_t first) {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  s.batches = s.claimed;  // no new claims; let the batches under way finish
  s.batch_ready.wait(lock, [&] { return s.in_flight == 0; });
  s.starts = starts;
  s.batches = std::min<int64_t>(
      batches, (static_cast<int64_t>(starts.size()) + s.batch_size - 1) / s.batch_size);
  s.recipe = recipe;
  s.seed = seed;
  s.claimed = s.released = std::clamp<int64_t>(first, 0, s.batches);
  s.current = s.claimed - 1;
  s.wait_s = 0;
  for (auto& slot : s.slots) slot.index = -1;
  s.work_ready.notify_all();
}

const Batch& Loader::next() {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  if (s.current + 1 >= s.batches) fail("loader: next() past the end of the pass");
  s.released = s.current + 1;  // the batch handed out last is done with
  const int64_t index = ++s.current;
  State::Slot& slot = s.slots[index % static_cast<int64_t>(s.slots.size())];
  const auto t0 = std::chrono::steady_clock::now();
  if (s.workers.empty()) {
    lock.unlock();
    s.assemble(index, slot);
    lock.lock();
    slot.index = index;
  } else {
    s.work_ready.notify_all();
    s.batch_ready.wait(lock, [&] { return slot.index == index; });
  }
  s.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (slot.error) std::rethrow_exception(slot.error);
  return slot.batch;
}

double Loader::wait_seconds() const {
  std::lock_guard lock(state_->mutex);
  return state_->wait_s;
}

const LoaderOptions& Loader::options() const { return state_->options; }

}  // namespace seqforge
