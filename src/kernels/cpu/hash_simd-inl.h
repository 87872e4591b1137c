// splitmix64's finalizer on vectors of 64-bit lanes, the counter-based hash behind dropout masks
// (kernels/reference.hpp: hash_uniform; kernels/attention/dropout_mask.hpp), bit for bit. Lanes
// of 64-bit products need AVX-512: on other targets (HWY_TARGET > HWY_AVX3) it is not defined,
// and callers hash element by element.
// Include it after <hwy/highway.h> in a file that goes through hwy/foreach_target.h.
#if defined(SEQFORGE_KERNELS_CPU_HASH_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SEQFORGE_KERNELS_CPU_HASH_SIMD_INL_H_
#undef SEQFORGE_KERNELS_CPU_HASH_SIMD_INL_H_
#else
#define SEQFORGE_KERNELS_CPU_HASH_SIMD_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET <= HWY_AVX3
template <class D>
HWY_INLINE hn::Vec<D> SplitMix64(D d, hn::Vec<D> z) {
  z = hn::Mul(hn::Xor(z, hn::ShiftRight<30>(z)), hn::Set(d, 0xbf58476d1ce4e5b9ull));
  z = hn::Mul(hn::Xor(z, hn::ShiftRight<27>(z)), hn::Set(d, 0x94d049bb133111ebull));
  return hn::Xor(z, hn::ShiftRight<31>(z));
}
#endif

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SEQFORGE_KERNELS_CPU_HASH_SIMD_INL_H_
