#pragma once
// The host emulation's bf16 (cuda_runtime.h beside this): storage, and the host's own rounding
// (round to nearest even, as __float2bfloat16_rn).
#include <cstdint>

#include "seqforge/core/dtype.hpp"

struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  return seqforge::from_bf16(seqforge::bf16{h.bits});
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {seqforge::to_bf16(f).bits}; }
