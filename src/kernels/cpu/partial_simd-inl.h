// A row's last, partial vector, and a block's last, partial count of rows, for the Highway
// kernels, compiled once per target: include it after <hwy/highway.h> in a file that goes through
// hwy/foreach_target.h.
#if defined(SEQFORGE_KERNELS_CPU_PARTIAL_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SEQFORGE_KERNELS_CPU_PARTIAL_SIMD_INL_H_
#undef SEQFORGE_KERNELS_CPU_PARTIAL_SIMD_INL_H_
#else
#define SEQFORGE_KERNELS_CPU_PARTIAL_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <type_traits>

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The n <= Lanes(d) values at p, zeros after them; and storing v's first n lanes at p. A whole
// vector goes directly (unaligned), a tail through an aligned buffer, so that nothing past the n
// values is read or written (Highway's masked loads want aligned memory on some targets).
template <class D>
HWY_INLINE hn::Vec<D> LoadN(D d, const float* p, size_t n) {
  if (n == hn::Lanes(d)) return hn::LoadU(d, p);
  HWY_ALIGN float buf[hn::MaxLanes(d)] = {};
  for (size_t i = 0; i < n; ++i) buf[i] = p[i];
  return hn::Load(d, buf);
}
template <class D>
HWY_INLINE void StoreN(hn::Vec<D> v, D d, float* p, size_t n) {
  if (n == hn::Lanes(d)) return hn::StoreU(v, d, p);
  HWY_ALIGN float buf[hn::MaxLanes(d)];
  hn::Store(v, d, buf);
  for (size_t i = 0; i < n; ++i) p[i] = buf[i];
}

// Calls f(std::integral_constant<int, n>()) for 1 <= n <= kMax: a micro-kernel's rows or vectors
// fixed at compile time, its last block's fewer too.
template <int kMax, class F>
HWY_INLINE void WithCount(int n, F&& f) {
  if constexpr (kMax > 1) {
    if (n < kMax) return WithCount<kMax - 1>(n, f);
  }
  f(std::integral_constant<int, kMax>());
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SEQFORGE_KERNELS_CPU_PARTIAL_SIMD_INL_H_
