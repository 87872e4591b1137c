#include "seqforge/backend/onednn_info.hpp"

#include <cmath>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "backend/cpu/blas_gemm.hpp"
#include "backend/cpu/cpu_gemm.hpp"
#include "backend/cpu/isa_cap.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/core/cpu.hpp"

namespace seqforge {

namespace {
// bf16 operands cost accuracy and conversions: they are taken only where clearly faster.
constexpr double kBf16Payoff = 1.2;
}  // namespace

OneDnnInfo onednn_info() {
  cpu::cap_library_dispatch();
  OneDnnInfo info;
  const dnnl_version_t* v = dnnl_version();
  info.version =
      std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      info.isa = "sse41";
      break;
    case dnnl_cpu_isa_avx:
      info.isa = "avx";
      break;
    case dnnl_cpu_isa_avx2:
      info.isa = "avx2";
      break;
    case dnnl_cpu_isa_avx2_vnni:
      info.isa = "avx2_vnni";
      break;
    case dnnl_cpu_isa_avx512_mic:
      info.isa = "avx512_mic";
      break;
    case dnnl_cpu_isa_avx512_mic_4ops:
      info.isa = "avx512_mic_4ops";
      break;
    case dnnl_cpu_isa_avx512_core:
      info.isa = "avx512_core";
      break;
    case dnnl_cpu_isa_avx512_core_vnni:
      info.isa = "avx512_core_vnni";
      break;
    case dnnl_cpu_isa_avx512_core_bf16:
      info.isa = "avx512_core_bf16";
      break;
    case dnnl_cpu_isa_avx512_core_amx:
      info.isa = "avx512_core_amx";
      break;
    default:
      info.isa = "other";
      break;
  }
  return info;
}

std::string onednn_matmul_kernel(int64_t m, int64_t n, int64_t k, bool bf16) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  cpu::cap_library_dispatch();
  try {
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    const dt in = bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc a({m, k}, in, tag::ab), b({k, n}, in, tag::ab),
        c({m, n}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine);
    return pd.impl_info_str();
  } catch (const dnnl::error& e) {
    return std::string("unavailable: ") + e.what();
  }
}

std::string openblas_status() { return cpu::blas_status(cpu::BlasLibrary::openblas); }
std::string blis_status() { return cpu::blas_status(cpu::BlasLibrary::blis); }

std::string f32_gemm_race(int64_t m, int64_t n, int64_t k) {
  const GemmShape s{.m = m, .n = n, .k = k, .lda = k, .ldb = n, .ldc = n};
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.25f),
      c(static_cast<size_t>(m * n));
  cpu::OneDnnGemm onednn;
  const cpu::GemmRace r =
      cpu::race_providers(onednn, s, DType::f32, a.data(), b.data(), nullptr, c.data(), nullptr);
  char out[160];
  int used = std::snprintf(out, sizeof out, "onednn %.3f ms", r.onednn_ms);
  for (const auto& [ms, name] :
       {std::pair{r.openblas_ms, "openblas"}, std::pair{r.blis_ms, "blis"}})
    if (std::isfinite(ms))
      used += std::snprintf(out + used, sizeof out - used, ", %s %.3f ms", name, ms);
  std::snprintf(out + used, sizeof out - used, " -> %s", cpu::provider_name(r.winner));
  return out;
}

bool bf16_gemms_pay_off(std::string* why) {
  if (!cpu_features().avx512_bf16 && !cpu_features().amx_bf16) {
    if (why) *why = no_bf16_reason();
    return false;
  }
  if (!autotune::enabled()) {
    if (why) *why = "bf16 instructions (SEQFORGE_AUTOTUNE=0: not timed)";
    return true;
  }
  const double speedup = cpu::bf16_gemm_speedup();
  char line[160];
  std::snprintf(line, sizeof line, "bf16 GEMMs run %.2fx as fast as f32 ones on this CPU", speedup);
  if (why) *why = line;
  return speedup >= kBf16Payoff;
}

}  // namespace seqforge
