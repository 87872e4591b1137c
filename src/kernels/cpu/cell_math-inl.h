// Pointwise math shared by the cells' SIMD kernels, compiled once per target: include it after
// <hwy/highway.h> in a file that goes through hwy/foreach_target.h. Same formulas as the
// reference kernels up to a rational tanh (FastTanh); sigmoid(x) = 0.5 + 0.5 tanh(x / 2) keeps it
// to one approximation that is well-behaved for every input.
#if defined(SEQFORGE_KERNELS_CPU_CELL_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SEQFORGE_KERNELS_CPU_CELL_MATH_INL_H_
#undef SEQFORGE_KERNELS_CPU_CELL_MATH_INL_H_
#else
#define SEQFORGE_KERNELS_CPU_CELL_MATH_INL_H_
#endif

#include <hwy/highway.h>

#include <cstring>

#include "kernels/cpu/bf16_simd-inl.h"
#include "seqforge/core/dtype.hpp"

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE void ToBf16Row(const float* src, bf16* dst, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n_vec = n / N * N;
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t j = 0; j < n_vec; j += N) StoreBf16(d, hn::LoadU(d, src + j), dst + j);
  for (int64_t j = n_vec; j < n; ++j) {
    uint32_t u;
    std::memcpy(&u, src + j, 4);
    out[j] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

// tanh through Lambert's continued fraction tanh(h) = h / (1 + h^2 / (3 + h^2 / (5 + ...)))
// truncated after 13, i.e. h N(u) / D(u) with u = h^2, taken at h = x / 2 and doubled with
// tanh(x) = 2t / (1 + t^2): one division, within 3e-7 of tanh in f32 (relative, for every x;
// beyond |x| = 9 tanh rounds to +-1). Several times faster than an exp-based tanh, and most of an
// LSTM step's pointwise work is tanh. The clamp keeps a NaN a NaN.
template <class D, class V>
HWY_INLINE V FastTanh(D d, V x) {
  const V limit = hn::Set(d, 9.0f);
  const V y = hn::Min(limit, hn::Max(hn::Neg(limit), x));
  const V h = hn::Mul(hn::Set(d, 0.5f), y), u = hn::Mul(h, h);
  V n = hn::MulAdd(u, hn::Set(d, 1.0f), hn::Set(d, 378.0f));
  n = hn::MulAdd(u, n, hn::Set(d, 17325.0f));
  n = hn::MulAdd(u, n, hn::Set(d, 135135.0f));
  V q = hn::MulAdd(u, hn::Set(d, 28.0f), hn::Set(d, 3150.0f));
  q = hn::MulAdd(u, q, hn::Set(d, 62370.0f));
  q = hn::MulAdd(u, q, hn::Set(d, 135135.0f));
  const V num = hn::Mul(y, hn::Mul(n, q));
  const V den = hn::MulAdd(hn::Mul(u, n), n, hn::Mul(q, q));
  return hn::Div(num, den);
}

template <class D, class V>
HWY_INLINE V Sigmoid(D d, V x) {
  const V half = hn::Set(d, 0.5f);
  return hn::MulAdd(half, FastTanh(d, hn::Mul(half, x)), half);
}

// acc(n) += row(n).
HWY_INLINE void AddRow(float* acc, const float* row, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n_vec = n / N * N;
  for (int64_t j = 0; j < n_vec; j += N)
    hn::StoreU(hn::Add(hn::LoadU(d, acc + j), hn::LoadU(d, row + j)), d, acc + j);
  for (int64_t j = n_vec; j < n; ++j) acc[j] += row[j];
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SEQFORGE_KERNELS_CPU_CELL_MATH_INL_H_
