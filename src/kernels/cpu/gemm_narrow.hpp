#pragma once
// C = alpha A^T B + beta C for a B of at most kNarrowGemmMaxN columns (see gemm_narrow.cpp).
#include <cstdint>

#include "seqforge/backend/ops.hpp"

namespace seqforge::simd {

constexpr int64_t kNarrowGemmMaxN = 16;

// Whether gemm_tn_narrow_rows takes the shape: A transposed, B plain, no bias, n small.
inline bool gemm_tn_narrow_fits(const GemmShape& s) {
  return s.trans_a && !s.trans_b && !s.bias && s.n >= 1 && s.n <= kNarrowGemmMaxN;
}

// acc(n, m) += sum over p in [p0, p1) of B[p, :]^T A[p, :]: (A^T B)^T over those rows of A (k, m)
// and B (k, n), f32 or bf16 operands, f32 accumulator.
void gemm_tn_narrow_rows(const GemmShape& s, bool bf16_operands, const void* a, const void* b,
                         int64_t p0, int64_t p1, float* acc);

}  // namespace seqforge::simd
