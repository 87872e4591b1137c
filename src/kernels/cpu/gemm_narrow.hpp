#pragma once
// GEMMs with a side of at most kNarrowGemmMaxN columns (see gemm_narrow.cpp): A^T B and A B^T.
#include <cstdint>

#include "seqforge/backend/ops.hpp"

namespace seqforge::simd {

constexpr int64_t kNarrowGemmMaxN = 16;

// Whether gemm_tn_narrow_rows takes the shape: A transposed, B plain, no bias, n small.
inline bool gemm_tn_narrow_fits(const GemmShape& s) {
  return s.trans_a && !s.trans_b && !s.bias && s.n >= 1 && s.n <= kNarrowGemmMaxN;
}

// Whether gemm_nt_narrow_rows takes the shape (B transposed, or plain and transposed first): A
// plain, no bias, n small.
inline bool gemm_nt_narrow_fits(const GemmShape& s) {
  return !s.trans_a && !s.bias && s.n >= 1 && s.n <= kNarrowGemmMaxN;
}

// acc(n, m) += sum over p in [p0, p1) of B[p, :]^T A[p, :]: (A^T B)^T over those rows of A (k, m)
// and B (k, n), f32 or bf16 operands, f32 accumulator.
void gemm_tn_narrow_rows(const GemmShape& s, bool bf16_operands, const void* a, const void* b,
                         int64_t p0, int64_t p1, float* acc);

// C = alpha A B^T + beta C over rows [r0, r1) of A (m, k) and C (m, n); B is (n, k), n small.
void gemm_nt_narrow_rows(const GemmShape& s, bool bf16_operands, const void* a, const void* b,
                         int64_t r0, int64_t r1, float* c);

}  // namespace seqforge::simd
