// The decoders' RMS norm and gated activations, and a row of cross-entropy, in f32 SIMD
// (Highway, dispatched at run time), forward and backward. The scalar forms in
// kernels/decoder_ops.hpp and the reference backend are the reference.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/decoder_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <limits>
// clang-format off
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
// clang-format on

#include "kernels/cpu/decoder_simd.hpp"
// clang-format off
#include "kernels/cpu/exp_simd-inl.h"
#include "kernels/cpu/partial_simd-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace seqforge::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Calls f(i, n) over [i0, i1) a vector at a time: n = Lanes, then the tail's n < Lanes.
template <class F>
HWY_INLINE void ForVectors(int64_t i0, int64_t i1, F&& f) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t i = i0;
  for (; i + N <= i1; i += N) f(i, N);
  if (i < i1) f(i, i1 - i);
}
// n values at p (zeros after them), and storing the first n lanes (partial_simd-inl.h).
HWY_INLINE VF Load(const float* p, int64_t n) { return LoadN(DF(), p, static_cast<size_t>(n)); }
HWY_INLINE void Store(VF v, float* p, int64_t n) { StoreN(v, DF(), p, static_cast<size_t>(n)); }

// act(g) and act'(g): SiLU g sigmoid(g) (exp's argument held where it is defined, below 88), or
// GELU's tanh form 0.5 g (1 + tanh(u)), u = sqrt(2 / pi) (g + 0.044715 g^3).
HWY_INLINE VF Activation(GluKind kind, VF g, VF& derivative) {
  const DF d;
  const VF one = hn::Set(d, 1.0f);
  if (kind == GluKind::silu) {
    const VF e = ExpAtMost88(d, hn::Min(hn::Neg(g), hn::Set(d, 88.0f)));
    const VF s = hn::Div(one, hn::Add(one, e));
    derivative = hn::Mul(s, hn::MulAdd(g, hn::Sub(one, s), one));
    return hn::Mul(g, s);
  }
  const VF c = hn::Set(d, 0.7978845608028654f), k = hn::Set(d, 0.044715f);
  const VF g2 = hn::Mul(g, g);
  const VF t = hn::Tanh(d, hn::Mul(c, hn::MulAdd(hn::Mul(k, g2), g, g)));
  const VF half = hn::Set(d, 0.5f);
  const VF du = hn::Mul(c, hn::MulAdd(hn::Set(d, 3 * 0.044715f), g2, one));  // u'(g)
  // 0.5 (1 + t) + 0.5 g (1 - t^2) u'
  derivative = hn::MulAdd(hn::Mul(hn::Mul(half, g), hn::NegMulAdd(t, t, one)), du,
                          hn::Mul(half, hn::Add(one, t)));
  return hn::Mul(hn::Mul(half, g), hn::Add(one, t));
}

// x * scale + bias per column (either null: left out), rounded as scale_columns rounds it.
HWY_INLINE VF Mapped(VF x, const float* scale, const float* bias, int64_t j, int64_t n) {
  if (scale) x = hn::Mul(x, Load(scale + j, n));
  if (bias) x = hn::Add(x, Load(bias + j, n));
  return x;
}

void GluForward(float* y, const float* gate, const float* up, const GluMaps& m, GluKind kind,
                int64_t C, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o = r * C;
    ForVectors(0, C, [&](int64_t j, int64_t n) {
      VF derivative;
      const VF g = Mapped(Load(gate + o + j, n), m.gate_scale, m.gate_bias, j, n);
      const VF u = Mapped(Load(up + o + j, n), m.up_scale, m.up_bias, j, n);
      Store(hn::Mul(Activation(kind, g, derivative), u), y + o + j, n);
    });
  }
}

void GluBackward(float* dgate, float* dup, float* gate_sums, float* up_sums, const float* dy,
                 const float* gate, const float* up, const GluMaps& m, GluKind kind, int64_t C,
                 int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o = r * C;
    ForVectors(0, C, [&](int64_t j, int64_t n) {
      VF derivative;
      const VF g0 = Load(gate + o + j, n), u0 = Load(up + o + j, n);
      const VF u = Mapped(u0, m.up_scale, m.up_bias, j, n), e = Load(dy + o + j, n);
      const VF a = Activation(kind, Mapped(g0, m.gate_scale, m.gate_bias, j, n), derivative);
      const VF dg = hn::Mul(hn::Mul(e, u), derivative), du = hn::Mul(e, a);
      Store(m.gate_scale ? hn::Mul(dg, Load(m.gate_scale + j, n)) : dg, dgate + o + j, n);
      Store(m.up_scale ? hn::Mul(du, Load(m.up_scale + j, n)) : du, dup + o + j, n);
      if (gate_sums) Store(hn::MulAdd(dg, g0, Load(gate_sums + j, n)), gate_sums + j, n);
      if (up_sums) Store(hn::MulAdd(du, u0, Load(up_sums + j, n)), up_sums + j, n);
    });
  }
}

// The sum of a row's n values, a vector of partial sums at a time.
template <class F>
HWY_INLINE float RowSum(int64_t n, F&& term) {
  const DF d;
  VF acc = hn::Zero(d);
  ForVectors(0, n, [&](int64_t j, int64_t m) { acc = hn::Add(acc, term(j, m)); });
  return hn::GetLane(hn::SumOfLanes(d, acc));
}

// Rows [r0, r1): y = x rstd (offset + w), rstd = 1 / sqrt(mean(x^2) + eps); saved = rstd.
void RmsNormForward(float* y, float* saved, const float* x, const float* w, float offset, int64_t C,
                    float eps, int64_t r0, int64_t r1) {
  const DF d;
  const VF off = hn::Set(d, offset);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * C;
    const float sq = RowSum(C, [&](int64_t j, int64_t n) {
      const VF v = Load(xr + j, n);
      return hn::Mul(v, v);
    });
    const float rstd = 1.0f / std::sqrt(sq / float(C) + eps);
    const VF vr = hn::Set(d, rstd);
    ForVectors(0, C, [&](int64_t j, int64_t n) {
      Store(hn::Mul(hn::Mul(Load(xr + j, n), vr), hn::Add(off, Load(w + j, n))), y + r * C + j, n);
    });
    saved[r] = rstd;
  }
}

// Rows [r0, r1): dx = rstd (g - x rstd^2 mean(g x)), g = dy (offset + w), + residual when given;
// and dw (C) += these rows' dy x rstd, summed 32 rows at a time in `block` (C rounded up to whole
// vectors) first. dy and x are read once.
void RmsNormBackward(float* dx, float* dw, float* block, const float* residual, const float* dy,
                     const float* x, const float* w, float offset, const float* saved, int64_t C,
                     int64_t r0, int64_t r1) {
  const DF d;
  const VF off = hn::Set(d, offset);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)),
                padded = (C + lanes - 1) / lanes * lanes;
  std::fill_n(block, padded, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float *xr = x + r * C, *dyr = dy + r * C, rstd = saved[r];
    const float gx = RowSum(C, [&](int64_t j, int64_t n) {
      return hn::Mul(hn::Mul(Load(dyr + j, n), hn::Add(off, Load(w + j, n))), Load(xr + j, n));
    });
    const VF vr = hn::Set(d, rstd), k = hn::Set(d, rstd * rstd * gx / float(C));
    const float* res = residual ? residual + r * C : nullptr;
    ForVectors(0, C, [&](int64_t j, int64_t n) {
      const VF dyv = Load(dyr + j, n), xv = Load(xr + j, n);
      const VF g = hn::Mul(dyv, hn::Add(off, Load(w + j, n)));
      const VF v = hn::Mul(vr, hn::NegMulAdd(xv, k, g));
      Store(res ? hn::Add(v, Load(res + j, n)) : v, dx + r * C + j, n);
      hn::StoreU(hn::MulAdd(hn::Mul(dyv, xv), vr, hn::LoadU(d, block + j)), d, block + j);
    });
    if ((r - r0) % 32 == 31 || r + 1 == r1) {
      for (int64_t j = 0; j < C; ++j) dw[j] += block[j];
      std::fill_n(block, padded, 0.0f);
    }
  }
}

// Rows [r0, r1) of a.x rotated in place (kernels/decoder_ops.hpp: rotary), in f32.
void Rotary(const seqforge::Rotary& a, int64_t r0, int64_t r1) {
  const int64_t half = a.head_dim / 2;
  const float* cos = static_cast<const float*>(a.cos);
  const float* sin = static_cast<const float*>(a.sin);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t pos = a.first_pos + r % a.seq;
    const float *c = cos + pos * half, *s = sin + pos * half;
    float* row = static_cast<float*>(a.x) + r * a.ld;
    for (int64_t h = 0; h < a.heads; ++h) {
      float* v = row + h * a.head_dim;
      ForVectors(0, half, [&](int64_t i, int64_t n) {
        const VF x0 = Load(v + i, n), x1 = Load(v + half + i, n), vc = Load(c + i, n);
        const VF vs = a.inverse ? hn::Neg(Load(s + i, n)) : Load(s + i, n);
        Store(hn::NegMulAdd(x1, vs, hn::Mul(x0, vc)), v + i, n);
        Store(hn::MulAdd(x0, vs, hn::Mul(x1, vc)), v + half + i, n);
      });
    }
  }
}

double CrossEntropyRow(float* dr, const float* x, int64_t C, int64_t y, float coef) {
  const DF d;
  VF vmax = hn::Set(d, -std::numeric_limits<float>::infinity());
  ForVectors(0, C, [&](int64_t j, int64_t n) {
    const VF v = Load(x + j, n);
    vmax = hn::Max(vmax, n == static_cast<int64_t>(hn::Lanes(d))
                             ? v
                             : hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(n)), v, vmax));
  });
  const float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const VF vm = hn::Set(d, mx);
  // exp(x - max) into dr, then scaled in place: one pass of exp.
  const float sum = RowSum(C, [&](int64_t j, int64_t n) {
    const VF e = ExpAtMost88OrNaN(d, hn::Sub(Load(x + j, n), vm));
    Store(e, dr + j, n);
    return n == static_cast<int64_t>(hn::Lanes(d))
               ? e
               : hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(n)), e);
  });
  const VF scale = hn::Set(d, coef / sum);
  ForVectors(0, C,
             [&](int64_t j, int64_t n) { Store(hn::Mul(Load(dr + j, n), scale), dr + j, n); });
  dr[y] -= coef;
  return double(mx) + std::log(double(sum)) - double(x[y]);
}

}  // namespace seqforge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqforge::simd {

HWY_EXPORT(GluForward);
HWY_EXPORT(GluBackward);
HWY_EXPORT(RmsNormForward);
HWY_EXPORT(RmsNormBackward);
HWY_EXPORT(Rotary);
HWY_EXPORT(CrossEntropyRow);

void glu_forward(float* y, const float* gate, const float* up, const GluMaps& maps, GluKind kind,
                 int64_t C, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(GluForward)(y, gate, up, maps, kind, C, r0, r1);
}
void glu_backward(float* dgate, float* dup, float* gate_sums, float* up_sums, const float* dy,
                  const float* gate, const float* up, const GluMaps& maps, GluKind kind, int64_t C,
                  int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(GluBackward)
  (dgate, dup, gate_sums, up_sums, dy, gate, up, maps, kind, C, r0, r1);
}
void rms_norm_forward(float* y, float* saved, const float* x, const float* w, float offset,
                      int64_t C, float eps, int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(RmsNormForward)(y, saved, x, w, offset, C, eps, r0, r1);
}
void rms_norm_backward(float* dx, float* dw, float* block, const float* residual, const float* dy,
                       const float* x, const float* w, float offset, const float* saved, int64_t C,
                       int64_t r0, int64_t r1) {
  HWY_DYNAMIC_DISPATCH(RmsNormBackward)
  (dx, dw, block, residual, dy, x, w, offset, saved, C, r0, r1);
}
void rotary(const Rotary& a, int64_t r0, int64_t r1) { HWY_DYNAMIC_DISPATCH(Rotary)(a, r0, r1); }
double cross_entropy_row(float* d, const float* x, int64_t C, int64_t y, float coef) {
  return HWY_DYNAMIC_DISPATCH(CrossEntropyRow)(d, x, C, y, coef);
}

}  // namespace seqforge::simd
#endif
