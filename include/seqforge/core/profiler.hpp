#pragma once
// A process-wide profiler, off by default. Scoped events go into per-thread buffers without a
// lock; stop() then write_trace() gives a Chrome trace-event JSON file (Perfetto,
// chrome://tracing) and summary() a table of the scopes by total time.
//
// Disabled, a scope costs one relaxed atomic load and a branch. Scope names must outlive the
// session (string literals).
#include <atomic>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace seqforge::profiler {

namespace detail {
extern std::atomic<bool> enabled;
}

inline bool enabled() noexcept { return detail::enabled.load(std::memory_order_relaxed); }

// Starts a new session (events of earlier sessions are dropped) and names the calling thread
// "main" unless it has a name.
void start();
// Ends recording; the session's events stay available to write_trace() and summary().
void stop();

// Names the calling thread in the trace ("checkpoint writer"). Cheap; may be called any time,
// also while profiling is off. OpenMP workers without a name appear as "omp worker N".
void set_thread_name(const std::string& name);

// A counter sample ("C" event), e.g. resident memory; ignored while profiling is off.
void counter(const char* name, double value);

// The last session as trace-event JSON, written atomically to `path`.
void write_trace(const std::string& path);

struct SummaryRow {
  std::string name;  // scope name with its layer and direction
  int64_t calls = 0;
  double total_ms = 0, mean_ms = 0, median_ms = 0, max_ms = 0;
  double share = 0;  // total / the session's wall time (nested scopes overlap their parents)
};
// The last session's scopes by total time, largest first.
std::vector<SummaryRow> summary();
void print_summary(std::ostream& out, size_t max_rows = 40);

// Records [construction, destruction) as a complete event on the calling thread. `layer` and
// `direction` (>= 0) distinguish the chains of an LSTM: "lstm forward L1", "... L1 reverse".
class Scope {
 public:
  explicit Scope(const char* name, int layer = -1, int direction = -1) noexcept {
    if (enabled()) [[unlikely]]
      begin(name, layer, direction);
  }
  ~Scope() {
    if (start_ns_ >= 0) [[unlikely]]
      end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void begin(const char* name, int layer, int direction) noexcept;
  void end() noexcept;
  const char* name_ = nullptr;
  int64_t start_ns_ = -1;
  int16_t layer_ = -1, direction_ = -1;
};

}  // namespace seqforge::profiler

#define SF_PROFILE_CAT2(a, b) a##b
#define SF_PROFILE_CAT(a, b) SF_PROFILE_CAT2(a, b)
// SF_PROFILE_SCOPE("optimizer"); or SF_PROFILE_SCOPE("lstm forward", layer, direction);
#define SF_PROFILE_SCOPE(...) \
  ::seqforge::profiler::Scope SF_PROFILE_CAT(sf_profile_scope_, __LINE__)(__VA_ARGS__)
