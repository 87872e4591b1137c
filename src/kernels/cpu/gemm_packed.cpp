// f32 GEMMs on a packed B, with runtime dispatch through Highway. The recurrent GEMMs of a
// sequence run one shape T times on the same B (h W_hh^T forward, dR W_hh backward) with few rows
// of A (the batch): the libraries' general GEMMs there pack B again at every call or read it
// across its rows. Here B is packed once per step into panels of two vectors' width, k rows each,
// and a micro-kernel holds a block of kRows rows of C by the panel's two vectors in registers,
// one broadcast of A and two FMAs per row and k.
//
// Blocking: a panel's kc rows (kPanelBytes, for L1) pass under every row block of A before the
// next panel's come in; A's block of up to kBlockRows rows by kc (for L2) passes under every panel.
// Each element of C sums its products in order of k, one k block at a time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gemm_packed.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

// clang-format off
#include <hwy/highway.h>
// clang-format on

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm_packed.hpp"
#include "kernels/cpu/pointwise_simd.hpp"
// clang-format off
#include "kernels/cpu/partial_simd-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

#if HWY_TARGET <= HWY_AVX3
constexpr int kRows = 12;  // 32 vector registers: 24 accumulators
#else
constexpr int kRows = 6;  // 16 registers: 12 accumulators, 2 of B, 1 broadcast
#endif
constexpr int64_t kPanelBytes = 16 << 10;
constexpr int64_t kBlockRows = 16 * kRows;

int64_t PanelWidth() { return 2 * static_cast<int64_t>(hn::Lanes(DF())); }

// How a tile's sums reach C: c = alpha sum + keep c + bias (c not read where keep is 0).
struct Epilogue {
  float alpha, keep;
  const float* bias;  // the tile's first column's, or null
};

// c (R, cols <= 2 vectors) from the sums over kc rows of a's R rows (lda apart) and one panel's
// rows (two vectors each).
template <int R>
HWY_INLINE void Tile(const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT bp,
                     int64_t kc, float* HWY_RESTRICT c, int64_t ldc, int64_t cols,
                     const Epilogue& e) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = hn::Zero(d);
  for (int64_t k = 0; k < kc; ++k, bp += 2 * N) {
    const VF b0 = hn::Load(d, bp), b1 = hn::Load(d, bp + N);
    for (int r = 0; r < R; ++r) {
      const VF ar = hn::Set(d, a[r * lda + k]);
      acc0[r] = hn::MulAdd(ar, b0, acc0[r]);
      acc1[r] = hn::MulAdd(ar, b1, acc1[r]);
    }
  }
  const size_t n0 = static_cast<size_t>(std::min(cols, N));
  const size_t n1 = static_cast<size_t>(std::max<int64_t>(cols - N, 0));
  const VF alpha = hn::Set(d, e.alpha), keep = hn::Set(d, e.keep);
  VF bias0 = hn::Zero(d), bias1 = hn::Zero(d);
  if (e.bias) {
    bias0 = LoadN(d, e.bias, n0);
    if (n1) bias1 = LoadN(d, e.bias + N, n1);
  }
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    VF v0 = hn::MulAdd(alpha, acc0[r], bias0), v1 = hn::MulAdd(alpha, acc1[r], bias1);
    if (e.keep != 0) {
      v0 = hn::MulAdd(keep, LoadN(d, cr, n0), v0);
      if (n1) v1 = hn::MulAdd(keep, LoadN(d, cr + N, n1), v1);
    }
    StoreN(v0, d, cr, n0);
    if (n1) StoreN(v1, d, cr + N, n1);
  }
}

int64_t KBlock(int64_t width) {
  return std::max<int64_t>(1, kPanelBytes / (width * static_cast<int64_t>(sizeof(float))));
}

void PackGemmPanels(const GemmShape& s, const float* b, int64_t width, float* panels) {
  const int64_t K = s.k, n = s.n;
  for (int64_t col0 = 0; col0 < n; col0 += width) {
    float* p = panels + col0 * K;  // panel col0 / width: (K, width)
    const int64_t cols = std::min(width, n - col0);
    if (s.trans_b) {  // B (n, k): the panel's rows of B transposed
      transpose32(reinterpret_cast<uint32_t*>(p), width,
                  reinterpret_cast<const uint32_t*>(b + col0 * s.ldb), s.ldb, cols, K);
    } else {
      for (int64_t k = 0; k < K; ++k)
        std::memcpy(p + k * width, b + k * s.ldb + col0, cols * sizeof(float));
    }
    if (cols < width)
      for (int64_t k = 0; k < K; ++k) std::fill(p + k * width + cols, p + (k + 1) * width, 0.0f);
  }
}

void GemmPanels(const GemmShape& s, const float* a, const float* panels, int64_t j0, int64_t j1,
                float* c, const float* bias) {
  const int64_t W = PanelWidth(), K = s.k, kc = KBlock(W);
  for (int64_t i0 = 0; i0 < s.m; i0 += kBlockRows) {
    const int64_t i1 = std::min(s.m, i0 + kBlockRows);
    // (K = 0 still runs one empty block: C = beta C + bias.)
    for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += kc) {
      const int64_t kn = std::min(kc, K - k0);
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t col = j * W, cols = std::min(W, s.n - col);
        const float* bp = panels + j * K * W + k0 * W;
        const Epilogue e{static_cast<float>(s.alpha), k0 == 0 ? static_cast<float>(s.beta) : 1.0f,
                         k0 == 0 && bias ? bias + col : nullptr};
        for (int64_t r = i0; r < i1; r += kRows) {
          WithCount<kRows>(static_cast<int>(std::min<int64_t>(kRows, i1 - r)),
                           [&](auto rows) HWY_ATTR {
                             Tile<decltype(rows)::value>(a + r * s.lda + k0, s.lda, bp, kn,
                                                         c + r * s.ldc + col, s.ldc, cols, e);
                           });
        }
      }
    }
  }
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::simd {

HWY_EXPORT(PanelWidth);
HWY_EXPORT(PackGemmPanels);
HWY_EXPORT(GemmPanels);

int64_t gemm_panel_width() { return HWY_DYNAMIC_DISPATCH(PanelWidth)(); }

int64_t gemm_panels_floats(const GemmShape& s, int64_t width) {
  return (s.n + width - 1) / width * width * s.k;
}

void pack_gemm_panels(const GemmShape& s, const float* b, int64_t width, float* panels) {
  HWY_DYNAMIC_DISPATCH(PackGemmPanels)(s, b, width, panels);
}

void gemm_panels(const GemmShape& s, const float* a, const float* panels, int64_t j0, int64_t j1,
                 float* c, const float* bias) {
  HWY_DYNAMIC_DISPATCH(GemmPanels)(s, a, panels, j0, j1, c, bias);
}

}  // namespace seqforge::simd
#endif
