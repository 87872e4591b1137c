#include "bench/recording_backend.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace seqforge {

namespace {
// The run_concurrently call and worker this thread runs in, while a step is recorded.
struct Lane {
  int group = -1, workers = 1, worker = 0;
};
thread_local Lane lane;
}  // namespace

void RecordingBackend::run_concurrently(int n, const std::function<void(int)>& fn) {
  if (!recording) return inner_.run_concurrently(n, fn);
  const Lane outer = lane;  // a nested call's GEMMs stay the outer worker's
  int group = outer.group;
  if (group < 0) {
    std::lock_guard lock(mutex_);
    group = groups_++;
  }
  inner_.run_concurrently(n, [&](int w) {
    const Lane saved = lane;
    lane = outer.group >= 0 ? outer : Lane{group, n, w};
    try {
      fn(w);
    } catch (...) {
      lane = saved;
      throw;
    }
    lane = saved;
  });
}

void RecordingBackend::record(Call c) {
  c.group = lane.group, c.workers = lane.workers, c.worker = lane.worker;
  std::lock_guard lock(mutex_);
  calls.push_back(c);
}

void replay(Backend& be, const std::vector<RecordingBackend::Call>& calls) {
  for (size_t i = 0; i < calls.size();) {
    const RecordingBackend::Call& first = calls[i];
    if (first.group < 0) {
      replay(be, calls[i++]);
      continue;
    }
    std::vector<std::vector<const RecordingBackend::Call*>> per_worker(first.workers);
    for (; i < calls.size() && calls[i].group == first.group; ++i)
      per_worker[calls[i].worker].push_back(&calls[i]);
    be.run_concurrently(first.workers, [&](int w) {
      for (const RecordingBackend::Call* c : per_worker[w]) replay(be, *c);
    });
  }
}

void replay(Backend& be, const RecordingBackend::Call& c) {
  if (c.packed) {
    be.gemm(c.shape, c.dtype, c.a, c.b, c.packed, c.c, c.bias);
  } else {
    be.gemm(c.shape, c.dtype, c.a, c.b, c.c, c.bias);
  }
}

void print_gemm_breakdown(Backend& be, const std::vector<RecordingBackend::Call>& calls) {
  struct Total {
    int count = 0;
    double ms = 0, gflop = 0;
  };
  std::map<std::string, Total> totals;
  for (const auto& c : calls) {
    const auto t0 = std::chrono::steady_clock::now();
    replay(be, c);
    const std::string key = std::string(dtype_name(c.dtype)) + " " + std::to_string(c.shape.m) +
                            "x" + std::to_string(c.shape.n) + "x" + std::to_string(c.shape.k) +
                            (c.shape.trans_a ? " tA" : "") + (c.shape.trans_b ? " tB" : "") +
                            (c.shape.beta != 0.0f ? " +C" : "") + (c.packed ? " packed" : "");
    Total& t = totals[key];
    t.count += 1;
    t.ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    t.gflop += 2.0 * c.shape.m * c.shape.n * c.shape.k / 1e9;
  }
  std::vector<std::pair<std::string, Total>> sorted(totals.begin(), totals.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  for (const auto& [key, t] : sorted)
    std::printf("  gemm %-36s x%-5d %9.2f ms %8.1f GFLOP/s\n", key.c_str(), t.count, t.ms,
                t.gflop / (t.ms / 1e3));
}

}  // namespace seqforge
