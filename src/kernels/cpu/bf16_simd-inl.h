// bf16 <-> f32 vector conversions for the Highway kernels, compiled once per target: include it
// after <hwy/highway.h> in a file that goes through hwy/foreach_target.h.
#if defined(SEQFORGE_KERNELS_CPU_BF16_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SEQFORGE_KERNELS_CPU_BF16_SIMD_INL_H_
#undef SEQFORGE_KERNELS_CPU_BF16_SIMD_INL_H_
#else
#define SEQFORGE_KERNELS_CPU_BF16_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include "seqforge/core/dtype.hpp"

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// v's bits rounded to bf16 as to_bf16 does (to nearest even on the integer bits, a NaN kept a
// quiet NaN rather than rounded into an infinity), the bf16 in the upper 16 bits of each lane.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> Bf16Bits(D /*d*/, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, v);
  const auto rounded =
      hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
  const auto quiet = hn::Or(u, hn::Set(du, 0x400000u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
}

// v rounded to bf16 (Bf16Bits), as f32.
template <class D>
HWY_INLINE hn::Vec<D> RoundToBf16(D d, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  return hn::BitCast(d, hn::And(Bf16Bits(d, v), hn::Set(du, 0xffff0000u)));
}

// Stores v as bf16 (Bf16Bits).
template <class D>
HWY_INLINE void StoreBf16(D d, hn::Vec<D> v, bf16* dst) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint16_t, D> d16;
  const auto bits = hn::ShiftRight<16>(Bf16Bits(d, v));
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, bits)), d16, reinterpret_cast<uint16_t*>(dst));
}

// bf16 -> f32 is a shift of the bits.
template <class D>
HWY_INLINE hn::Vec<D> LoadBf16(D d, const bf16* src) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<uint16_t, D> d16;
  const auto bits = hn::LoadU(d16, reinterpret_cast<const uint16_t*>(src));
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, bits)));
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SEQFORGE_KERNELS_CPU_BF16_SIMD_INL_H_
