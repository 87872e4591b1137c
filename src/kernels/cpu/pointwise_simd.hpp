#pragma once
// f32 SIMD row kernels, dispatched at run time to the best instruction set available.
#include <cstdint>

#include "seqforge/core/dtype.hpp"

namespace seqforge::simd {

// acc(n) += column sums of dy rows [r0, r1).
void sum_rows(const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc);
// The same over rows [r0, r1), each row also converted into dst (rows of n bf16) as
// convert_to_bf16 rounds it.
void sum_rows_to_bf16(bf16* dst, const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc);
// The sum of x[i]^2 over i < n, in double.
double sum_squares(const float* x, int64_t n);
// DoRA's backward over rows [r0, r1) of (rows, n): dpre = dy * scale per column, sums(n) += the
// column sums of dy * pre; dy's rows are ldy apart.
void dora_backward_rows(float* dpre, float* sums, const float* dy, int64_t ldy, const float* pre,
                        const float* scale, int64_t n, int64_t r0, int64_t r1);
// Rows [r0, r1) of v (rows, n): inv_norm = 1 / ||v_r||, scale = m_r * inv_norm (DoRA's m / ||V||).
void dora_norm(float* scale, float* inv_norm, const float* v, const float* m, int64_t n, int64_t r0,
               int64_t r1);
// dst[i] = to_bf16(src[i]), i in [0, n).
void convert_to_bf16(bf16* dst, const float* src, int64_t n);
// Elements [i0, i1) of the dropout mask of `seed` into out[0, i1 - i0): 0 where
// ref::counter_hash(seed, i) >> 11 is below drop_below (ref::uniform_below(p)), else keep.
void dropout_mask(float* out, uint64_t seed, int64_t i0, int64_t i1, uint64_t drop_below,
                  float keep);
// dst(cols, rows) = src(rows, cols)^T, 2- or 4-byte elements; rows ld_src and ld_dst apart.
void transpose16(uint16_t* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols);
void transpose32(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols);
const char* target_name();  // "AVX3", "AVX2", ...

}  // namespace seqforge::simd
