#pragma once
// One compute thread pool: OpenMP (the runtime oneDNN is built on), sized to the machine.
#include <string>

namespace seqforge {

struct ThreadConfig {
  int threads = 0;     // compute threads in use
  std::string reason;  // why this many
};

// Sets the OpenMP pool size: `requested` > 0 is honoured, otherwise OMP_NUM_THREADS if set,
// otherwise the CPUs this process may run on. Idempotent.
ThreadConfig configure_threads(int requested = 0);

}  // namespace seqforge
