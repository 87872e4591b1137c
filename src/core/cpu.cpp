#include "seqforge/core/cpu.hpp"

#include <cpuid.h>
#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <set>
#include <utility>

#include "seqforge/core/error.hpp"

namespace seqforge {

const CpuFeatures& machine_cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      f.avx2 = b & (1u << 5);
      f.avx512f = b & (1u << 16);
      f.avx512_fp16 = d & (1u << 23);
      f.amx_bf16 = d & (1u << 22);
      f.amx_tile = d & (1u << 24);
      f.amx_int8 = d & (1u << 25);
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = a & (1u << 5);
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27))) {  // OSXSAVE: XCR0 is readable
      unsigned lo, hi;
      __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
      f.os_avx512 = (lo & 0xe6) == 0xe6;  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM state
    }
    return f;
  }();
  return features;
}

const char* isa_tier_name(IsaTier tier) {
  switch (tier) {
    case IsaTier::baseline:
      return "baseline";
    case IsaTier::avx2:
      return "avx2";
    case IsaTier::avx512:
      return "avx512";
    case IsaTier::avx512_bf16:
      return "avx512_bf16";
    case IsaTier::amx:
      return "amx";
  }
  return "unknown";
}

IsaTier machine_isa_tier() {
  const CpuFeatures& f = machine_cpu_features();
  const bool avx512 = f.avx512f && f.os_avx512;
  if (avx512 && f.amx_bf16 && f.amx_tile) return IsaTier::amx;
  if (avx512 && f.avx512_bf16) return IsaTier::avx512_bf16;
  if (avx512) return IsaTier::avx512;
  return f.avx2 ? IsaTier::avx2 : IsaTier::baseline;
}

std::optional<IsaTier> isa_cap() {
  const char* value = std::getenv("SEQFORGE_MAX_ISA");
  if (!value || !*value) return std::nullopt;
  for (IsaTier t :
       {IsaTier::baseline, IsaTier::avx2, IsaTier::avx512, IsaTier::avx512_bf16, IsaTier::amx})
    if (std::string_view(value) == isa_tier_name(t)) return t;
  fail("SEQFORGE_MAX_ISA: unknown value '", value,
       "' (expected baseline, avx2, avx512, avx512_bf16 or amx)");
}

IsaTier isa_tier() {
  const std::optional<IsaTier> cap = isa_cap();
  return cap ? std::min(*cap, machine_isa_tier()) : machine_isa_tier();
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f = machine_cpu_features();
    const IsaTier tier = isa_tier();
    if (tier < IsaTier::amx) f.amx_tile = f.amx_bf16 = f.amx_int8 = false;
    if (tier < IsaTier::avx512_bf16) f.avx512_bf16 = false;
    if (tier < IsaTier::avx512) f.avx512f = f.avx512_fp16 = false;
    if (tier < IsaTier::avx2) f.avx2 = false;
    return f;
  }();
  return features;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

int online_cpus() { return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))); }

int physical_cores() {
  std::ifstream f("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string package, line;
  while (std::getline(f, line)) {
    if (line.rfind("physical id", 0) == 0) package = line.substr(line.find(':') + 1);
    if (line.rfind("core id", 0) == 0) cores.insert({package, line.substr(line.find(':') + 1)});
  }
  return static_cast<int>(cores.size());
}

double meminfo_mb(const std::string& field) {
  std::ifstream f("/proc/meminfo");
  for (std::string key; f >> key;) {
    double kb = 0;
    f >> kb;
    if (key == field + ":") return kb / 1024;
    f.ignore(1 << 10, '\n');
  }
  return 0;
}

namespace {

// The first number a file holds, or nullopt ("max", absent, unreadable).
std::optional<double> read_number(const std::string& path) {
  std::ifstream f(path);
  double v = 0;
  if (!(f >> v)) return std::nullopt;
  return v;
}

// The sum of fields of a cgroup's memory.stat ("active_file", "inactive_file"), 0 for absent ones.
double memory_stat(const std::string& dir, std::initializer_list<const char*> fields) {
  std::ifstream f(dir + "/memory.stat");
  double sum = 0;
  for (std::string key; f >> key;) {
    double v = 0;
    f >> v;
    for (const char* field : fields)
      if (key == field) sum += v;
  }
  return sum;
}

}  // namespace

std::optional<double> cgroup_memory_room(const std::string& cgroup_file, const std::string& root) {
  std::ifstream f(cgroup_file);
  std::optional<double> room;
  auto take = [&](double limit, double usage, double reclaimable) {
    if (limit <= 0 || limit >= 0x1p60) return;  // no limit (cgroup v1 writes about 2^63)
    const double left = std::max(0.0, limit - std::max(0.0, usage - reclaimable));
    room = room ? std::min(*room, left) : left;
  };
  // Each level of a controller's hierarchy from the process's cgroup up to the mount's root.
  // The path /proc/self/cgroup gives is from the hierarchy's root, which a container may not
  // see: its mount may be some cgroup below the root (its own), so the path is taken from the
  // first of its components that leads to a directory under the mount.
  auto each_level = [](const std::string& mount, std::string path, const auto& visit) {
    std::error_code error;
    while (!path.empty() && !std::filesystem::is_directory(mount + path, error)) {
      const size_t next = path.find('/', 1);
      path = next == std::string::npos ? "" : path.substr(next);
    }
    while (true) {
      visit(mount + path);
      if (path.empty() || path == "/") break;
      path.erase(path.rfind('/'));
    }
  };
  for (std::string line; std::getline(f, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {  // cgroup v2
      each_level(root, path, [&](const std::string& dir) {
        if (const auto limit = read_number(dir + "/memory.max"))
          take(*limit, read_number(dir + "/memory.current").value_or(0),
               memory_stat(dir, {"active_file", "inactive_file"}));
      });
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {  // v1
      each_level(root + "/memory", path, [&](const std::string& dir) {
        if (const auto limit = read_number(dir + "/memory.limit_in_bytes"))
          take(*limit, read_number(dir + "/memory.usage_in_bytes").value_or(0),
               memory_stat(dir, {"total_active_file", "total_inactive_file"}));
      });
    }
  }
  return room;
}

std::optional<double> cgroup_memory_room() {
  return cgroup_memory_room("/proc/self/cgroup", "/sys/fs/cgroup");
}

int64_t available_memory_bytes() {
  double bytes = 0;
  if (const double mb = meminfo_mb("MemAvailable"); mb > 0)
    bytes = mb * 1048576;
  else
    bytes = double(sysconf(_SC_AVPHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  if (const auto room = cgroup_memory_room()) bytes = std::min(bytes, *room);
  return static_cast<int64_t>(bytes);
}

// Linux x86 arch_prctl codes for the dynamically enabled AMX tile state (asm/prctl.h).
constexpr int kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;

// Whether the kernel lets this process use AMX tiles (Linux 5.16+ grants them on request).
std::string amx_permission() {
  if (!machine_cpu_features().amx_tile) return "no AMX on this CPU";
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0)
    return "unknown (the kernel does not support arch_prctl(ARCH_GET_XCOMP_PERM); older than 5.16)";
  if (mask & (1ul << kXfeatureXtiledata)) return "granted";
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0)
    return "granted on request (oneDNN requests it the same way)";
  return "denied by the kernel";
}

std::vector<std::string> nvidia_devices() {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev")) {
    while (const dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("nvidia", 0) == 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

std::string no_bf16_reason() {
  const CpuFeatures& m = machine_cpu_features();
  if (!m.avx512_bf16 && !m.amx_bf16) return "this CPU has neither AVX512-BF16 nor AMX-BF16";
  return std::string("SEQFORGE_MAX_ISA=") + isa_tier_name(isa_tier()) +
         " hides this CPU's bf16 instructions";
}

DType resolve_precision(const std::string& precision, std::string* notice) {
  const CpuFeatures& f = cpu_features();
  const bool bf16 = f.avx512_bf16 || f.amx_bf16;
  if (precision == "fp32") return DType::f32;
  if (precision == "fp16") {  // GPUs only (the CPUs' fp16 instructions are rarer than bf16's)
    if (notice) *notice = "precision fp16: fp16 GEMMs run on GPUs only; fp32 GEMMs";
    return DType::f32;
  }
  if (precision == "bf16" || precision == "auto") {
    if (bf16) return DType::bf16;
    if (notice && precision == "bf16")
      *notice = "precision bf16: " + no_bf16_reason() + "; fp32 GEMMs";
    return DType::f32;
  }
  fail("precision: unknown value '", precision, "' (expected fp32, bf16, fp16 or auto)");
}

}  // namespace seqforge
