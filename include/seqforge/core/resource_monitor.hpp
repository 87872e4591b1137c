#pragma once
// A background thread that samples this process's CPU use and memory (and, where the NVIDIA
// driver's NVML library exists, GPU utilisation and memory) every `interval_s` seconds, keeps
// per-interval summaries for metrics.jsonl, and adds counters to the trace when profiling.
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace seqforge {

// This process now: CPU seconds (user + system, all threads), resident and peak resident bytes.
double process_cpu_seconds();
double process_rss_bytes();
double process_peak_rss_bytes();

// GPU figures through NVML, loaded with dlopen at first use (never linked); absent without a
// driver. Utilisation is the mean over devices, memory the sum used on all devices.
struct GpuSample {
  int devices = 0;
  double util_percent = 0, memory_used_mb = 0;
};
bool gpu_sample(GpuSample* out);  // false when NVML or a device is missing

class ResourceMonitor {
 public:
  explicit ResourceMonitor(double interval_s = 0.5);
  ~ResourceMonitor();
  ResourceMonitor(const ResourceMonitor&) = delete;
  ResourceMonitor& operator=(const ResourceMonitor&) = delete;

  // Since the previous call (or construction): cpu_percent (mean CPU use in % of one core, so
  // 200 is two cores busy), rss_mb (mean resident memory), peak_rss_mb (the process's peak so
  // far); gpu_util_percent and gpu_memory_mb only where NVML reports a GPU.
  std::map<std::string, double> interval_summary();

 private:
  void run();
  void sample_locked();  // and counters into the trace when profiling
  double interval_s_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  double start_wall_, start_cpu_;          // the interval's start
  double last_wall_, last_cpu_;            // the previous sample
  double rss_sum_ = 0, gpu_util_sum_ = 0;  // over the interval's samples
  double gpu_mem_last_ = 0;
  int samples_ = 0, gpu_samples_ = 0;
  std::thread thread_;
};

}  // namespace seqforge
