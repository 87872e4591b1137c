#include "seqforge/core/cpu.hpp"

#include <cpuid.h>

#include "seqforge/core/error.hpp"

namespace seqforge {

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      f.avx2 = b & (1u << 5);
      f.avx512f = b & (1u << 16);
      f.amx_bf16 = d & (1u << 22);
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = a & (1u << 5);
    return f;
  }();
  return features;
}

DType resolve_precision(const std::string& precision, std::string* notice) {
  const CpuFeatures& f = cpu_features();
  const bool bf16 = f.avx512_bf16 || f.amx_bf16;
  if (precision == "fp32") return DType::f32;
  if (precision == "bf16" || precision == "auto") {
    if (bf16) return DType::bf16;
    if (notice && precision == "bf16")
      *notice = "precision bf16: this CPU has neither AVX512-BF16 nor AMX-BF16; training in fp32";
    return DType::f32;
  }
  fail("precision: unknown value '", precision, "' (expected fp32, bf16 or auto)");
}

}  // namespace seqforge
