#pragma once
// What the recurrence engine's files share (recurrent.cpp: the steps and schedules;
// recurrent_weight_grads.cpp: the weight gradients and their layouts).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/autotune.hpp"

namespace seqforge::recurrent {

// The address `elements` elements into t.
inline char* at(Tensor t, int64_t elements) {
  return static_cast<char*>(t.data()) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}

inline std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Where a choice was timed, the start of its autotune key: the CPU and its threads, and for a
// backend whose memory the host cannot address (a GPU) the backend itself and its streams, its
// ops enqueued by one thread.
inline std::string tuning_prefix(const Backend& be) {
  if (be.host_addressable()) return autotune::machine_prefix(be.concurrency());
  return be.description() + ", " + std::to_string(be.concurrency()) + " streams|" +
         autotune::machine_prefix(1);
}

// Milliseconds of each of n candidates, run(i) for candidate i: a warm-up each (primitives are
// made on first use), then the best of timed rounds, each running every candidate once in turn:
// two, or more (up to 20) until the rounds have taken 50 ms, so that a burst of another
// process's work spoils a few runs of a short candidate rather than its best (W3's forward, 0.4
// ms, timed in two rounds beside another process's bursts kept a schedule 1.6x slower).
template <typename Run>
std::vector<double> time_candidates(Backend& be, size_t n, Run&& run) {
  auto ms_of = [&](size_t i) {
    be.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    run(i);
    be.synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (size_t i = 0; i < n; ++i) ms_of(i);
  std::vector<double> ms(n, 1e300);
  double spent = 0;
  for (int round = 0; round < 2 || (round < 20 && spent < 50); ++round)
    for (size_t i = 0; i < n; ++i) {
      const double t = ms_of(i);
      ms[i] = std::min(ms[i], t);
      spent += t;
    }
  return ms;
}

}  // namespace seqforge::recurrent
