#pragma once
// One compute thread pool: OpenMP (the runtime oneDNN is built on), sized to the machine.
#include <string>

namespace seqforge {

struct ThreadConfig {
  int threads = 0;      // compute threads in use
  std::string reason;   // why this many
  std::string warning;  // e.g. more threads than CPUs
};

// Sets the OpenMP pool size: `requested` > 0 is honoured, otherwise OMP_NUM_THREADS if set,
// otherwise the CPUs this process may run on; never more than those CPUs (a warning says so).
// Idempotent.
ThreadConfig configure_threads(int requested = 0);
// The compute threads configure_threads last set (before any call: the CPUs this process may run
// on).
int compute_threads();

// OpenMP threads waiting at a barrier spin before they sleep: libgomp spins 300,000 rounds unless
// OMP_WAIT_POLICY or GOMP_SPINCOUNT say otherwise. When another busy process shares the cores, a
// spinning thread holds a core its partner needs for a whole time slice: two 2-thread training
// runs on two cores took 160 s together against 2.7 s alone; with 1,000 rounds, 6.9 s together
// and no slower alone. libgomp reads the variables only as it loads, so a program calls this
// first in main: unless either variable is set, it sets GOMP_SPINCOUNT=1000 and restarts itself
// (execv of /proc/self/exe, same arguments); where that fails it carries on as it was. Set
// either variable to keep a process from restarting (under valgrind, say).
void restart_with_short_omp_spin_waits(char** argv);

// Flush-to-zero and denormals-are-zero (x86 MXCSR FTZ and DAZ) on, or off, on the calling thread
// and every thread of the OpenMP pool; threads they start later inherit the mode. Gradients that
// decay through a long sequence reach the denormal range, where Intel cores take a microcode
// assist on every operation (W1's fp32 step: 1.3x slower). Returns false where the CPU has no
// such mode.
bool set_flush_denormals(bool on);
// Whether the calling thread flushes denormals to zero.
bool flushes_denormals();
// Whether the CPU backend should flush them: yes, unless SEQFORGE_FLUSH_DENORMALS=0.
bool flush_denormals_wanted();

// The calling thread's OpenMP thread count for a scope, then back to what it was: a host that
// computes with the same OpenMP runtime (PyTorch shares libgomp) finds its own after a call.
class KeepCallersThreads {
 public:
  KeepCallersThreads();
  ~KeepCallersThreads();
  KeepCallersThreads(const KeepCallersThreads&) = delete;
  KeepCallersThreads& operator=(const KeepCallersThreads&) = delete;

 private:
  int before_;
};

// Numbers as text in C's notation ('.' before decimals) on the calling thread while it lives,
// whatever locale the process set: a host program (Python after locale.setlocale) may have chosen
// one whose decimal point is ',', which strtod and printf follow, so files written in one locale
// would read as other numbers, or not at all, in another. Each library entry point the Python
// module calls, and each thread the library starts that reads or writes text, holds one.
class CNumbers {
 public:
  CNumbers();
  ~CNumbers();
  CNumbers(const CNumbers&) = delete;
  CNumbers& operator=(const CNumbers&) = delete;
  void* callers() const { return previous_; }

 private:
  void* previous_;  // the thread's locale_t before
};

// The host's locale back for a scope inside a CNumbers one: Python code a callback runs.
class CallersNumbers {
 public:
  explicit CallersNumbers(const CNumbers& outer);
  ~CallersNumbers();
  CallersNumbers(const CallersNumbers&) = delete;
  CallersNumbers& operator=(const CallersNumbers&) = delete;

 private:
  void* ours_;
};

}  // namespace seqforge
