#pragma once
// Layer norm over the last axis and the exact GELU, forward and backward adjacent, in scalar
// form (float or double, sums in double): the reference, and what the CPU backend runs over
// row (or column) ranges on its threads.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include <cmath>
#include <cstdint>

namespace seqforge::kernels {

// Rows [r0, r1) of x (N, C): y = (x - mean) * rstd * w + b; saved (N, 2) = mean, rstd.
template <typename T>
void layer_norm_forward(T* y, T* saved, const T* x, const T* w, const T* b, int64_t C, double eps,
                        int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * C;
    double sum = 0;
    for (int64_t j = 0; j < C; ++j) sum += xr[j];
    const double mean = sum / double(C);
    double sq = 0;
    for (int64_t j = 0; j < C; ++j) sq += (xr[j] - mean) * (xr[j] - mean);
    const double rstd = 1.0 / std::sqrt(sq / double(C) + eps);
    for (int64_t j = 0; j < C; ++j)
      y[r * C + j] = static_cast<T>((xr[j] - mean) * rstd * w[j] + b[j]);
    saved[2 * r] = static_cast<T>(mean);
    saved[2 * r + 1] = static_cast<T>(rstd);
  }
}

// Rows [r0, r1) of dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, + residual (rows
// of C) when given.
template <typename T>
void layer_norm_backward_input(T* dx, const T* residual, const T* dy, const T* x, const T* w,
                               const T* saved, int64_t C, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const double mean = saved[2 * r], rstd = saved[2 * r + 1];
    const T *xr = x + r * C, *dyr = dy + r * C;
    double g_sum = 0, gx_sum = 0;
    for (int64_t j = 0; j < C; ++j) {
      const double g = double(dyr[j]) * w[j];
      g_sum += g;
      gx_sum += g * (xr[j] - mean) * rstd;
    }
    const double g_mean = g_sum / double(C), gx_mean = gx_sum / double(C);
    for (int64_t j = 0; j < C; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      const double v = rstd * (double(dyr[j]) * w[j] - g_mean - xhat * gx_mean);
      dx[r * C + j] = static_cast<T>(residual ? v + double(residual[r * C + j]) : v);
    }
  }
}

// Columns [c0, c1): dw += sum over the N rows of dy * xhat, db += sum of dy.
template <typename T>
void layer_norm_backward_params(T* dw, T* db, const T* dy, const T* x, const T* saved, int64_t N,
                                int64_t C, int64_t c0, int64_t c1) {
  for (int64_t j = c0; j < c1; ++j) {
    double sw = 0, sb = 0;
    for (int64_t r = 0; r < N; ++r) {
      const double d = dy[r * C + j];
      sw += d * (x[r * C + j] - double(saved[2 * r])) * double(saved[2 * r + 1]);
      sb += d;
    }
    dw[j] += static_cast<T>(sw);
    db[j] += static_cast<T>(sb);
  }
}

// An activation's input mapped per column (Backend's ColumnMap): x * scale[j] + bias[j] in T, as
// scale_columns rounds it; scale or bias null: left out.
template <typename T>
T column_mapped(T x, const T* scale, const T* bias, int64_t j) {
  if (scale) x = static_cast<T>(x * scale[j]);
  if (bias) x = static_cast<T>(x + bias[j]);
  return x;
}

// Phi(v) = erfc(-v / sqrt 2) / 2, the normal distribution function: erfc keeps the lower tail's
// relative precision, which 1 + erf(v / sqrt 2) cancels away (below v = -8 in double).
inline double normal_cdf(double v) { return 0.5 * std::erfc(-v * M_SQRT1_2); }

// GELU(m) = m * Phi(m) of m = x mapped per column (rows of C), elements [i0, i1).
template <typename T>
void gelu_forward(T* y, const T* x, const T* scale, const T* bias, int64_t C, int64_t i0,
                  int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const double v = column_mapped(x[i], scale, bias, i % C);
    y[i] = static_cast<T>(v * normal_cdf(v));
  }
}

// dm = dy * (Phi(m) + m * phi(m)); dx = dm * scale; sums (C), where given, gain dm * x (the
// scale's gradient). dx may be dy.
template <typename T, typename Acc>
void gelu_backward(T* dx, Acc* sums, const T* dy, const T* x, const T* scale, const T* bias,
                   int64_t C, int64_t i0, int64_t i1) {
  constexpr double kInvSqrt2Pi = 0.3989422804014327;
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t j = i % C;
    const double v = column_mapped(x[i], scale, bias, j);
    const double d = normal_cdf(v) + v * kInvSqrt2Pi * std::exp(-0.5 * v * v);
    const double dm = double(dy[i]) * d;
    if (sums) sums[j] += static_cast<Acc>(dm * double(x[i]));
    dx[i] = static_cast<T>(scale ? dm * double(scale[j]) : dm);
  }
}

}  // namespace seqforge::kernels
