#pragma once
// The ops of Llama-style decoders, forward and backward adjacent, in scalar form (float or
// double, sums in double): RMS norm, rotary position embeddings (Hugging Face's rotate-half
// layout) and gated activations (SwiGLU, GeGLU). The reference, and what the CPU backend runs
// over row ranges on its threads.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include <cmath>
#include <cstdint>

#include "kernels/norm.hpp"
#include "seqforge/backend/ops.hpp"

namespace seqforge::kernels {

// Rows [r0, r1) of x (N, C): y = x * rstd * (offset + w), rstd = 1 / sqrt(mean(x^2) + eps);
// saved (N) = rstd.
template <typename T>
void rms_norm_forward(T* y, T* saved, const T* x, const T* w, double offset, int64_t C, double eps,
                      int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * C;
    double sq = 0;
    for (int64_t j = 0; j < C; ++j) sq += double(xr[j]) * xr[j];
    const double rstd = 1.0 / std::sqrt(sq / double(C) + eps);
    for (int64_t j = 0; j < C; ++j) y[r * C + j] = static_cast<T>(xr[j] * rstd * (offset + w[j]));
    saved[r] = static_cast<T>(rstd);
  }
}

// Rows [r0, r1) of dx = rstd * (g - x * rstd^2 * mean(g * x)), g = dy * (offset + w), + residual
// (rows of C) when given.
template <typename T>
void rms_norm_backward_input(T* dx, const T* residual, const T* dy, const T* x, const T* w,
                             double offset, const T* saved, int64_t C, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const double rstd = saved[r];
    const T *xr = x + r * C, *dyr = dy + r * C;
    double gx = 0;
    for (int64_t j = 0; j < C; ++j) gx += double(dyr[j]) * (offset + w[j]) * xr[j];
    const double k = rstd * rstd * gx / double(C);
    for (int64_t j = 0; j < C; ++j) {
      const double v = rstd * (double(dyr[j]) * (offset + w[j]) - xr[j] * k);
      dx[r * C + j] = static_cast<T>(residual ? v + double(residual[r * C + j]) : v);
    }
  }
}

// Columns [c0, c1): dw += sum over the N rows of dy * x * rstd.
template <typename T>
void rms_norm_backward_params(T* dw, const T* dy, const T* x, const T* saved, int64_t N, int64_t C,
                              int64_t c0, int64_t c1) {
  for (int64_t j = c0; j < c1; ++j) {
    double s = 0;
    for (int64_t r = 0; r < N; ++r) s += double(dy[r * C + j]) * x[r * C + j] * saved[r];
    dw[j] += static_cast<T>(s);
  }
}

// Rows [r0, r1) of a.x rotated in place: in each head, element i < D/2 pairs with i + D/2,
// (x_i, x_{i+D/2}) -> (x_i cos - x_{i+D/2} sin, x_{i+D/2} cos + x_i sin) at the row's position;
// the inverse rotates by the opposite angle (the backward of the forward).
template <typename T>
void rotary(const Rotary& a, int64_t r0, int64_t r1) {
  const int64_t half = a.head_dim / 2;
  const T* cos = static_cast<const T*>(a.cos);
  const T* sin = static_cast<const T*>(a.sin);
  const double sign = a.inverse ? -1.0 : 1.0;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t pos = a.first_pos + r % a.seq;
    T* row = static_cast<T*>(a.x) + r * a.ld;
    for (int64_t h = 0; h < a.heads; ++h) {
      T* v = row + h * a.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double c = cos[pos * half + i], s = sign * double(sin[pos * half + i]);
        const double x0 = v[i], x1 = v[i + half];
        v[i] = static_cast<T>(x0 * c - x1 * s);
        v[i + half] = static_cast<T>(x1 * c + x0 * s);
      }
    }
  }
}

// The gate's activation and its derivative: SiLU g * sigmoid(g), or GELU's tanh form.
inline double glu_act(GluKind kind, double g, double* derivative) {
  if (kind == GluKind::silu) {
    const double s = 1.0 / (1.0 + std::exp(-g));
    *derivative = s * (1.0 + g * (1.0 - s));
    return g * s;
  }
  constexpr double kC = 0.7978845608028654;  // sqrt(2 / pi)
  const double u = kC * (g + 0.044715 * g * g * g);
  const double t = std::tanh(u);
  *derivative = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * kC * (1.0 + 3 * 0.044715 * g * g);
  return 0.5 * g * (1.0 + t);
}

// A GLU's per-column input maps (Backend's GluAffine) as pointers to C values each; null: left
// out (scale 1, bias 0).
template <typename T>
struct GluMaps {
  const T *gate_scale = nullptr, *gate_bias = nullptr, *up_scale = nullptr, *up_bias = nullptr;
};

// Rows [r0, r1) of gate, up (R, C): y = act(g) * u, g and u the inputs mapped per column.
template <typename T>
void glu_forward(T* y, const T* gate, const T* up, const GluMaps<T>& maps, GluKind kind, int64_t C,
                 int64_t r0, int64_t r1) {
  for (int64_t i = r0 * C; i < r1 * C; ++i) {
    const int64_t j = i % C;
    const double g = column_mapped(gate[i], maps.gate_scale, maps.gate_bias, j);
    const double u = column_mapped(up[i], maps.up_scale, maps.up_bias, j);
    double d;
    y[i] = static_cast<T>(glu_act(kind, g, &d) * u);
  }
}

// Rows [r0, r1) of the backward: with dg = dy * u * act'(g) and du = dy * act(g), dgate = dg *
// gate_scale and dup = du * up_scale (the inputs' gradients); where gate_sums (C) is given it
// gains the column sums of dg * gate (the gate scale's gradient), up_sums those of du * up.
template <typename T, typename Acc>
void glu_backward(T* dgate, T* dup, Acc* gate_sums, Acc* up_sums, const T* dy, const T* gate,
                  const T* up, const GluMaps<T>& maps, GluKind kind, int64_t C, int64_t r0,
                  int64_t r1) {
  for (int64_t i = r0 * C; i < r1 * C; ++i) {
    const int64_t j = i % C;
    const double g = column_mapped(gate[i], maps.gate_scale, maps.gate_bias, j);
    const double u = column_mapped(up[i], maps.up_scale, maps.up_bias, j);
    double d;
    const double a = glu_act(kind, g, &d), e = dy[i];
    const double dg = e * u * d, du = e * a;
    dgate[i] = static_cast<T>(maps.gate_scale ? dg * double(maps.gate_scale[j]) : dg);
    dup[i] = static_cast<T>(maps.up_scale ? du * double(maps.up_scale[j]) : du);
    if (gate_sums) gate_sums[j] += static_cast<Acc>(dg * double(gate[i]));
    if (up_sums) up_sums[j] += static_cast<Acc>(du * double(up[i]));
  }
}

// Elements [i0, i1): y = cap tanh(x / cap), and dx = dy (1 - (y / cap)^2) from the capped y.
template <typename T>
void soft_cap_forward(T* y, const T* x, double cap, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) y[i] = static_cast<T>(cap * std::tanh(double(x[i]) / cap));
}
template <typename T>
void soft_cap_backward(T* dx, const T* dy, const T* y, double cap, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const double t = double(y[i]) / cap;
    dx[i] = static_cast<T>(double(dy[i]) * (1.0 - t * t));
  }
}

}  // namespace seqforge::kernels
