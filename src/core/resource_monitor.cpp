#include "seqforge/core/resource_monitor.hpp"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <type_traits>

#include "seqforge/core/profiler.hpp"
#include "seqforge/core/threads.hpp"

namespace seqforge {

namespace {

double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The subset of NVML's C API used here; the layouts are NVML's (nvml.h).
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
using NvmlDevice = void*;

struct Nvml {
  int (*init)() = nullptr;
  int (*device_count)(unsigned int*) = nullptr;
  int (*device_handle)(unsigned int, NvmlDevice*) = nullptr;
  int (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  int (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  bool ok = false;
};

const Nvml& nvml() {
  static const Nvml lib = [] {
    Nvml n;
    void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return n;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      return fn != nullptr;
    };
    n.ok = sym(n.init, "nvmlInit_v2") && sym(n.device_count, "nvmlDeviceGetCount_v2") &&
           sym(n.device_handle, "nvmlDeviceGetHandleByIndex_v2") &&
           sym(n.utilization, "nvmlDeviceGetUtilizationRates") &&
           sym(n.memory, "nvmlDeviceGetMemoryInfo") && n.init() == 0;
    return n;  // the library stays loaded for the process's lifetime
  }();
  return lib;
}

}  // namespace

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double process_rss_bytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<double>(resident) * sysconf(_SC_PAGESIZE) : 0;
}

double process_peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  // ru_maxrss (kB) is updated lazily; never report a peak below the current size.
  return std::max(u.ru_maxrss * 1024.0, process_rss_bytes());
}

bool gpu_sample(GpuSample* out) {
  const Nvml& n = nvml();
  unsigned int count = 0;
  if (!n.ok || n.device_count(&count) != 0 || count == 0) return false;
  GpuSample s;
  for (unsigned int i = 0; i < count; ++i) {
    NvmlDevice d = nullptr;
    NvmlUtilization u{};
    NvmlMemory m{};
    if (n.device_handle(i, &d) != 0 || n.utilization(d, &u) != 0 || n.memory(d, &m) != 0) continue;
    ++s.devices;
    s.util_percent += u.gpu;
    s.memory_used_mb += m.used / 1048576.0;
  }
  if (s.devices == 0) return false;
  s.util_percent /= s.devices;
  *out = s;
  return true;
}

ResourceMonitor::ResourceMonitor(double interval_s) : interval_s_(interval_s) {
  start_wall_ = last_wall_ = wall_s();
  start_cpu_ = last_cpu_ = process_cpu_seconds();
  thread_ = std::thread([this] { run(); });
}

ResourceMonitor::~ResourceMonitor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ResourceMonitor::run() {
  profiler::set_thread_name("resource monitor");
  const CNumbers numbers;
  std::unique_lock lock(mutex_);
  for (;;) {
    if (cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [&] { return stop_; }))
      return;
    sample_locked();
  }
}

void ResourceMonitor::sample_locked() {
  const double wall = wall_s(), cpu = process_cpu_seconds(), rss_mb = process_rss_bytes() / 1048576;
  const double cpu_percent = 100.0 * (cpu - last_cpu_) / std::max(wall - last_wall_, 1e-9);
  last_wall_ = wall;
  last_cpu_ = cpu;
  rss_sum_ += rss_mb;
  ++samples_;
  GpuSample g;
  const bool gpu = gpu_sample(&g);
  if (gpu) {
    gpu_util_sum_ += g.util_percent;
    gpu_mem_last_ = g.memory_used_mb;
    ++gpu_samples_;
  }
  if (profiler::enabled()) {
    profiler::counter("cpu % (100 = one core)", cpu_percent);
    profiler::counter("rss MB", rss_mb);
    if (gpu) {
      profiler::counter("gpu util %", g.util_percent);
      profiler::counter("gpu memory MB", g.memory_used_mb);
    }
  }
}

std::map<std::string, double> ResourceMonitor::interval_summary() {
  std::lock_guard lock(mutex_);
  sample_locked();  // also a counter sample per epoch, for runs shorter than the interval
  const double wall = last_wall_, cpu = last_cpu_;
  std::map<std::string, double> m = {
      {"cpu_percent", 100.0 * (cpu - start_cpu_) / std::max(wall - start_wall_, 1e-9)},
      {"rss_mb", rss_sum_ / samples_},
      {"peak_rss_mb", process_peak_rss_bytes() / 1048576},
  };
  if (gpu_samples_ > 0) {
    m["gpu_util_percent"] = gpu_util_sum_ / gpu_samples_;
    m["gpu_memory_mb"] = gpu_mem_last_;
  }
  start_wall_ = wall;
  start_cpu_ = cpu;
  rss_sum_ = gpu_util_sum_ = 0;
  samples_ = gpu_samples_ = 0;
  return m;
}

}  // namespace seqforge
