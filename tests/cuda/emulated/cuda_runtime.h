#pragma once
// A host emulation of the CUDA runtime, for the tests alone: enough of it that seqforge's CUDA
// kernels and their launchers (src/kernels/cuda) compile as C++ and run on the CPU, each block's
// threads as fibers that switch at __syncthreads, so that a session without a GPU
// checks their indexing, barriers and math against the reference kernels. Device memory is host
// memory closed to the host (PROT_NONE) but while the emulated device works on it, so that host
// code that reads or writes device memory faults here as it would on a GPU. A stream's work runs
// only when something waits for it (see Streams below), so that work the events leave unordered
// runs out of order; a capture records its streams' work, which runs when the graph is launched.
#include <math.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#define __global__
#define __launch_bounds__(...)
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static  // one block runs at a time: a static array is the block's

struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorMemoryAllocation = 2,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct cudaFuncAttributes {
  size_t sharedSizeBytes = 0;
  int maxDynamicSharedSizeBytes = 48 << 10;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct double2 {
  double x, y;
};
inline double2 make_double2(double x, double y) { return {x, y}; }

namespace sf_emu {
// Device memory: pages of one reserved range, a freed block reused for an allocation of its size
// (so that the range opened and closed stays the size of what is live at most), opened for the
// duration of the device's work: launches, copies, sets and the emulated cuBLASLt's matmul
// (through sf_emu_device_open, which the test executable exports to it).
struct DeviceMemory {
  static constexpr size_t kReserve = size_t{64} << 30;  // address space only
  std::mutex mutex;
  char* base = nullptr;
  size_t used = 0;
  int open = 0;
  std::map<char*, size_t> sizes;        // live blocks
  std::multimap<size_t, char*> unused;  // freed blocks by size
  void protect(char* p, size_t bytes, int prot) {
    if (bytes && mprotect(p, bytes, prot) != 0) std::abort();
  }
};
inline DeviceMemory device_memory;
inline void open_device(bool open) {
  DeviceMemory& m = device_memory;
  std::lock_guard lock(m.mutex);
  if (open ? m.open++ == 0 : --m.open == 0)
    m.protect(m.base, m.used, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}
struct Open {
  Open() { open_device(true); }
  ~Open() { open_device(false); }
  Open(const Open&) = delete;
  Open& operator=(const Open&) = delete;
};
inline void* device_alloc(size_t bytes) {
  DeviceMemory& m = device_memory;
  std::lock_guard lock(m.mutex);
  if (!m.base) {
    void* p =
        mmap(nullptr, m.kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    m.base = static_cast<char*>(p);
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t rounded = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  char* p = nullptr;
  if (const auto it = m.unused.find(rounded); it != m.unused.end()) {
    p = it->second;
    m.unused.erase(it);
  } else {
    if (m.used + rounded > m.kReserve) return nullptr;
    p = m.base + m.used;
    m.used += rounded;
  }
  m.sizes[p] = rounded;
  m.protect(p, rounded, PROT_READ | PROT_WRITE);
  // Poisoned, so that memory the backend promises zeroed but leaves is seen; past the first MiB
  // left unpopulated (zeros), since every page in use is reprotected at each launch.
  std::memset(p, 0xcd, std::min<size_t>(bytes, size_t{1} << 20));
  if (m.open == 0) m.protect(p, rounded, PROT_NONE);
  return p;
}
inline void device_free(void* p) {
  DeviceMemory& m = device_memory;
  std::lock_guard lock(m.mutex);
  const auto it = m.sizes.find(static_cast<char*>(p));
  if (it == m.sizes.end()) return;
  madvise(it->first, it->second, MADV_DONTNEED);
  m.unused.emplace(it->second, it->first);
  m.sizes.erase(it);
}

// Streams. A stream's work waits in its queue and runs only when something needs it done: a
// stream that waits on an event recorded on it (up to the event), a synchronisation of the
// stream or of the event, a synchronous free. And when a stream's work runs, the work of the
// streams it waits for runs first, as far as it waits for it, theirs interleaved (a work item of
// each in turn). Work that no event orders after another stream's then runs before it, or long
// after it, or between its steps, as it may on a GPU, and the results show it. The legacy stream
// (nullptr: the kernels' tests) runs its work at once. One thread at a time runs work (the
// device's), holding `mutex`, which also guards the queues, the events and the capture.
//
// Capture: the work enqueued on the stream being captured, and on the streams that joined it by
// waiting on an event recorded in it, is recorded (in the order it is enqueued, which the events
// allow), not queued. Each joined stream must be joined back before the capture ends (the origin
// waits on an event recorded on it after its last captured work), and a captured stream may not
// wait on an event recorded outside the capture.
struct Graph {
  std::shared_ptr<std::vector<std::function<void()>>> ops =
      std::make_shared<std::vector<std::function<void()>>>();
};
// Work on a stream: `run`, or a wait for another stream's first `upto` work items.
struct Work {
  std::function<void()> run;
  cudaStream_t wait_for = nullptr;
  uint64_t upto = 0;
};
struct Stream {
  std::deque<Work> queue;
  uint64_t enqueued = 0, done = 0;  // work items so far
  bool captured = false;            // the capture's origin, or a stream that joined it
  uint64_t captured_work = 0;       // recorded in the capture (a stream's joining counts)
  uint64_t rejoined = 0;            // of captured_work, as much as the origin waited on
};
inline std::recursive_mutex mutex;
inline std::map<cudaStream_t, Stream> streams;
inline cudaStream_t capture_origin = nullptr;
inline Graph* recording = nullptr;
inline bool invalidated = false;  // the capture was asked for what it cannot hold

// Runs stream s's work, the first `upto` items of all it was given (all of them by default).
inline void flush(cudaStream_t s, uint64_t upto = UINT64_MAX) {
  std::lock_guard lock(mutex);
  const auto it = streams.find(s);
  if (it == streams.end()) return;
  Stream& q = it->second;
  std::vector<std::pair<cudaStream_t, uint64_t>> waits;
  for (size_t i = 0; i < q.queue.size() && q.done + i < upto; ++i)
    if (q.queue[i].wait_for) waits.emplace_back(q.queue[i].wait_for, q.queue[i].upto);
  for (bool ran = true; ran;) {
    ran = false;
    for (const auto& [other, position] : waits) {
      const auto w = streams.find(other);
      if (w == streams.end() || w->second.done >= position || w->second.queue.empty()) continue;
      flush(other, w->second.done + 1);
      ran = true;
    }
  }
  while (q.done < upto && !q.queue.empty()) {
    const Work work = std::move(q.queue.front());
    q.queue.pop_front();
    if (work.run)
      work.run();
    else
      flush(work.wait_for, work.upto);
    ++q.done;
  }
}
// Records `work` in the capture, queues it on s, or runs it now (the legacy stream).
inline void enqueue(cudaStream_t s, std::function<void()> work) {
  std::lock_guard lock(mutex);
  if (!s) return work();
  Stream& q = streams[s];
  if (q.captured) {
    recording->ops->push_back(std::move(work));
    ++q.captured_work;
    return;
  }
  q.queue.push_back({std::move(work)});
  ++q.enqueued;
}
inline bool is_capturing(cudaStream_t s) {
  std::lock_guard lock(mutex);
  return s && streams[s].captured;
}
// Work a capture cannot hold, asked for on a captured stream: the capture is invalidated.
inline cudaError_t refuse_in_capture(cudaStream_t s) {
  std::lock_guard lock(mutex);
  if (!is_capturing(s)) return cudaSuccess;
  invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

// A launch's threads are fibers on the launching thread: each runs until it reaches a barrier
// (__syncthreads, a grid sync) or its end, then the next runs; a barrier opens when every live
// thread it holds has reached it. Threads that run at once as OS threads, 8 a block on two
// cores, spent most of an emulated run in the scheduler. Between barriers the threads run in
// turn, in ascending order in one phase and descending in the next, so that a read of another
// thread's write without a barrier between them sees the poisoned value one way or the other.
// A thread that spins on memory another block writes (__nanosleep in its loop) runs again in the
// next turn, after the others.
struct Fiber {
  enum State { ready, at_block_barrier, at_grid_barrier, spinning, done };
  ucontext_t context;
  std::function<void()> body;
  unsigned thread = 0, block = 0;
  unsigned char* shared = nullptr;
  State state = ready;
  std::source_location at;  // the barrier it waits at
};

// Fiber stacks, reserved once per launching thread and reused, each under a guard page.
struct FiberStacks {
  static constexpr size_t kBytes = size_t{4} << 20;
  std::vector<char*> stacks;
  char* get(size_t i) {
    while (stacks.size() <= i) {
      void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (p == MAP_FAILED) std::abort();
      mprotect(p, static_cast<size_t>(sysconf(_SC_PAGESIZE)), PROT_NONE);
      stacks.push_back(static_cast<char*>(p));
    }
    return stacks[i];
  }
  ~FiberStacks() {
    for (char* p : stacks) munmap(p, kBytes);
  }
};

#if defined(__SANITIZE_ADDRESS__)
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom,
                                               size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                                size_t* size_old);
#endif

struct FiberScheduler {
  ucontext_t main;
  bool cooperative = false;  // the launch's: grid syncs allowed
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  FiberStacks stacks;
#if defined(__SANITIZE_ADDRESS__)
  const void* main_bottom = nullptr;
  size_t main_size = 0;
#endif

  static void entry();
  // Switches from the launching thread into f until it waits or ends.
  void resume(Fiber& f) {
    current = &f;
#if defined(__SANITIZE_ADDRESS__)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.context.uc_stack.ss_sp, f.context.uc_stack.ss_size);
#endif
    swapcontext(&main, &f.context);
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    current = nullptr;
  }
  // From inside the running fiber: back to the launching thread, to resume at `state`'s opening.
  void wait(Fiber::State state, std::source_location at = {}) {
    if (state == Fiber::at_grid_barrier && !cooperative) {  // undefined on a GPU
      std::fprintf(stderr, "emulated CUDA: a grid sync in a launch that is not cooperative\n");
      std::abort();
    }
    Fiber& f = *current;
    f.state = state;
    f.at = at;
#if defined(__SANITIZE_ADDRESS__)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, main_bottom, main_size);
#endif
    swapcontext(&f.context, &main);
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake, &main_bottom, &main_size);
#endif
  }
  // Runs every fiber to its end, opening barriers as they fill.
  void run();
  // Aborts where a barrier that is about to open is undefined on a GPU: a block's threads at
  // different __syncthreads (it compiles to an aligned barrier, one instruction for the whole
  // block), or a thread that ended while others of its block (of its grid, at a grid sync) wait.
  void check_barriers() const;
};
inline thread_local FiberScheduler scheduler;  // the launching thread's

inline thread_local dim3 thread_index, block_index;
inline dim3 block_dim, grid_dim;
// The running thread's dynamic shared memory.
inline thread_local unsigned char* block_shared = nullptr;
inline int launches = 0;
// For the tests of checks that must catch a wrong kernel: the launch that runs as number
// skipped_launch does nothing (skip_launch(1): the next to run).
inline int skipped_launch = 0;
inline void skip_launch(int nth) { skipped_launch = launches + nth; }

inline void FiberScheduler::entry() {
  FiberScheduler& s = scheduler;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom, &s.main_size);
#endif
  Fiber& f = *s.current;
  f.body();
  f.state = Fiber::done;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(nullptr, s.main_bottom, s.main_size);
#endif
  // returns through uc_link to the launching thread
}

inline void FiberScheduler::check_barriers() const {
  const auto where = [](const Fiber& f) {
    return std::string(f.at.file_name()) + ":" + std::to_string(f.at.line());
  };
  const auto fail = [](const std::string& why) {
    std::fprintf(stderr, "emulated CUDA: %s\n", why.c_str());
    std::abort();
  };
  // A block's threads are consecutive fibers: each block checked in place, nothing allocated
  // (this runs at every barrier of every launch).
  const Fiber* first_ended = nullptr;  // of the grid
  bool at_grid = false, others_live = false;
  for (size_t b = 0, e = 0; b < fibers.size(); b = e) {
    const Fiber *waiting = nullptr, *ended = nullptr;
    bool running = false;
    for (e = b; e < fibers.size() && fibers[e].block == fibers[b].block; ++e) {
      const Fiber& f = fibers[e];
      if (f.state == Fiber::at_block_barrier && !waiting) waiting = &f;
      if (f.state == Fiber::done && !ended) ended = &f;
      running |= f.state == Fiber::ready || f.state == Fiber::spinning;
      at_grid |= f.state == Fiber::at_grid_barrier;
    }
    if (!first_ended) first_ended = ended;
    others_live |= running || waiting;
    if (!waiting) continue;
    for (size_t k = b; k < e; ++k) {
      const Fiber& f = fibers[k];
      if (f.state == Fiber::at_block_barrier &&
          (f.at.line() != waiting->at.line() ||
           std::strcmp(f.at.file_name(), waiting->at.file_name()) != 0))
        fail("block " + std::to_string(f.block) + ": thread " + std::to_string(waiting->thread) +
             " waits at the barrier at " + where(*waiting) + ", thread " +
             std::to_string(f.thread) + " at " + where(f));
    }
    if (ended && !running)
      fail("block " + std::to_string(ended->block) + ": thread " + std::to_string(ended->thread) +
           " ended while thread " + std::to_string(waiting->thread) + " waits at the barrier at " +
           where(*waiting));
  }
  if (at_grid && first_ended && !others_live)
    fail("block " + std::to_string(first_ended->block) + ": thread " +
         std::to_string(first_ended->thread) + " ended while others wait at a grid sync");
}

inline void FiberScheduler::run() {
  for (size_t phase = 0;; ++phase) {
    const size_t n = fibers.size();
    bool advanced = false;  // a thread reached a barrier or its end
    for (size_t i = 0; i < n; ++i) {
      Fiber& f = fibers[phase % 2 ? n - 1 - i : i];
      if (f.state != Fiber::ready) continue;
      thread_index = {f.thread};
      block_index = {f.block};
      block_shared = f.shared;
      resume(f);
      advanced |= f.state != Fiber::spinning;
    }
    for (Fiber& f : fibers)
      if (f.state == Fiber::spinning) f.state = Fiber::ready;
    // Every live fiber waits now. A grid sync opens when all of them wait there, a block's
    // barrier when its live threads wait there.
    bool live = false, all_at_grid = true;
    for (const Fiber& f : fibers) {
      live |= f.state != Fiber::done;
      all_at_grid &= f.state == Fiber::done || f.state == Fiber::at_grid_barrier;
    }
    if (!live) return;
    check_barriers();
    bool opened = false;
    if (all_at_grid) {
      for (Fiber& f : fibers)
        if (f.state == Fiber::at_grid_barrier) f.state = Fiber::ready, opened = true;
    } else {
      std::map<unsigned, bool> full;  // block -> every live thread at its barrier
      for (const Fiber& f : fibers)
        if (f.state != Fiber::done)
          full.try_emplace(f.block, true).first->second &= f.state == Fiber::at_block_barrier;
      for (Fiber& f : fibers)
        if (f.state == Fiber::at_block_barrier && full[f.block])
          f.state = Fiber::ready, opened = true;
    }
    if (!opened && !advanced) {  // on a GPU this launch would hang
      std::fprintf(stderr, "emulated CUDA: a kernel's threads wait at different barriers\n");
      std::abort();
    }
  }
}

// The most threads an emulated block runs: 8, or SEQFORGE_EMULATED_BLOCK_THREADS (up to 1024: the
// launch's own block size, whole warps, where a thread's share of the work and its neighbours are
// those of a GPU).
inline unsigned block_threads() {
  static const unsigned n = [] {
    const char* v = std::getenv("SEQFORGE_EMULATED_BLOCK_THREADS");
    return v ? std::clamp(static_cast<unsigned>(std::atoi(v)), 1u, 1024u) : 8u;
  }();
  return n;
}

// kernel<<<grid, block, shared>>>(args...): every block in turn, its threads as fibers. Grids
// and blocks are cut to at most 3 blocks of 8 threads (block_threads): the kernels stride over
// any geometry (a result that depended on it would be a defect this catches), and it keeps the
// threads few.
// A cooperative launch runs all its blocks together, as the GPU guarantees it, and keeps its
// grid: the launcher sized it to the blocks the (emulated) GPU holds at once, and the kernel may
// give each block work of its own (the whole-chain kernels' resident weights).
template <typename Kernel>
struct Launch {
  Kernel* kernel;
  unsigned grid, block;
  size_t shared;
  bool cooperative = false;
  cudaStream_t stream = nullptr;
  template <typename... Args>
  void operator()(Args... args) const {
    const Launch self = *this;
    enqueue(stream, [self, args...] { self.run(args...); });
  }
  template <typename... Args>
  void run(Args... args) const {
    const Open open;
    if (grid == 0 || block == 0 || block > 1024) {  // cudaErrorInvalidConfiguration on a GPU
      std::fprintf(stderr, "emulated CUDA: a launch of %u blocks of %u threads\n", grid, block);
      std::abort();
    }
    if (++launches == skipped_launch) return;
    grid_dim = {cooperative ? grid : std::min(grid, 3u)};
    block_dim = {std::min(block, block_threads())};
    FiberScheduler& s = scheduler;
    s.cooperative = cooperative;
    const unsigned at_once = cooperative ? grid_dim.x : 1;
    for (unsigned b0 = 0; b0 < grid_dim.x; b0 += at_once) {
      // Aligned as a GPU aligns a block's shared memory (warp matrix loads check 32 bytes).
      struct alignas(128) Line {
        unsigned char bytes[128];
      };
      std::vector<std::vector<Line>> memory;
      for (unsigned k = 0; k < at_once; ++k) {
        memory.emplace_back((shared + 127) / 128);
        if (shared)  // never zeros: an unwritten read shows
          std::memset(memory.back().data(), 0xcd, shared);
      }
      s.fibers.assign(at_once * block_dim.x, Fiber{});
      for (unsigned k = 0; k < at_once; ++k)
        for (unsigned t = 0; t < block_dim.x; ++t) {
          const size_t i = k * block_dim.x + t;
          Fiber& f = s.fibers[i];
          f.thread = t;
          f.block = b0 + k;
          f.shared = memory[k].empty() ? nullptr : memory[k].data()->bytes;
          f.body = [&] { kernel(args...); };
          getcontext(&f.context);
          f.context.uc_stack.ss_sp = s.stacks.get(i);
          f.context.uc_stack.ss_size = FiberStacks::kBytes;
          f.context.uc_link = &s.main;
          makecontext(&f.context, &FiberScheduler::entry, 0);
        }
      s.run();
    }
    s.fibers.clear();
  }
};
}  // namespace sf_emu

#define threadIdx ::sf_emu::thread_index
#define blockIdx ::sf_emu::block_index
#define blockDim ::sf_emu::block_dim
#define gridDim ::sf_emu::grid_dim
#define SF_LAUNCH(grid, block, shared, stream, ...) \
  ::sf_emu::Launch<decltype(__VA_ARGS__)> { __VA_ARGS__, grid, block, shared, false, stream }
#define SF_LAUNCH_COOPERATIVE(grid, block, shared, stream, ...) \
  ::sf_emu::Launch<decltype(__VA_ARGS__)> { __VA_ARGS__, grid, block, shared, true, stream }
#define SF_DYNAMIC_SHARED(name) unsigned char* name = ::sf_emu::block_shared

inline void __syncthreads(std::source_location at = std::source_location::current()) {
  sf_emu::scheduler.wait(sf_emu::Fiber::at_block_barrier, at);
}
// Rounded on their own: a volatile result is never fused into an FMA.
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline double __dmul_rn(double a, double b) {
  volatile double r = a * b;
  return r;
}
// CUDA's normal distribution function (a few ulp on the device), here from the host's erfc in
// double.
inline double normcdf(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }
inline float normcdff(float x) { return static_cast<float>(normcdf(x)); }
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
// A spinning thread's pause: the other threads run meanwhile.
inline void __nanosleep(unsigned) { sf_emu::scheduler.wait(sf_emu::Fiber::spinning); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
inline double atomicAdd(double* p, double v) { return std::atomic_ref<double>(*p).fetch_add(v); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long expected,
                                    unsigned long long desired) {
  std::atomic_ref<unsigned long long>(*p).compare_exchange_strong(expected, desired);
  return expected;  // the old value either way
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::atomic_ref<unsigned long long> a(*p);
  unsigned long long seen = a.load();
  while (v < seen && !a.compare_exchange_weak(seen, v)) {
  }
  return seen;
}

inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr) {
  sf_emu::enqueue(s, [=] {
    const sf_emu::Open open;
    std::memset(p, value, bytes);
  });
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  return cudaMemsetAsync(p, value, bytes);
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
template <typename Kernel>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, Kernel) {
  *a = {};
  return cudaSuccess;
}
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int) {
  return cudaSuccess;
}

// The runtime calls of the backend (src/backend/cuda/cuda_backend.cpp): one emulated device whose
// memory is the host's, every call synchronous.
enum cudaMemcpyKind {
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3
};
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrCooperativeLaunch = 95,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };
using cudaMemPool_t = struct CUmemPoolHandle_st*;
constexpr unsigned cudaStreamNonBlocking = 1;
struct cudaDeviceProp {
  char name[256] = "seqforge's host emulation";
  int major = 9, minor = 0;
  size_t totalGlobalMem = size_t{1} << 30;
  int pciDomainID = 0, pciBusID = 0, pciDeviceID = 0;
};
inline const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess                         ? "cudaSuccess"
         : e == cudaErrorMemoryAllocation         ? "cudaErrorMemoryAllocation"
         : e == cudaErrorStreamCaptureUnsupported ? "cudaErrorStreamCaptureUnsupported"
         : e == cudaErrorStreamCaptureUnjoined    ? "cudaErrorStreamCaptureUnjoined"
         : e == cudaErrorStreamCaptureIsolation   ? "cudaErrorStreamCaptureIsolation"
                                                  : "cudaErrorStreamCaptureInvalidated";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "operation failed (host emulation)";
}
inline cudaError_t cudaGetDeviceCount(int* n) { return *n = 1, cudaSuccess; }
// One device as far as counting goes, but a process may set another current device number, which
// shows as the device's PCI bus (the emulated NCCL's test has two backends tell their "GPUs"
// apart); the memory is the same. As on a GPU, each thread has its own current device.
namespace sf_emu {
inline thread_local int current_device = 0;
}
inline cudaError_t cudaGetDevice(int* d) { return *d = sf_emu::current_device, cudaSuccess; }
inline cudaError_t cudaSetDevice(int d) { return sf_emu::current_device = d, cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  *p = {};
  p->pciBusID = device;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrComputeCapabilityMajor ? 9
       // SEQFORGE_EMULATED_SMS: more, so that launches planned by the GPU's size hold more blocks
       : a == cudaDevAttrMultiProcessorCount
           ? (std::getenv("SEQFORGE_EMULATED_SMS") ? std::atoi(std::getenv("SEQFORGE_EMULATED_SMS"))
                                                   : 3)
       // SEQFORGE_EMULATED_COOPERATIVE=0: a GPU without cooperative launches
       : a == cudaDevAttrCooperativeLaunch
           ? (std::getenv("SEQFORGE_EMULATED_COOPERATIVE")
                  ? std::atoi(std::getenv("SEQFORGE_EMULATED_COOPERATIVE"))
                  : 1)
       : a == cudaDevAttrMaxSharedMemoryPerBlockOptin
           // SEQFORGE_EMULATED_SHARED_KB: less, so that kernels that plan by it stage in chunks
           ? 1024 * (std::getenv("SEQFORGE_EMULATED_SHARED_KB")
                         ? std::atoi(std::getenv("SEQFORGE_EMULATED_SHARED_KB"))
                         : 99)
           : 0;
  return cudaSuccess;
}
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel, int, size_t) {
  *blocks = 1;
  return cudaSuccess;
}
inline cudaError_t cudaRuntimeGetVersion(int* v) { return *v = 13000, cudaSuccess; }
inline cudaError_t cudaDriverGetVersion(int* v) { return *v = 13000, cudaSuccess; }
inline cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  // SEQFORGE_EMULATED_FREE_BYTES: a GPU with less room, for the checks that plan by it
  const char* bytes = std::getenv("SEQFORGE_EMULATED_FREE_BYTES");
  *free = *total = bytes ? std::strtoull(bytes, nullptr, 10) : size_t{1} << 30;
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  static std::atomic<uintptr_t> next{1};
  *s = reinterpret_cast<cudaStream_t>(next++);
  std::lock_guard lock(sf_emu::mutex);
  sf_emu::streams[*s];
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (const cudaError_t e = sf_emu::refuse_in_capture(s)) return e;
  sf_emu::flush(s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {  // its work still runs, as on a GPU
  std::lock_guard lock(sf_emu::mutex);
  sf_emu::flush(s);
  sf_emu::streams.erase(s);
  return cudaSuccess;
}
// An event: the point of its stream's work at its last record (complete where never recorded).
struct CUevent_st {
  cudaStream_t stream = nullptr;
  uint64_t position = 0;  // the stream's work items before it (in a capture: captured ones)
  bool captured = false;  // recorded in a capture
};
using cudaEvent_t = CUevent_st*;
constexpr unsigned cudaEventDisableTiming = 2;
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = new CUevent_st;
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
  std::lock_guard lock(sf_emu::mutex);
  *e = {};
  if (!s) return cudaSuccess;  // the legacy stream's work is done
  const sf_emu::Stream& q = sf_emu::streams[s];
  *e = {s, q.captured ? q.captured_work : q.enqueued, q.captured};
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned = 0) {
  using namespace sf_emu;
  std::lock_guard lock(mutex);
  if (!e->stream) return cudaSuccess;
  if (!s) {
    flush(e->stream, e->position);
    return cudaSuccess;
  }
  Stream& q = streams[s];
  if (e->captured) {
    if (!streams[e->stream].captured) return cudaSuccess;  // a capture since ended
    if (!q.captured) q.captured = true, q.captured_work = 1, q.rejoined = 0;  // s joins it
    if (s == capture_origin && e->stream != s) {
      Stream& joined = streams[e->stream];
      joined.rejoined = std::max(joined.rejoined, e->position);
    }
    return cudaSuccess;
  }
  if (q.captured) {
    invalidated = true;
    return cudaErrorStreamCaptureIsolation;
  }
  q.queue.push_back({{}, e->stream, e->position});
  ++q.enqueued;
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::lock_guard lock(sf_emu::mutex);
  if (e->captured && sf_emu::is_capturing(e->stream)) return cudaErrorStreamCaptureUnsupported;
  if (e->stream && !e->captured) sf_emu::flush(e->stream, e->position);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* p, int) {
  *p = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) {
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = sf_emu::device_alloc(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
// As on a GPU, a synchronous free waits for all the device's work.
inline cudaError_t cudaFree(void* p) {
  {
    std::lock_guard lock(sf_emu::mutex);
    for (const auto& [s, q] : sf_emu::streams) sf_emu::flush(s);
  }
  sf_emu::device_free(p);
  return cudaSuccess;
}
// Within a capture the backend allocates and frees nothing: refused, as the steps it captures
// must not need either. Freed memory is reused once the free has run in its stream's order.
inline cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t s) {
  if (const cudaError_t e = sf_emu::refuse_in_capture(s)) return e;
  return cudaMalloc(p, bytes);
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (const cudaError_t e = sf_emu::refuse_in_capture(s)) return e;
  sf_emu::enqueue(s, [p] { sf_emu::device_free(p); });
  return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
template <typename T>  // as the runtime's own overloads for typed pointers
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
template <typename T>
cudaError_t cudaMallocAsync(T** p, size_t bytes, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(p), bytes, stream);
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t s) {
  if (kind != cudaMemcpyDeviceToDevice)  // host memory: none in the steps captured here
    if (const cudaError_t e = sf_emu::refuse_in_capture(s)) return e;
  sf_emu::enqueue(s, [=] {
    const sf_emu::Open open;
    std::memmove(dst, src, bytes);
  });
  return cudaSuccess;
}
// On the legacy stream: the (non-blocking) streams' work is not waited for.
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
inline cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                                     size_t width, size_t height, cudaMemcpyKind, cudaStream_t s) {
  sf_emu::enqueue(s, [=] {
    const sf_emu::Open open;
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                   width);
  });
  return cudaSuccess;
}

// Graphs: a capture's ops, launched in order.
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
using cudaGraph_t = sf_emu::Graph*;
using cudaGraphExec_t = sf_emu::Graph*;
inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  using namespace sf_emu;
  std::lock_guard lock(mutex);
  if (recording || !s) return cudaErrorStreamCaptureUnsupported;
  capture_origin = s;
  recording = new Graph;
  invalidated = false;
  streams[s].captured = true;
  streams[s].captured_work = 0;
  return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  using namespace sf_emu;
  std::lock_guard lock(mutex);
  if (!recording || capture_origin != s) return cudaErrorStreamCaptureInvalidated;
  bool unjoined = false;
  for (auto& [h, q] : streams) {
    unjoined |= q.captured && h != s && q.rejoined < q.captured_work;
    q.captured = false;
  }
  capture_origin = nullptr;
  *graph = std::exchange(recording, nullptr);
  if (!invalidated && !unjoined) return cudaSuccess;
  delete *graph;
  *graph = nullptr;
  return invalidated ? cudaErrorStreamCaptureInvalidated : cudaErrorStreamCaptureUnjoined;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                        unsigned long long = 0) {
  *exec = new sf_emu::Graph;
  *(*exec)->ops = *graph->ops;
  return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (sf_emu::is_capturing(s)) return cudaErrorStreamCaptureUnsupported;
  sf_emu::enqueue(s, [ops = exec->ops] {
    for (const auto& op : *ops) op();
  });
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

// For the emulated libraries (cuBLASLt, NCCL): their work opens device memory through
// sf_emu_device_open; a matmul is enqueued on its stream through sf_emu_enqueue (run(state) runs
// it, drop(state) frees it), and an all-reduce runs its stream's work first (sf_emu_synchronize).
extern "C" inline void sf_emu_device_open(int open) { sf_emu::open_device(open != 0); }
extern "C" inline void sf_emu_enqueue(cudaStream_t stream, void* state, void (*run)(void*),
                                      void (*drop)(void*)) {
  std::shared_ptr<void> owned(state, drop);
  sf_emu::enqueue(stream, [owned, run] { run(owned.get()); });
}
extern "C" inline void sf_emu_synchronize(cudaStream_t stream) { sf_emu::flush(stream); }
