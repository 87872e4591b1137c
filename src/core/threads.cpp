#include "seqforge/core/threads.hpp"

#include <locale.h>
#include <omp.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
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

// Whether this process may have started OpenMP threads, and whether it is a child forked after
// that (multiprocessing's fork start method, os.fork): the pool's threads do not come with it, and
// libgomp waits for them for good in its next parallel region. Such a child computes on one thread.
std::atomic<bool> omp_pool_started{false};
std::atomic<bool> forked_after_omp_pool{false};
void after_fork_in_child() {
  if (!omp_pool_started.load()) return;
  forked_after_omp_pool = true;
  omp_set_num_threads(1);
}
[[maybe_unused]] const bool fork_handler_registered =
    pthread_atfork(nullptr, nullptr, after_fork_in_child) == 0;
}  // namespace

int compute_threads() {
  const int n = configured_threads.load();
  return n > 0 ? n : usable_cpus();
}

ThreadConfig configure_threads(int requested) {
  ThreadConfig cfg;
  const int cpus = usable_cpus();
  const char* env = std::getenv("OMP_NUM_THREADS");
  char* end = nullptr;
  const long from_env = env ? std::strtol(env, &end, 10) : 0;
  if (requested > 0) {
    cfg.threads = requested;
    cfg.reason = "requested";
  } else if (env && end != env && (*end == '\0' || *end == ',' || *end == ' ') && from_env > 0) {
    // "4" or the outermost level of a nested list ("4,2"), as libgomp reads it
    cfg.threads = static_cast<int>(std::min<long>(from_env, 1 << 20));
    cfg.reason = "OMP_NUM_THREADS";
  } else {
    cfg.threads = cpus;
    cfg.reason = std::to_string(cpus) + " CPUs available to this process";
  }
  // More threads than CPUs only wait for each other (4096 on 2 CPUs took minutes a step), and
  // libgomp crashes starting 100,000.
  if (cfg.threads > cpus) {
    cfg.warning = std::to_string(cfg.threads) + " threads (" + cfg.reason + ") on " +
                  std::to_string(cpus) + " CPUs this process may use: running " +
                  std::to_string(cpus) + " (more would only wait for each other)";
    cfg.threads = cpus;
    cfg.reason = std::to_string(cpus) + " CPUs available to this process";
  }
  if (forked_after_omp_pool.load() && cfg.threads > 1) {
    cfg.warning =
        "this process was forked (os.fork, multiprocessing's fork start method) after "
        "its parent ran seqforge's OpenMP threads, which a child does not get: "
        "computing on one thread (the spawn or forkserver start method gives each "
        "process its threads)";
    cfg.threads = 1;
    cfg.reason = "a forked child";
  }
  if (cfg.threads > 1) omp_pool_started = true;
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
  if (omp_get_max_threads() > 1) omp_pool_started = true;
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

CNumbers::CNumbers() {
  static const locale_t c = newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(nullptr));
  previous_ = c ? uselocale(c) : nullptr;
}

CNumbers::~CNumbers() {
  if (previous_) uselocale(static_cast<locale_t>(previous_));
}

CallersNumbers::CallersNumbers(const CNumbers& outer)
    : ours_(outer.callers() ? uselocale(static_cast<locale_t>(outer.callers())) : nullptr) {}

KeepCallersThreads::KeepCallersThreads() : before_(omp_get_max_threads()) {}

KeepCallersThreads::~KeepCallersThreads() {
  if (omp_get_max_threads() != before_) omp_set_num_threads(before_);
}

CallersNumbers::~CallersNumbers() {
  if (ours_) uselocale(static_cast<locale_t>(ours_));
}

}  // namespace seqforge
