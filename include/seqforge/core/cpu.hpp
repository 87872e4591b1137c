#pragma once
// What this CPU offers, and the precision a config's `precision` resolves to here.
#include <string>

#include "seqforge/core/dtype.hpp"

namespace seqforge {

struct CpuFeatures {
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false;
};
const CpuFeatures& cpu_features();

// "fp32" -> f32; "bf16" -> bf16 GEMMs where the CPU has AVX512-BF16 or AMX-BF16, otherwise f32
// with `notice` set; "auto" -> bf16 where available, else f32. Throws on any other name.
DType resolve_precision(const std::string& precision, std::string* notice);

}  // namespace seqforge
