#include "seqforge/core/threads.hpp"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "seqforge/core/cpu.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define SEQFORGE_HAS_MXCSR 1
#endif

namespace seqforge {

namespace {
std::atomic<int> configured_threads{0};
}  // namespace

int compute_threads() {
  const int n = configured_threads.load();
  return n > 0 ? n : usable_cpus();
}

ThreadConfig configure_threads(int requested) {
  ThreadConfig cfg;
  if (requested > 0) {
    cfg.threads = requested;
    cfg.reason = "requested";
  } else if (const char* env = std::getenv("OMP_NUM_THREADS"); env && std::atoi(env) > 0) {
    cfg.threads = std::atoi(env);
    cfg.reason = "OMP_NUM_THREADS";
  } else {
    cfg.threads = usable_cpus();
    cfg.reason = std::to_string(cfg.threads) + " CPUs available to this process";
  }
  omp_set_num_threads(cfg.threads);
  configured_threads = cfg.threads;
  return cfg;
}

namespace {
#ifdef SEQFORGE_HAS_MXCSR
constexpr unsigned kFlushBits = 0x8040;  // MXCSR FTZ (bit 15) | DAZ (bit 6)
#endif
}  // namespace

bool set_flush_denormals([[maybe_unused]] bool on) {
#ifdef SEQFORGE_HAS_MXCSR
  auto apply = [on] {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(on ? csr | kFlushBits : csr & ~kFlushBits);
  };
  apply();
#pragma omp parallel num_threads(omp_get_max_threads())
  apply();
  return true;
#else
  return false;
#endif
}

bool flushes_denormals() {
#ifdef SEQFORGE_HAS_MXCSR
  return (_mm_getcsr() & kFlushBits) == kFlushBits;
#else
  return false;
#endif
}

bool flush_denormals_wanted() {
  const char* v = std::getenv("SEQFORGE_FLUSH_DENORMALS");
  return !v || std::strcmp(v, "0") != 0;
}

void restart_with_short_omp_spin_waits(char** argv) {
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY")) return;
  setenv("GOMP_SPINCOUNT", "1000", 1);
  execv("/proc/self/exe", argv);
}

}  // namespace seqforge
