// Layer norm and GELU in f32 SIMD (Highway, dispatched at run time), forward and backward. The
// scalar forms in kernels/norm.hpp are the reference.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/norm_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <type_traits>

#include <hwy/highway.h>

#include "kernels/cpu/norm_simd.hpp"
// clang-format off
#include "kernels/cpu/exp_simd-inl.h"
#include "kernels/cpu/partial_simd-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x^2 - sq exactly, sq = x^2 rounded: by an FMA, or where the target has none, by splitting x into
// halves of 12 bits (Dekker).
template <class D, class V>
HWY_INLINE V SquareError(D d, V x, V sq) {
#if HWY_NATIVE_FMA
  (void)d;
  return hn::MulSub(x, x, sq);
#else
  const V c = hn::Mul(x, hn::Set(d, 4097.0f));
  const V hi = hn::Sub(c, hn::Sub(c, x)), lo = hn::Sub(x, hi);
  const V err = hn::Add(hn::Sub(hn::Mul(hi, hi), sq), hn::Mul(hn::Add(hi, hi), lo));
  return hn::Add(err, hn::Mul(lo, lo));
#endif
}

// Phi(x), the normal distribution function, and gauss = exp(-x^2 / 2), to a few ulp (relative
// error at most 2e-6 down to x = -13, below which Phi is no longer a normal float). With
// z = |x| / sqrt 2 and t = 1 / (1 + z / 2): erfc(z) / 2 = t exp(-z^2) Q(u), Q a polynomial of
// degree 9 in u = 2.4 t - 1.4 fitted by scripts/fit_gelu_erfc.py to relative error 2e-8 on z in
// [0, 10] (t in [1/6, 1], u in [-1, 1]); beyond, exp(-z^2) is below float's range and the
// product 0. The tail keeps its relative precision: Phi(x) = erfc(z) / 2 for x < 0, else
// 1 - erfc(z) / 2.
template <class D, class V>
HWY_INLINE V Phi(D d, V x, V& gauss) {
  // t by a reciprocal estimate and one Newton step (|x| clamped: t stays finite and in range).
  const V ax = hn::Min(hn::Abs(x), hn::Set(d, 16.0f));
  const V a = hn::MulAdd(ax, hn::Set(d, 0.35355339059f), hn::Set(d, 1.0f));
  const V r = hn::ApproximateReciprocal(a);
  const V t = hn::Mul(r, hn::NegMulAdd(a, r, hn::Set(d, 2.0f)));
  const V u = hn::MulAdd(t, hn::Set(d, 2.4f), hn::Set(d, -1.4f));
  V q = hn::Set(d, 2.324899973e-06f);
  for (float c :
       {-2.669278680e-05f, 4.597583472e-06f, 2.927962316e-04f, -3.114937972e-04f, -3.075302434e-03f,
        2.981861276e-03f, 5.101469017e-02f, 1.631112177e-01f, 2.860059914e-01f})
    q = hn::MulAdd(q, u, hn::Set(d, c));
  // x^2 = sq + sq_low exactly: exp(-sq / 2) (1 - sq_low / 2), so that the tail keeps its digits
  // (of the clamped |x|: gauss is 0 beyond either way, and sq_low stays finite at x = +-inf).
  const V sq = hn::Mul(ax, ax), sq_low = SquareError(d, ax, sq);
  const V e = ExpAtMost88(d, hn::Mul(sq, hn::Set(d, -0.5f)));
  gauss = hn::Mul(e, hn::NegMulAdd(sq_low, hn::Set(d, 0.5f), hn::Set(d, 1.0f)));
  const V half_erfc = hn::Mul(hn::Mul(t, gauss), q);
  return hn::IfThenElse(hn::Lt(x, hn::Zero(d)), half_erfc, hn::Sub(hn::Set(d, 1.0f), half_erfc));
}

// x * scale + bias per column (kScale, kBias: given), rounded as scale_columns rounds it.
template <bool kScale, bool kBias, class D>
HWY_INLINE hn::Vec<D> Mapped(D d, hn::Vec<D> x, const float* scale, const float* bias, int64_t j,
                             size_t n) {
  if constexpr (kScale) x = hn::Mul(x, LoadN(d, scale + j, n));
  if constexpr (kBias) x = hn::Add(x, LoadN(d, bias + j, n));
  return x;
}

// f(std::bool_constant<a>, std::bool_constant<b>, std::bool_constant<c>): which inputs a loop
// has, fixed at compile time, so that it carries no branch for them.
template <class F>
HWY_INLINE void WithFlags(bool a, bool b, bool c, F&& f) {
  const auto third = [&](auto A, auto B) {
    c ? f(A, B, std::true_type{}) : f(A, B, std::false_type{});
  };
  const auto second = [&](auto A) { b ? third(A, std::true_type{}) : third(A, std::false_type{}); };
  a ? second(std::true_type{}) : second(std::false_type{});
}

// step(i, j, n) for the vectors of rows [r0, r1) of C columns: element i, column j, n lanes
// (whole vectors, then a row's tail).
template <class D, class Step>
HWY_INLINE void ForRowVectors(D d, int64_t C, int64_t r0, int64_t r1, Step&& step) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = r0; r < r1; ++r) {
    int64_t j = 0;
    for (; j + N <= C; j += N) step(r * C + j, j, hn::Lanes(d));
    if (j < C) step(r * C + j, j, static_cast<size_t>(C - j));
  }
}

// Rows [r0, r1) of x (rows of C): y = GELU(m), m = x mapped per column.
void GeluForward(float* y, const float* x, const float* scale, const float* bias, int64_t C,
                 int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  WithFlags(scale, bias, false, [&](auto has_scale, auto has_bias, auto) {
    ForRowVectors(d, C, r0, r1, [&](int64_t i, int64_t j, size_t n) {
      const auto v = Mapped<has_scale, has_bias>(d, LoadN(d, x + i, n), scale, bias, j, n);
      hn::Vec<decltype(d)> gauss;
      StoreN(hn::Mul(v, Phi(d, v, gauss)), d, y + i, n);
    });
  });
}

// Rows [r0, r1): dm = dy (Phi(m) + m phi(m)), phi(m) = exp(-m^2 / 2) / sqrt(2 pi); dx = dm *
// scale (dx may be dy); sums (C), where given, gain dm * x.
void GeluBackward(float* dx, float* sums, const float* dy, const float* x, const float* scale,
                  const float* bias, int64_t C, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  WithFlags(scale, bias, sums, [&](auto has_scale, auto has_bias, auto has_sums) {
    ForRowVectors(d, C, r0, r1, [&](int64_t i, int64_t j, size_t n) {
      const auto xv = LoadN(d, x + i, n);
      const auto v = Mapped<has_scale, has_bias>(d, xv, scale, bias, j, n);
      hn::Vec<decltype(d)> gauss;
      const auto phi = Phi(d, v, gauss);
      auto dm = hn::Mul(LoadN(d, dy + i, n),
                        hn::MulAdd(hn::Mul(v, gauss), hn::Set(d, 0.3989422804014327f), phi));
      if constexpr (has_sums) StoreN(hn::MulAdd(dm, xv, LoadN(d, sums + j, n)), d, sums + j, n);
      if constexpr (has_scale) dm = hn::Mul(dm, LoadN(d, scale + j, n));
      StoreN(dm, d, dx + i, n);
    });
  });
}

// Rows [r0, r1) of x (rows, C): y = (x - mean) rstd w + b; saved (rows, 2) = mean, rstd.
void LayerNormForward(float* y, float* saved, const float* x, const float* w, const float* b,
                      int64_t C, float eps, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    auto sum = hn::Zero(d);
    int64_t j = 0;
    for (; j + N <= C; j += N) sum = hn::Add(sum, hn::LoadU(d, xr + j));
    if (j < C) sum = hn::Add(sum, LoadN(d, xr + j, static_cast<size_t>(C - j)));
    const float mean = hn::GetLane(hn::SumOfLanes(d, sum)) / static_cast<float>(C);
    const auto vmean = hn::Set(d, mean);
    auto sq = hn::Zero(d);
    for (j = 0; j + N <= C; j += N) {
      const auto c = hn::Sub(hn::LoadU(d, xr + j), vmean);
      sq = hn::MulAdd(c, c, sq);
    }
    if (j < C) {  // padding lanes load 0: subtract the mean only where there is data
      const size_t n = static_cast<size_t>(C - j);
      const auto c = hn::IfThenElseZero(hn::FirstN(d, n), hn::Sub(LoadN(d, xr + j, n), vmean));
      sq = hn::MulAdd(c, c, sq);
    }
    const float rstd =
        1.0f / std::sqrt(hn::GetLane(hn::SumOfLanes(d, sq)) / static_cast<float>(C) + eps);
    const auto vrstd = hn::Set(d, rstd);
    for (j = 0; j + N <= C; j += N) {
      const auto xhat = hn::Mul(hn::Sub(hn::LoadU(d, xr + j), vmean), vrstd);
      hn::StoreU(hn::MulAdd(xhat, hn::LoadU(d, w + j), hn::LoadU(d, b + j)), d, yr + j);
    }
    if (j < C) {
      const size_t n = static_cast<size_t>(C - j);
      const auto xhat = hn::Mul(hn::Sub(LoadN(d, xr + j, n), vmean), vrstd);
      StoreN(hn::MulAdd(xhat, LoadN(d, w + j, n), LoadN(d, b + j, n)), d, yr + j, n);
    }
    saved[2 * r] = mean;
    saved[2 * r + 1] = rstd;
  }
}

// Rows [r0, r1): dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, + residual when given;
// and the parameters' gradients over these rows added into dw, db (C): dy xhat and dy summed 32
// rows at a time in `block` (norm_block_floats), then into dw and db, the rounding
// of a two-level sum. dy and x are read once.
void LayerNormBackward(float* dx, float* dw, float* db, float* block, const float* residual,
                       const float* dy, const float* x, const float* w, const float* saved,
                       int64_t C, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), padded = (C + N - 1) / N * N;
  float *bw = block, *bb = block + padded;
  std::fill_n(block, 2 * padded, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float *xr = x + r * C, *dyr = dy + r * C;
    float* dxr = dx + r * C;
    const auto vmean = hn::Set(d, saved[2 * r]), vrstd = hn::Set(d, saved[2 * r + 1]);
    auto g_sum = hn::Zero(d), gx_sum = hn::Zero(d);
    for (int64_t j = 0; j < C; j += N) {  // the tail's padding lanes load 0: g is 0 there
      const size_t n = static_cast<size_t>(std::min(N, C - j));
      const auto g = hn::Mul(LoadN(d, dyr + j, n), LoadN(d, w + j, n));
      g_sum = hn::Add(g_sum, g);
      gx_sum = hn::MulAdd(g, hn::Mul(hn::Sub(LoadN(d, xr + j, n), vmean), vrstd), gx_sum);
    }
    const auto g_mean = hn::Set(d, hn::GetLane(hn::SumOfLanes(d, g_sum)) / static_cast<float>(C));
    const auto gx_mean = hn::Set(d, hn::GetLane(hn::SumOfLanes(d, gx_sum)) / static_cast<float>(C));
    const float* res = residual ? residual + r * C : nullptr;
    for (int64_t j = 0; j < C; j += N) {
      const size_t n = static_cast<size_t>(std::min(N, C - j));
      const auto dyv = LoadN(d, dyr + j, n);
      const auto xhat = hn::Mul(hn::Sub(LoadN(d, xr + j, n), vmean), vrstd);
      auto v = hn::Mul(vrstd, hn::Sub(hn::Sub(hn::Mul(dyv, LoadN(d, w + j, n)), g_mean),
                                      hn::Mul(xhat, gx_mean)));
      if (res) v = hn::Add(v, LoadN(d, res + j, n));
      StoreN(v, d, dxr + j, n);
      hn::StoreU(hn::MulAdd(dyv, xhat, hn::LoadU(d, bw + j)), d, bw + j);
      hn::StoreU(hn::Add(hn::LoadU(d, bb + j), dyv), d, bb + j);
    }
    if ((r - r0) % 32 == 31 || r + 1 == r1) {
      for (int64_t j = 0; j < C; ++j) dw[j] += bw[j], db[j] += bb[j];
      std::fill_n(block, 2 * padded, 0.0f);
    }
  }
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::simd {

HWY_EXPORT(GeluForward);
HWY_EXPORT(GeluBackward);
HWY_EXPORT(LayerNormForward);
HWY_EXPORT(LayerNormBackward);

void gelu_forward(float* y, const float* x, const float* scale, const float* bias, int64_t C,
                  int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(GeluForward)(y, x, scale, bias, C, r0, r1);
}
void gelu_backward(float* dx, float* sums, const float* dy, const float* x, const float* scale,
                   const float* bias, int64_t C, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(GeluBackward)(dx, sums, dy, x, scale, bias, C, r0, r1);
}
void layer_norm_forward(float* y, float* saved, const float* x, const float* w, const float* b,
                        int64_t C, float eps, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(LayerNormForward)(y, saved, x, w, b, C, eps, r0, r1);
}
void layer_norm_backward(float* dx, float* dw, float* db, float* block, const float* residual,
                         const float* dy, const float* x, const float* w, const float* saved,
                         int64_t C, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(LayerNormBackward)(dx, dw, db, block, residual, dy, x, w, saved, C, r0, r1);
}
int64_t norm_block_floats(int64_t C) {
  constexpr int64_t kMaxLanes = 16;  // the widest target's floats per vector
  return 2 * ((C + kMaxLanes - 1) / kMaxLanes * kMaxLanes);
}

}  // namespace seqforge::simd
#endif  // HWY_ONCE
