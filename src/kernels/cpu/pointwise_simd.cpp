// SIMD row kernels (column sums, transposes, dropout masks) with runtime dispatch through Highway:
// the best of AVX-512, AVX2, SSE4 and scalar that this CPU supports is chosen on first use.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/pointwise_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstring>
// clang-format off
#include <hwy/highway.h>
// clang-format on

#include "kernels/cpu/pointwise_simd.hpp"
#include "kernels/reference.hpp"
// clang-format off
#include "kernels/cpu/bf16_simd-inl.h"
#include "kernels/cpu/hash_simd-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// db(N) += column sums of dy(rows, N) over rows [r0, r1), into `acc` (N) first.
void SumRows(const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n_vec = n / N * N;
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = dy + r * n;
    for (int64_t j = 0; j < n_vec; j += N)
      hn::StoreU(hn::Add(hn::LoadU(d, acc + j), hn::LoadU(d, row + j)), d, acc + j);
    for (int64_t j = n_vec; j < n; ++j) acc[j] += row[j];
  }
}

// The sum of x[i]^2, i < n, in double: four accumulators of the vector's width in f64 (one would
// wait on its own latency, well below memory's pace), then a scalar tail.
double SumSquares(const float* x, int64_t n) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;  // as many floats as a vector has doubles
  const int64_t N = static_cast<int64_t>(hn::Lanes(dd));
  auto a0 = hn::Zero(dd), a1 = a0, a2 = a0, a3 = a0;
  const auto square = [&](int64_t i, hn::Vec<decltype(dd)> acc) {
    const auto v = hn::PromoteTo(dd, hn::LoadU(df, x + i));
    return hn::MulAdd(v, v, acc);
  };
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = square(i, a0);
    a1 = square(i + N, a1);
    a2 = square(i + 2 * N, a2);
    a3 = square(i + 3 * N, a3);
  }
  for (; i + N <= n; i += N) a0 = square(i, a0);
  double total = hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) total += double(x[i]) * double(x[i]);
  return total;
}

// Rows [r0, r1) of DoRA's backward (kernels/adapter.hpp, dora_backward_rows): dpre = dy * scale
// per column; sums(n) += column sums of dy * pre; dy's rows ldy apart.
void DoraBackwardRows(float* dpre, float* sums, const float* dy, int64_t ldy, const float* pre,
                      const float* scale, int64_t n, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n_vec = n / N * N;
  for (int64_t r = r0; r < r1; ++r) {
    float* dr = dpre + r * n;
    const float *gr = dy + r * ldy, *pr = pre + r * n;
    for (int64_t j = 0; j < n_vec; j += N) {
      const auto g = hn::LoadU(d, gr + j);
      hn::StoreU(hn::MulAdd(g, hn::LoadU(d, pr + j), hn::LoadU(d, sums + j)), d, sums + j);
      hn::StoreU(hn::Mul(g, hn::LoadU(d, scale + j)), d, dr + j);
    }
    for (int64_t j = n_vec; j < n; ++j) {
      sums[j] += gr[j] * pr[j];
      dr[j] = gr[j] * scale[j];
    }
  }
}

// Rows [r0, r1) of v (rows, n), DoRA's weight norm (kernels/adapter.hpp, dora_norm):
// inv_norm = 1 / ||v_r||, scale = m_r inv_norm, the squares summed in f64.
void DoraNorm(float* scale, float* inv_norm, const float* v, const float* m, int64_t n, int64_t r0,
              int64_t r1) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;  // half a vector of floats, widened to doubles
  const int64_t N = static_cast<int64_t>(hn::Lanes(dd)), n_vec = n / N * N;
  for (int64_t r = r0; r < r1; ++r) {
    const float* vr = v + r * n;
    auto acc = hn::Zero(dd);
    for (int64_t j = 0; j < n_vec; j += N) {
      const auto x = hn::PromoteTo(dd, hn::LoadU(df, vr + j));
      acc = hn::MulAdd(x, x, acc);
    }
    double sq = hn::GetLane(hn::SumOfLanes(dd, acc));
    for (int64_t j = n_vec; j < n; ++j) sq += double(vr[j]) * double(vr[j]);
    const double inv = 1.0 / std::sqrt(sq);
    inv_norm[r] = static_cast<float>(inv);
    scale[r] = static_cast<float>(double(m[r]) * inv);
  }
}

// dst[i] = src[i] rounded to bf16 (to_bf16), i in [0, n).
void ToBf16(bf16* dst, const float* src, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) StoreBf16(d, hn::LoadU(d, src + i), dst + i);
  for (; i < n; ++i) dst[i] = seqforge::to_bf16(src[i]);
}

// SumRows, each row also converted into dst (rows of n bf16).
void SumRowsToBf16(bf16* dst, const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n_vec = n / N * N;
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = dy + r * n;
    for (int64_t j = 0; j < n_vec; j += N) {
      const auto v = hn::LoadU(d, row + j);
      hn::StoreU(hn::Add(hn::LoadU(d, acc + j), v), d, acc + j);
      StoreBf16(d, v, dst + r * n + j);
    }
    for (int64_t j = n_vec; j < n; ++j) acc[j] += row[j];
    if (n_vec < n) ToBf16(dst + r * n + n_vec, row + n_vec, n - n_vec);
  }
}

// Elements [i0, i1) of a dropout mask of `seed` into out[0, i1 - i0): 0 where element i's
// counter_hash(seed, i) >> 11 is below drop_below, else keep.
void DropoutMask(float* out, uint64_t seed, int64_t i0, int64_t i1, uint64_t drop_below,
                 float keep) {
  int64_t i = i0;
#if HWY_TARGET <= HWY_AVX3
  const hn::ScalableTag<uint64_t> du;
  const hn::Rebind<uint32_t, decltype(du)> du32;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du));
  const auto golden = hn::Set(du, 0x9e3779b97f4a7c15ull),
             offset = hn::Set(du, 0x632be59bd9b4e019ull);
  const auto vseed = hn::Set(du, seed), below = hn::Set(du, drop_below);
  uint32_t keep_u32;
  std::memcpy(&keep_u32, &keep, 4);
  const auto keep_bits = hn::Set(du, uint64_t{keep_u32});
  for (auto index = hn::Iota(du, uint64_t(i)); i + N <= i1; i += N) {
    const auto z = SplitMix64(du, hn::Xor(vseed, hn::Add(hn::Mul(index, golden), offset)));
    const auto bits = hn::IfThenZeroElse(hn::Gt(below, hn::ShiftRight<11>(z)), keep_bits);
    hn::StoreU(hn::TruncateTo(du32, bits), du32, reinterpret_cast<uint32_t*>(out + (i - i0)));
    index = hn::Add(index, hn::Set(du, uint64_t(N)));
  }
#endif
  for (; i < i1; ++i)
    out[i - i0] = (ref::counter_hash(seed, uint64_t(i)) >> 11) < drop_below ? 0.0f : keep;
}

// dst(cols, rows) = src(rows, cols)^T for 2- and 4-byte elements, in 8 x 8 blocks (2 bytes:
// 128-bit vectors, three rounds of interleaves; 4 bytes: 256-bit vectors where there are any,
// else 4 x 4 blocks); the edges, and targets without 128-bit vectors, element by element. A strip
// of one cache line of source columns at a time, so that the destination rows fill front to back
// rather than all of them a piece at a time.
template <typename T>
HWY_INLINE void TransposeEdges(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows,
                               int64_t cols, int64_t rows_done, int64_t cols_done) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r < rows_done ? cols_done : 0; c < cols; ++c)
      dst[c * ld_dst + r] = src[r * ld_src + c];
}

void Transpose16(uint16_t* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols) {
#if HWY_TARGET == HWY_SCALAR
  TransposeEdges(dst, ld_dst, src, ld_src, rows, cols, 0, 0);
#else
  const hn::Full128<uint16_t> d16;
  const hn::Full128<uint32_t> d32;
  const hn::Full128<uint64_t> d64;
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (int64_t c0 = 0; c0 < cols8; c0 += 32)  // 32 destination rows, filled front to back
    for (int64_t r = 0; r < rows8; r += 8)
      for (int64_t c = c0; c < std::min(c0 + 32, cols8); c += 8) {
        const uint16_t* s = src + r * ld_src + c;
        hn::Vec<decltype(d32)> t[8];
        for (int k = 0; k < 4; ++k) {  // pairs of rows, interleaved element by element
          const auto a = hn::LoadU(d16, s + 2 * k * ld_src),
                     b = hn::LoadU(d16, s + (2 * k + 1) * ld_src);
          t[2 * k] = hn::BitCast(d32, hn::InterleaveLower(d16, a, b));
          t[2 * k + 1] = hn::BitCast(d32, hn::InterleaveUpper(d16, a, b));
        }
        hn::Vec<decltype(d64)> u[8];
        for (int k = 0; k < 2; ++k)  // then pairs of those, two elements at a time
          for (int h = 0; h < 2; ++h) {
            const auto a = t[4 * k + h], b = t[4 * k + 2 + h];
            u[4 * k + 2 * h] = hn::BitCast(d64, hn::InterleaveLower(d32, a, b));
            u[4 * k + 2 * h + 1] = hn::BitCast(d64, hn::InterleaveUpper(d32, a, b));
          }
        uint16_t* o = dst + c * ld_dst + r;
        for (int k = 0; k < 4; ++k) {  // and the two halves of the block, four at a time
          hn::StoreU(hn::BitCast(d16, hn::InterleaveLower(d64, u[k], u[k + 4])), d16,
                     o + 2 * k * ld_dst);
          hn::StoreU(hn::BitCast(d16, hn::InterleaveUpper(d64, u[k], u[k + 4])), d16,
                     o + (2 * k + 1) * ld_dst);
        }
      }
  TransposeEdges(dst, ld_dst, src, ld_src, rows, cols, rows8, cols8);
#endif
}

#if HWY_TARGET <= HWY_AVX2
// An 8 x 8 block in 256-bit vectors: interleaves within 128-bit halves, then the halves swapped.
HWY_INLINE void Transpose32Block8(uint32_t* o, int64_t ld_dst, const uint32_t* s, int64_t ld_src) {
  const hn::Full256<uint32_t> d32;
  const hn::Full256<uint64_t> d64;
  hn::Vec<decltype(d32)> t[8];
  for (int k = 0; k < 4; ++k) {
    const auto a = hn::LoadU(d32, s + 2 * k * ld_src), b = hn::LoadU(d32, s + (2 * k + 1) * ld_src);
    t[2 * k] = hn::InterleaveLower(d32, a, b);
    t[2 * k + 1] = hn::InterleaveUpper(d32, a, b);
  }
  hn::Vec<decltype(d32)> u[8];  // u[k]: columns k and k + 4 of rows 0-3; u[k + 4]: of rows 4-7
  for (int k = 0; k < 2; ++k)
    for (int h = 0; h < 2; ++h) {
      const auto a = hn::BitCast(d64, t[4 * k + h]), b = hn::BitCast(d64, t[4 * k + 2 + h]);
      u[4 * k + 2 * h] = hn::BitCast(d32, hn::InterleaveLower(d64, a, b));
      u[4 * k + 2 * h + 1] = hn::BitCast(d32, hn::InterleaveUpper(d64, a, b));
    }
  for (int k = 0; k < 4; ++k) {
    hn::StoreU(hn::ConcatLowerLower(d32, u[k + 4], u[k]), d32, o + k * ld_dst);
    hn::StoreU(hn::ConcatUpperUpper(d32, u[k + 4], u[k]), d32, o + (k + 4) * ld_dst);
  }
}
constexpr int64_t kBlock32 = 8;
#elif HWY_TARGET != HWY_SCALAR
// A 4 x 4 block of 4-byte elements at s (rows ld_src apart) to o (rows ld_dst apart).
HWY_INLINE void Transpose32Block4(uint32_t* o, int64_t ld_dst, const uint32_t* s, int64_t ld_src) {
  const hn::Full128<uint32_t> d32;
  const hn::Full128<uint64_t> d64;
  const auto r0 = hn::LoadU(d32, s), r1 = hn::LoadU(d32, s + ld_src);
  const auto r2 = hn::LoadU(d32, s + 2 * ld_src), r3 = hn::LoadU(d32, s + 3 * ld_src);
  const auto a = hn::BitCast(d64, hn::InterleaveLower(d32, r0, r1));
  const auto b = hn::BitCast(d64, hn::InterleaveUpper(d32, r0, r1));
  const auto e = hn::BitCast(d64, hn::InterleaveLower(d32, r2, r3));
  const auto f = hn::BitCast(d64, hn::InterleaveUpper(d32, r2, r3));
  hn::StoreU(hn::BitCast(d32, hn::InterleaveLower(d64, a, e)), d32, o);
  hn::StoreU(hn::BitCast(d32, hn::InterleaveUpper(d64, a, e)), d32, o + ld_dst);
  hn::StoreU(hn::BitCast(d32, hn::InterleaveLower(d64, b, f)), d32, o + 2 * ld_dst);
  hn::StoreU(hn::BitCast(d32, hn::InterleaveUpper(d64, b, f)), d32, o + 3 * ld_dst);
}
constexpr int64_t kBlock32 = 4;
#endif

void Transpose32(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols) {
#if HWY_TARGET == HWY_SCALAR
  TransposeEdges(dst, ld_dst, src, ld_src, rows, cols, 0, 0);
#else
  constexpr int64_t n = kBlock32;
  const int64_t rows_n = rows / n * n, cols_n = cols / n * n;
  for (int64_t c0 = 0; c0 < cols_n; c0 += 16)  // 16 destination rows, filled front to back
    for (int64_t r = 0; r < rows_n; r += n)
      for (int64_t c = c0; c < std::min(c0 + 16, cols_n); c += n) {
#if HWY_TARGET <= HWY_AVX2
        Transpose32Block8(dst + c * ld_dst + r, ld_dst, src + r * ld_src + c, ld_src);
#else
        Transpose32Block4(dst + c * ld_dst + r, ld_dst, src + r * ld_src + c, ld_src);
#endif
      }
  TransposeEdges(dst, ld_dst, src, ld_src, rows, cols, rows_n, cols_n);
#endif
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::simd {

HWY_EXPORT(SumRows);
HWY_EXPORT(SumSquares);
HWY_EXPORT(SumRowsToBf16);
HWY_EXPORT(DoraBackwardRows);
HWY_EXPORT(DoraNorm);
HWY_EXPORT(DropoutMask);
HWY_EXPORT(ToBf16);
HWY_EXPORT(Transpose16);
HWY_EXPORT(Transpose32);
HWY_EXPORT(TargetName);

void sum_rows(const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc) {
  HWY_DYNAMIC_DISPATCH(SumRows)(dy, n, r0, r1, acc);
}
void sum_rows_to_bf16(bf16* dst, const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc) {
  HWY_DYNAMIC_DISPATCH(SumRowsToBf16)(dst, dy, n, r0, r1, acc);
}
double sum_squares(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(SumSquares)(x, n); }
void dora_backward_rows(float* dpre, float* sums, const float* dy, int64_t ldy, const float* pre,
                        const float* scale, int64_t n, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(DoraBackwardRows)(dpre, sums, dy, ldy, pre, scale, n, r0, r1);
}
void dora_norm(float* scale, float* inv_norm, const float* v, const float* m, int64_t n, int64_t r0,
               int64_t r1) {
  HWY_DYNAMIC_DISPATCH(DoraNorm)(scale, inv_norm, v, m, n, r0, r1);
}
void convert_to_bf16(bf16* dst, const float* src, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ToBf16)(dst, src, n);
}
void dropout_mask(float* out, uint64_t seed, int64_t i0, int64_t i1, uint64_t drop_below,
                  float keep) {
  HWY_DYNAMIC_DISPATCH(DropoutMask)(out, seed, i0, i1, drop_below, keep);
}
void transpose16(uint16_t* dst, int64_t ld_dst, const uint16_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols) {
  HWY_DYNAMIC_DISPATCH(Transpose16)(dst, ld_dst, src, ld_src, rows, cols);
}
void transpose32(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows,
                 int64_t cols) {
  HWY_DYNAMIC_DISPATCH(Transpose32)(dst, ld_dst, src, ld_src, rows, cols);
}
const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace seqforge::simd
#endif
