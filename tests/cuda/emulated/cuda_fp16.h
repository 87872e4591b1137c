#pragma once
// The host emulation's half precision (cuda_runtime.h beside this): storage, and the host's own
// rounding.
#include <cstdint>

#include "seqforge/core/dtype.hpp"

struct __half {
  uint16_t bits;
};
inline float __half2float(__half h) { return seqforge::from_f16(h.bits); }
inline __half __float2half_rn(float f) { return {seqforge::to_f16(f)}; }
