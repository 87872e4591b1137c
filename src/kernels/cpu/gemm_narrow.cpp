// GEMMs with one narrow side, with runtime dispatch through Highway.
// - A^T B for a narrow B. The weight gradient of a narrow input, dW_ih(4H, I) = dG^T(4H, T*B)
//   X(T*B, I) with I of a few features, is such a GEMM, and so are a low-rank adapter's
//   gradients, dA(r, in) = dLow^T X and dB(out, r) = dY^T Low. As a general GEMM its tiles are
//   mostly empty and the transposed A is copied first, so it runs far below the GEMM rate. Here A
//   streams through once, row by row, into an (n, m) accumulator that stays in L1.
// - A B^T for a narrow B^T: an adapter's Low = X A^T (r of a few columns). Each output is a dot
//   product along A's row, which stays in L1 while the few rows of B pass over it.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gemm_narrow.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

// clang-format off
#include <hwy/highway.h>
// clang-format on

#include <algorithm>

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

// out[R][O] = the dot products of R rows of A with O rows of B over k.
template <int R, int O, typename In>
HWY_INLINE void DotBlock(int64_t k, const In* const* a, const In* const* b, float (*out)[4]) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), k_vec = k / N * N;
  hn::Vec<decltype(d)> acc[R][O];
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < O; ++o) acc[r][o] = hn::Zero(d);
  for (int64_t p = 0; p < k_vec; p += N) {
    hn::Vec<decltype(d)> x[R];
    for (int r = 0; r < R; ++r) x[r] = LoadRow(d, a[r] + p);
    for (int o = 0; o < O; ++o) {
      const auto w = LoadRow(d, b[o] + p);
      for (int r = 0; r < R; ++r) acc[r][o] = hn::MulAdd(x[r], w, acc[r][o]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < O; ++o) {
      float sum = hn::GetLane(hn::SumOfLanes(d, acc[r][o]));
      for (int64_t p = k_vec; p < k; ++p) sum += Scalar(a[r][p]) * Scalar(b[o][p]);
      out[r][o] = sum;
    }
}

template <int R, typename In>
HWY_INLINE void DotBlockOuts(int outs, int64_t k, const In* const* a, const In* const* b,
                             float (*out)[4]) {
  switch (outs) {
    case 4:
      return DotBlock<R, 4>(k, a, b, out);
    case 3:
      return DotBlock<R, 3>(k, a, b, out);
    case 2:
      return DotBlock<R, 2>(k, a, b, out);
    default:
      return DotBlock<R, 1>(k, a, b, out);
  }
}

// C[r0:r1] = alpha A[r0:r1] B^T + beta C, two rows of A by four of B at a time.
template <typename In>
void RowsTimesNarrowT(const GemmShape& s, const In* a, const In* b, int64_t r0, int64_t r1,
                      float* c) {
  const float alpha = static_cast<float>(s.alpha), beta = static_cast<float>(s.beta);
  for (int64_t r = r0; r < r1; r += 2) {
    const int rows = r + 2 <= r1 ? 2 : 1;
    const In* a_rows[2] = {a + r * s.lda, a + (r + rows - 1) * s.lda};
    for (int64_t i = 0; i < s.n; i += 4) {
      const int outs = static_cast<int>(std::min<int64_t>(4, s.n - i));
      const In* b_rows[4];
      for (int o = 0; o < 4; ++o) b_rows[o] = b + (i + std::min(o, outs - 1)) * s.ldb;
      float dots[2][4];
      if (rows == 2) {
        DotBlockOuts<2>(outs, s.k, a_rows, b_rows, dots);
      } else {
        DotBlockOuts<1>(outs, s.k, a_rows, b_rows, dots);
      }
      for (int rr = 0; rr < rows; ++rr)
        for (int o = 0; o < outs; ++o) {
          float& y = c[(r + rr) * s.ldc + i + o];
          y = alpha * dots[rr][o] + (beta == 0.0f ? 0.0f : beta * y);
        }
    }
  }
}

void GemmNtNarrowRows(const GemmShape& s, bool bf16_operands, const void* a, const void* b,
                      int64_t r0, int64_t r1, float* c) {
  if (bf16_operands) {
    RowsTimesNarrowT(s, static_cast<const bf16*>(a), static_cast<const bf16*>(b), r0, r1, c);
  } else {
    RowsTimesNarrowT(s, static_cast<const float*>(a), static_cast<const float*>(b), r0, r1, c);
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
HWY_EXPORT(GemmNtNarrowRows);

void gemm_tn_narrow_rows(const GemmShape& s, bool bf16_operands, const void* a, const void* b,
                         int64_t p0, int64_t p1, float* acc) {
  HWY_DYNAMIC_DISPATCH(GemmTnNarrowRows)(s, bf16_operands, a, b, p0, p1, acc);
}

void gemm_nt_narrow_rows(const GemmShape& s, bool bf16_operands, const void* a, const void* b,
                         int64_t r0, int64_t r1, float* c) {
  HWY_DYNAMIC_DISPATCH(GemmNtNarrowRows)(s, bf16_operands, a, b, r0, r1, c);
}

}  // namespace seqforge::simd
#endif
