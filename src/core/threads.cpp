#include "seqforge/core/threads.hpp"

#include <omp.h>
#include <sched.h>

#include <cstdlib>
#include <string>

namespace seqforge {

ThreadConfig configure_threads(int requested) {
  ThreadConfig cfg;
  if (requested > 0) {
    cfg.threads = requested;
    cfg.reason = "requested";
  } else if (const char* env = std::getenv("OMP_NUM_THREADS"); env && std::atoi(env) > 0) {
    cfg.threads = std::atoi(env);
    cfg.reason = "OMP_NUM_THREADS";
  } else {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    cfg.threads = cpus > 0 ? cpus : 1;
    cfg.reason = std::to_string(cfg.threads) + " CPUs available to this process";
  }
  omp_set_num_threads(cfg.threads);
  return cfg;
}

}  // namespace seqforge
