#pragma once
// The machine, probed in one place: instruction sets (cpuid, and whether the OS saves AVX-512
// state), the CPU model, the CPUs this process may use (affinity), online CPUs and physical
// cores, and memory (/proc/meminfo); and the precision a config's `precision` resolves to here.
#include <string>
#include <vector>

#include "seqforge/core/dtype.hpp"

namespace seqforge {

struct CpuFeatures {
  bool avx2 = false, avx512f = false, avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_avx512 = false;  // the OS saves AVX-512 state (XCR0)
};
const CpuFeatures& cpu_features();

std::string cpu_model();  // /proc/cpuinfo's model name, or "unknown"
int usable_cpus();        // CPUs in this process's affinity mask (at least 1)
int online_cpus();        // CPUs online on the machine
int physical_cores();     // distinct (package, core) pairs; 0 when unknown
// A /proc/meminfo field in MB ("MemTotal", "MemAvailable"); 0 when unknown.
double meminfo_mb(const std::string& field);
// Memory available to new allocations (MemAvailable, else the free pages), in bytes.
int64_t available_memory_bytes();
// Whether the kernel lets this process use AMX tiles ("granted", "denied by the kernel", ...;
// Linux 5.16+ grants them on request).
std::string amx_permission();
// NVIDIA device nodes in /dev ("nvidia0", "nvidiactl", ...).
std::vector<std::string> nvidia_devices();

// "fp32" -> f32; "bf16" -> bf16 GEMMs where the CPU has AVX512-BF16 or AMX-BF16, otherwise f32
// with `notice` set; "auto" -> bf16 where available, else f32. Throws on any other name.
DType resolve_precision(const std::string& precision, std::string* notice);

}  // namespace seqforge
