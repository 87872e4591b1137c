// exp for the arguments that softmax, GELU and SiLU take (at most 88), compiled once per target:
// include it after <hwy/highway.h> in a file that goes through hwy/foreach_target.h.
#if defined(SEQFORGE_KERNELS_CPU_EXP_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SEQFORGE_KERNELS_CPU_EXP_SIMD_INL_H_
#undef SEQFORGE_KERNELS_CPU_EXP_SIMD_INL_H_
#else
#define SEQFORGE_KERNELS_CPU_EXP_SIMD_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(y) for y <= 88 (below float's largest value, exp(88.7)), to about 2 ulp; 0 below -86.6,
// where exp(y) is within a factor of 5 of the smallest normal float.
// n = round(y / ln 2), r = y - n ln 2 (ln 2 in two parts), exp(r) by a degree-7 polynomial fitted
// to the range (Cephes' expf coefficients), scaled by 2^n through the exponent field. Half the
// instructions of a general exp, which sets the speed of GELU, SiLU and the softmaxes under AVX2.
// A NaN gives an unspecified value: see ExpAtMost88OrNaN.
template <class D, class V>
HWY_INLINE V ExpAtMost88(D d, V y) {
  const hn::RebindToSigned<D> di;
  const V lowest = hn::Set(d, -86.6f);
  const V clamped = hn::Max(y, lowest);
  // k's low mantissa bits hold n (the magic 1.5 2^23 rounds to an integer and keeps k's exponent).
  const V magic = hn::Set(d, 12582912.0f);
  const V k = hn::MulAdd(clamped, hn::Set(d, 1.44269504088896341f), magic);
  const V n = hn::Sub(k, magic);
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), clamped);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  V p = hn::Set(d, 1.9875691500e-4f);
  for (float c :
       {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = hn::MulAdd(p, r, hn::Set(d, c));
  p = hn::MulAdd(hn::Mul(p, r), r, hn::Add(r, hn::Set(d, 1.0f)));
  const auto scale = hn::ShiftLeft<23>(hn::BitCast(di, k));  // n << 23, wrapped
  const V e = hn::BitCast(d, hn::Add(hn::BitCast(di, p), scale));
  return hn::IfThenZeroElse(hn::Lt(y, lowest), e);
}

// The same, and a NaN stays a NaN (a softmax over a row with a NaN score is NaN, as in PyTorch).
template <class D, class V>
HWY_INLINE V ExpAtMost88OrNaN(D d, V y) {
  return hn::IfThenElse(hn::IsNaN(y), y, ExpAtMost88(d, y));
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SEQFORGE_KERNELS_CPU_EXP_SIMD_INL_H_
