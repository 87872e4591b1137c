#pragma once
// Scalar kernels of the adapters (LoRA, DoRA): column scaling of activations, DoRA's per-row
// weight norm and its backward through the column scaling. The reference; the CPU backend runs
// scale_columns from here over row ranges, the other two in SIMD (kernels/cpu/pointwise_simd.cpp).
#include <cmath>
#include <cstdint>

namespace seqforge::kernels {

// Rows [r0, r1) of y (R, C), rows ldy apart, = x * s (C) broadcast over the rows, + b (C) when
// given, + addend (rows ldy apart) when given. y may be x (in place, ldy C) or the addend.
template <typename T>
void scale_columns(T* y, int64_t ldy, const T* addend, const T* x, const T* s, const T* b,
                   int64_t C, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    T* yr = y + r * ldy;
    const T* xr = x + r * C;
    if (addend) {
      const T* ar = addend + r * ldy;
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) yr[j] = ar[j] + (xr[j] * s[j] + (b ? b[j] : T(0)));
    } else if (b) {
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) yr[j] = xr[j] * s[j] + b[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) yr[j] = xr[j] * s[j];
    }
  }
}

// Rows [r0, r1) of DoRA's backward (Backend::dora_backward): dpre = dy * scale per column, and
// sums (C) += the column sums of dy * pre over the rows; dy's rows are ldy apart.
template <typename T, typename Acc>
void dora_backward_rows(T* dpre, Acc* sums, const T* dy, int64_t ldy, const T* pre, const T* scale,
                        int64_t C, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    T* dr = dpre + r * C;
    const T* gr = dy + r * ldy;
    const T* pr = pre + r * C;
#pragma omp simd
    for (int64_t j = 0; j < C; ++j) {
      sums[j] += Acc(gr[j]) * Acc(pr[j]);
      dr[j] = gr[j] * scale[j];
    }
  }
}

// Rows [r0, r1) of v (R, C): inv_norm = 1 / ||v_r||, scale = m_r * inv_norm (DoRA's m / ||V||).
template <typename T>
void dora_norm(T* scale, T* inv_norm, const T* v, const T* m, int64_t C, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    double sq = 0;
    for (int64_t j = 0; j < C; ++j) sq += double(v[r * C + j]) * double(v[r * C + j]);
    const double inv = 1.0 / std::sqrt(sq);
    inv_norm[r] = static_cast<T>(inv);
    scale[r] = static_cast<T>(double(m[r]) * inv);
  }
}

}  // namespace seqforge::kernels
