// `seqforge diagnose [CONFIG] [overrides]`: what this machine offers for training (CPU, ISA, AMX
// permission, memory, oneDNN and its kernels, threads, GPU), and with a config, what it gives
// here (data, memory per batch, seconds per epoch) and the problems found, one line each.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "observe.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/onednn_info.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/resource_monitor.hpp"
#include "seqforge/core/threads.hpp"
#include "seqforge/data/options.hpp"
#include "seqforge/train/trainer.hpp"
#include "validators.hpp"

namespace seqforge::cli {

namespace {

std::string diagnose_config_path;
std::vector<std::string> diagnose_overrides;
int diagnose_steps = 10;

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

const char* yes(bool b) { return b ? "yes" : "no"; }

void print_machine() {
  const CpuFeatures& isa = machine_cpu_features();
  std::printf("machine\n");
  std::printf("  cpu           %s\n", cpu_model().c_str());
  std::printf("  cores         %d physical, %d logical online, %d usable by this process\n",
              physical_cores(), online_cpus(), usable_cpus());
  std::printf(
      "  isa           AVX2 %s, AVX-512 %s%s, AVX512-BF16 %s, AVX512-FP16 %s, AMX-BF16 %s, "
      "AMX-INT8 %s\n",
      yes(isa.avx2), yes(isa.avx512f),
      isa.avx512f && !isa.os_avx512 ? " (but the OS does not enable it)" : "", yes(isa.avx512_bf16),
      yes(isa.avx512_fp16), yes(isa.amx_bf16), yes(isa.amx_int8));
  const std::optional<IsaTier> cap = isa_cap();
  if (cap)
    std::printf(
        "  isa cap       SEQFORGE_MAX_ISA=%s: kernels dispatch up to %s (the CPU's tier: %s)\n",
        isa_tier_name(*cap), isa_tier_name(isa_tier()), isa_tier_name(machine_isa_tier()));
  else
    std::printf("  isa cap       none (SEQFORGE_MAX_ISA unset): kernels dispatch up to %s\n",
                isa_tier_name(isa_tier()));
  std::printf("  amx           %s\n", amx_permission().c_str());
  std::printf("  memory        %.0f MB total, %.0f MB available", meminfo_mb("MemTotal"),
              meminfo_mb("MemAvailable"));
  if (const auto room = cgroup_memory_room())
    std::printf(", %.0f MB under the cgroup's limit", *room / 1048576);
  std::printf("\n");
  const OneDnnInfo dnnl = onednn_info();
  std::printf("  onednn        %s, dispatching up to %s\n", dnnl.version.c_str(), dnnl.isa.c_str());
  // The shapes of a typical step: the recurrent GEMM (batch 64, hidden 128) and the input
  // projection over all time steps.
  std::printf("  kernels       f32 recurrent 64x512x128: %s; projection 6400x512x128: %s\n",
              onednn_matmul_kernel(64, 512, 128, false).c_str(),
              onednn_matmul_kernel(6400, 512, 128, false).c_str());
  if (cpu_features().avx512_bf16 || cpu_features().amx_bf16)
    std::printf("                bf16 recurrent 64x512x128: %s; projection 6400x512x128: %s\n",
                onednn_matmul_kernel(64, 512, 128, true).c_str(),
                onednn_matmul_kernel(6400, 512, 128, true).c_str());
  else
    std::printf("                bf16: none (needs AVX512-BF16 or AMX-BF16; dispatch reaches %s)\n",
                isa_tier_name(isa_tier()));
  std::printf("  openblas      %s\n", openblas_status().c_str());
  std::printf("  blis          %s\n", blis_status().c_str());
  // The f32 provider the CPU backend times and caches per shape, raced here on the same shapes.
  std::printf("  f32 gemms     recurrent 64x512x128: %s; projection 6400x512x128: %s\n",
              f32_gemm_race(64, 512, 128).c_str(), f32_gemm_race(6400, 512, 128).c_str());
  std::printf("  backend       %s\n", make_run_backend()->description().c_str());
  std::printf("  cuda          %s\n", cuda_summary().c_str());
  if (cuda_unavailable_reason().empty())
    std::printf("                %s\n", make_cuda_backend()->description().c_str());
  std::string why;
  const bool bf16 = bf16_gemms_pay_off(&why);
  std::printf("  precision     auto -> %s (%s)\n",
              bf16 ? "bf16 GEMMs, fp32 master weights" : "fp32", why.c_str());
  const ThreadConfig threads = configure_threads();
  std::printf("  threads       %d (%s); OMP_WAIT_POLICY %s\n", threads.threads,
              threads.reason.c_str(),
              std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "unset");
  const std::vector<std::string> devices = nvidia_devices();
  GpuSample gpu;
  const bool nvml = gpu_sample(&gpu);
  std::string gpu_line = nvml ? std::to_string(gpu.devices) + " NVIDIA GPU(s) through NVML"
                              : "none (no NVML driver library";
  if (!nvml) {
    gpu_line += devices.empty() ? ", no /dev/nvidia*" : ", but /dev/" + devices[0] + " exists";
    gpu_line += on_path("nvidia-smi") ? ", nvidia-smi present)" : ", no nvidia-smi)";
  }
  std::printf("  gpu           %s\n", gpu_line.c_str());
}

void print_config(const ConfigDiagnosis& d) {
  const TaskKind task = parse_task(d.task, "diagnose");
  const bool text = task == TaskKind::charlm || task == TaskKind::lm,
             examples = task == TaskKind::text_classify;
  std::printf("config\n");
  std::printf("  task          %s\n", d.task.c_str());
  std::printf("  data          %lld %s; %s per split: %lld train, %lld validation, %lld test\n",
              static_cast<long long>(d.rows),
              text       ? "characters"
              : examples ? "examples"
                         : "rows",
              text       ? "sequences"
              : examples ? "examples"
                         : "windows",
              static_cast<long long>(d.train), static_cast<long long>(d.val),
              static_cast<long long>(d.test));
  std::printf("  model         %lld parameters, %lld time steps per window\n",
              static_cast<long long>(d.parameters), static_cast<long long>(d.steps));
  std::printf("  batch         %lld per batch", static_cast<long long>(d.batch_size));
  if (d.micro_batch < d.batch_size)
    std::printf(" in micro-batches of %lld", static_cast<long long>(d.micro_batch));
  std::printf(", %lld batches per epoch; inputs %.2f MB, activations and gradients about %.1f MB\n",
              static_cast<long long>(d.batches_per_epoch), d.batch_input_mb, d.activation_mb);
  if (!d.micro_batch_note.empty()) std::printf("  micro-batch   %s\n", d.micro_batch_note.c_str());
  if (!d.device.empty())
    std::printf(
        "  gpu           %s, %s GEMMs: a step needs about %.0f MiB; %.0f of %.0f MiB free\n",
        d.device.c_str(), d.device_precision.c_str(), d.device_need_mb, d.device_free_mb,
        d.device_total_mb);
  if (d.timed_steps > 0) {
    std::printf(
        "  speed         %.2f ms per step (median of %d), validation %.3f s; "
        "about %.3g s per epoch\n",
        1e3 * d.step_seconds, d.timed_steps, d.validation_seconds, d.epoch_seconds);
    std::printf("  memory        %.0f MB peak resident during the measured run\n",
                d.measured_peak_mb);
  }
  for (const std::string& note : d.notes) std::printf("note: %s\n", note.c_str());
  if (d.problems.empty()) {
    std::printf("no problems found\n");
  } else {
    std::printf("problems\n");
    for (const auto& p : d.problems) std::printf("  - %s\n", p.c_str());
  }
}

}  // namespace

CLI::App* add_diagnose(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "diagnose", "Describe this machine; with a config, check it and estimate seconds per epoch");
  cmd->add_option("config", diagnose_config_path, "config file (YAML)");
  cmd->add_option("overrides", diagnose_overrides, "key.path=value overrides");
  cmd->add_option("--steps", diagnose_steps, "training steps to time (0: none)")
      ->check(whole_number(0, 1 << 20))
      ->capture_default_str();
  return cmd;
}

int run_diagnose() {
  if (diagnose_steps < 0)
    fail("diagnose: --steps must be 0 (none timed) or more, got ", diagnose_steps);
  // A config that cannot be read is said before anything else.
  const std::optional<Config> config =
      diagnose_config_path.empty()
          ? std::nullopt
          : std::optional<Config>(Config::load(diagnose_config_path, diagnose_overrides));
  if (config) check_settings(*config);
  print_machine();
  std::fflush(stdout);
  if (!config) return 0;
  const ConfigDiagnosis d = diagnose_config(*config, diagnose_steps);
  print_config(d);
  return d.problems.empty() ? 0 : 2;
}

}  // namespace seqforge::cli
