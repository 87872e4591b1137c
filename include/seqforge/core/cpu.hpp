#pragma once
// The machine, probed in one place: instruction sets (cpuid, and whether the OS saves AVX-512
// state), the CPU model, the CPUs this process may use (affinity), online CPUs and physical
// cores, and memory (/proc/meminfo); and the precision a config's `precision` resolves to here.
#include <optional>
#include <string>
#include <vector>

#include "seqforge/core/dtype.hpp"

namespace seqforge {

struct CpuFeatures {
  bool avx2 = false, avx512f = false, avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_avx512 = false;  // the OS saves AVX-512 state (XCR0)
};
// The instruction sets kernels may use: the machine's, lowered to the tier SEQFORGE_MAX_ISA names.
const CpuFeatures& cpu_features();
// What the CPU has, whatever the cap.
const CpuFeatures& machine_cpu_features();

// Instruction-set tiers, lowest first. Each adds what the kernels and libraries dispatch on:
// baseline (below AVX2: SSE4 or scalar), AVX2 with FMA, AVX-512 (F, BW, DQ, VL), AVX512-BF16
// dot products, AMX-BF16 tiles.
enum class IsaTier { baseline, avx2, avx512, avx512_bf16, amx };
const char* isa_tier_name(IsaTier tier);  // "baseline", "avx2", "avx512", "avx512_bf16", "amx"
IsaTier machine_isa_tier();               // the highest tier the CPU (and OS) supports
// The cap set by SEQFORGE_MAX_ISA (one of the tier names), or none when unset. Throws on any
// other value.
std::optional<IsaTier> isa_cap();
// The tier kernels dispatch up to: the machine's, at most the cap.
IsaTier isa_tier();

std::string cpu_model();  // /proc/cpuinfo's model name, or "unknown"
int usable_cpus();        // CPUs in this process's affinity mask (at least 1)
int online_cpus();        // CPUs online on the machine
int physical_cores();     // distinct (package, core) pairs; 0 when unknown
// A /proc/meminfo field in MB ("MemTotal", "MemAvailable"); 0 when unknown.
double meminfo_mb(const std::string& field);
// Memory available to new allocations (MemAvailable, else the free pages; at most the room under
// the process's cgroup memory limit, a container's), in bytes.
int64_t available_memory_bytes();
// The room left under this process's cgroup memory limit (a container's, a systemd slice's), in
// bytes: the limit less the usage, the file pages of the page cache, which the kernel reclaims
// before it kills, counted free; the smallest over the cgroup and its parents. nullopt: no limit.
std::optional<double> cgroup_memory_room();
// The same from `cgroup_file` (as /proc/self/cgroup) and the hierarchy mounted at `root` (as
// /sys/fs/cgroup: cgroup v2 there, v1's memory controller under root/memory).
std::optional<double> cgroup_memory_room(const std::string& cgroup_file, const std::string& root);
// Whether the kernel lets this process use AMX tiles ("granted", "denied by the kernel", ...;
// Linux 5.16+ grants them on request).
std::string amx_permission();
// NVIDIA device nodes in /dev ("nvidia0", "nvidiactl", ...).
std::vector<std::string> nvidia_devices();

// Why bf16 GEMMs are not available here: the CPU lacks the instructions, or SEQFORGE_MAX_ISA hides
// them.
std::string no_bf16_reason();
// "fp32" -> f32; "bf16" -> bf16 GEMMs where the CPU (under the cap) has AVX512-BF16 or AMX-BF16,
// otherwise f32 with `notice` set; "auto" -> bf16 where available, else f32; "fp16" -> f32 with
// `notice` set (a GPU backend takes fp16 in backend_precision). Throws on any other name.
DType resolve_precision(const std::string& precision, std::string* notice);

}  // namespace seqforge
