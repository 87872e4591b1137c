#pragma once
// f32 SIMD row kernels, dispatched at run time to the best instruction set available.
#include <cstdint>

namespace seqforge::simd {

// acc(n) += column sums of dy rows [r0, r1).
void sum_rows(const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc);
// dst(cols, rows) = src(rows, cols)^T, 2- or 4-byte elements; rows ld_src and ld_dst apart.
void transpose16(uint16_t* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols);
void transpose32(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols);
const char* target_name();  // "AVX3", "AVX2", ...

}  // namespace seqforge::simd
