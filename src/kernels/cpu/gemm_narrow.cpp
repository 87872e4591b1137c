// A^T B for a narrow B, with runtime dispatch through Highway. The weight gradient of a narrow
// input, dW_ih(4H, I) = dG^T(4H, T*B) X(T*B, I) with I of a few features, is such a GEMM: as a
// general GEMM its tiles are mostly empty and the transposed A is copied first, so it runs far
// below the GEMM rate. Here A streams through once, row by row, into an (n, m) accumulator that
// stays in L1.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gemm_narrow.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

// clang-format off
#include <hwy/highway.h>
// clang-format on

#include "kernels/cpu/bf16_simd-inl.h"
#include "kernels/cpu/gemm_narrow.hpp"

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const float* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const bf16* p) {
  return LoadBf16(d, p);
}
inline float Scalar(float v) { return v; }
inline float Scalar(bf16 v) { return from_bf16(v); }

// acc(n, m) += A[p0:p1]^T B[p0:p1], eight rows of A at a time so that each accumulator load and
// store carries eight FMAs.
template <typename In>
void AccumulateTn(const GemmShape& s, const In* a, const In* b, int64_t p0, int64_t p1,
                  float* acc) {
  constexpr int R = 8;
  const hn::ScalableTag<float> d;
  const int64_t m = s.m, n = s.n, N = static_cast<int64_t>(hn::Lanes(d)), m_vec = m / N * N;
  float bv[R][kNarrowGemmMaxN];
  int64_t p = p0;
  for (; p + R <= p1; p += R) {
    for (int r = 0; r < R; ++r)
      for (int64_t i = 0; i < n; ++i) bv[r][i] = Scalar(b[(p + r) * s.ldb + i]);
    const In* a0 = a + p * s.lda;
    for (int64_t j = 0; j < m_vec; j += N) {
      hn::Vec<decltype(d)> x[R];
      for (int r = 0; r < R; ++r) x[r] = LoadRow(d, a0 + r * s.lda + j);
      for (int64_t i = 0; i < n; ++i) {
        float* out = acc + i * m + j;
        auto v = hn::LoadU(d, out);
        for (int r = 0; r < R; ++r) v = hn::MulAdd(hn::Set(d, bv[r][i]), x[r], v);
        hn::StoreU(v, d, out);
      }
    }
    for (int64_t j = m_vec; j < m; ++j)
      for (int64_t i = 0; i < n; ++i)
        for (int r = 0; r < R; ++r) acc[i * m + j] += bv[r][i] * Scalar(a0[r * s.lda + j]);
  }
  for (; p < p1; ++p) {
    const In* row = a + p * s.lda;
    for (int64_t i = 0; i < n; ++i) {
      const float w = Scalar(b[p * s.ldb + i]);
      float* out = acc + i * m;
      for (int64_t j = 0; j < m_vec; j += N)
        hn::StoreU(hn::MulAdd(hn::Set(d, w), LoadRow(d, row + j), hn::LoadU(d, out + j)), d,
                   out + j);
      for (int64_t j = m_vec; j < m; ++j) out[j] += w * Scalar(row[j]);
    }
  }
}

void GemmTnNarrowRows(const GemmShape& s, bool bf16_operands, const void* a, const void* b,
                      int64_t p0, int64_t p1, float* acc) {
  if (bf16_operands) {
    AccumulateTn(s, static_cast<const bf16*>(a), static_cast<const bf16*>(b), p0, p1, acc);
  } else {
    AccumulateTn(s, static_cast<const float*>(a), static_cast<const float*>(b), p0, p1, acc);
  }
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::simd {

HWY_EXPORT(GemmTnNarrowRows);

void gemm_tn_narrow_rows(const GemmShape& s, bool bf16_operands, const void* a, const void* b,
                         int64_t p0, int64_t p1, float* acc) {
  HWY_DYNAMIC_DISPATCH(GemmTnNarrowRows)(s, bf16_operands, a, b, p0, p1, acc);
}

}  // namespace seqforge::simd
#endif
