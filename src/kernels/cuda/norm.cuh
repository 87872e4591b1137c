#pragma once
// Layer norm over the last axis and the exact GELU (kernels/norm.hpp's math): layer norm's sums
// and formulas in double as the reference, GELU's in T; outputs rounded once to T, or through f32
// to bf16 or f16 where y is the operand of half GEMMs.
#include "kernels/cuda/common.cuh"

namespace seqforge::cuda {

// Stores v rounded to Y: T itself, or bf16 through f32 as the host rounds.
template <typename Y>
__device__ inline void store_rounded(Y* p, double v) {
  *p = static_cast<Y>(v);
}
template <>
__device__ inline void store_rounded<bf16>(bf16* p, double v) {
  p->bits = bf16_bits(static_cast<float>(v));
}
template <>
__device__ inline void store_rounded<__half>(__half* p, double v) {
  *p = __float2half_rn(static_cast<float>(v));
}

// One block per row of x (N, C): y = (x - mean) rstd w + b; saved (N, 2) = mean, rstd.
template <typename T, typename Y>
__global__ void layer_norm_forward_kernel(Y* y, T* saved, const T* x, const T* w, const T* b,
                                          int64_t rows, int64_t C, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * C;
    double sum = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) sum += double(xr[j]);
    const double mean = block_sum2(sum, 0).x / double(C);
    double sq = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const double d = double(xr[j]) - mean;
      sq += d * d;
    }
    const double rstd = 1.0 / sqrt(block_sum2(sq, 0).x / double(C) + eps);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
      store_rounded(y + r * C + j,
                    mul_rn(mul_rn(double(xr[j]) - mean, rstd), double(w[j])) + double(b[j]));
    if (threadIdx.x == 0) {
      saved[2 * r] = static_cast<T>(mean);
      saved[2 * r + 1] = static_cast<T>(rstd);
    }
  }
}

// One block per row: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w.
template <typename T>
__global__ void layer_norm_backward_input_kernel(T* dx, const T* residual, const T* dy, const T* x,
                                                 const T* w, const T* saved, int64_t rows,
                                                 int64_t C) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const double mean = saved[2 * r], rstd = saved[2 * r + 1];
    const T *xr = x + r * C, *dyr = dy + r * C;
    double g_sum = 0, gx_sum = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const double g = mul_rn(double(dyr[j]), double(w[j]));
      g_sum += g;
      gx_sum += mul_rn(mul_rn(g, double(xr[j]) - mean), rstd);
    }
    const double2 sums = block_sum2(g_sum, gx_sum);
    const double g_mean = sums.x / double(C), gx_mean = sums.y / double(C);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const double xhat = mul_rn(double(xr[j]) - mean, rstd);
      const double g = mul_rn(double(dyr[j]), double(w[j]));
      const double v = mul_rn(rstd, g - g_mean - mul_rn(xhat, gx_mean));
      dx[r * C + j] = static_cast<T>(residual ? v + double(residual[r * C + j]) : v);
    }
  }
}

// The parameters' gradients in two deterministic passes: partial column sums of dy xhat and dy
// over `chunks` bands of rows (partial: (chunks, 2, C) doubles), then their sum in band order.
// Blocks stride over (band, column tile) pairs, a thread per column.
template <typename T>
__global__ void layer_norm_params_partial_kernel(double* partial, const T* dy, const T* x,
                                                 const T* saved, int64_t rows, int64_t C,
                                                 int64_t chunks) {
  for_band_columns(rows, C, chunks, [&](int64_t chunk, int64_t j, int64_t r0, int64_t r1) {
    double sw = 0, sb = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const double d = dy[r * C + j];
      sw +=
          mul_rn(mul_rn(d, double(x[r * C + j]) - double(saved[2 * r])), double(saved[2 * r + 1]));
      sb += d;
    }
    partial[(chunk * 2) * C + j] = sw;
    partial[(chunk * 2 + 1) * C + j] = sb;
  });
}

template <typename T>
__global__ void layer_norm_params_final_kernel(T* dw, T* db, const double* partial, int64_t C,
                                               int64_t chunks) {
  SF_GRID_STRIDE(j, C) {
    double sw = 0, sb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      sw += partial[(c * 2) * C + j];
      sb += partial[(c * 2 + 1) * C + j];
    }
    dw[j] += static_cast<T>(sw);
    db[j] += static_cast<T>(sb);
  }
}

constexpr double kInvSqrt2Pi = 0.3989422804014327;

// Phi(v), the normal distribution function, in T: CUDA's normcdf keeps a few ulp far into the
// lower tail, where erfc(-v / sqrt 2) loses digits to the rounding of v / sqrt 2.
__device__ inline float normal_cdf(float v) { return normcdff(v); }
__device__ inline double normal_cdf(double v) { return normcdf(v); }

// exp(-v^2 / 2), v^2 split exactly in two (sq + sq_low) so that the tail keeps its digits; |v|
// clamped at 40, beyond which the value is 0 in double too, so that sq_low stays finite at +-inf.
template <typename T>
__device__ inline T gauss(T v) {
  const T a = fmin(fabs(v), T(40));
  const T sq = mul_rn(a, a), sq_low = fma(a, a, -sq);
  return exp(T(-0.5) * sq) * (T(1) - T(0.5) * sq_low);
}

// GELU(m) = m Phi(m), m = x mapped per column (rows of C), in T (f32 math for f32: the consumer
// GPUs run f64 at a 64th of the f32 rate).
template <typename T, typename Y>
__global__ void gelu_forward_kernel(Y* y, const T* x, const T* scale, const T* bias, int64_t n,
                                    int64_t C) {
  SF_GRID_STRIDE(i, n) {
    const T v = column_mapped(x[i], scale, bias, i % C);
    store_rounded(y + i, mul_rn(v, normal_cdf(v)));
  }
}

// Element i: dm = dy (Phi(m) + m phi(m)), dx = dm * scale (dx may be dy); returns dm.
template <typename T>
__device__ inline T gelu_backward_element(T* dx, const T* dy, const T* x, const T* scale,
                                          const T* bias, int64_t i, int64_t j) {
  const T v = column_mapped(x[i], scale, bias, j);
  const T d = normal_cdf(v) + mul_rn(mul_rn(v, T(kInvSqrt2Pi)), gauss(v));
  const T dm = mul_rn(dy[i], d);
  dx[i] = scale ? mul_rn(dm, scale[j]) : dm;
  return dm;
}

template <typename T>
__global__ void gelu_backward_kernel(T* dx, const T* dy, const T* x, const T* scale, const T* bias,
                                     int64_t n, int64_t C) {
  SF_GRID_STRIDE(i, n) { gelu_backward_element(dx, dy, x, scale, bias, i, i % C); }
}

// The same writing the scale's gradient, in two deterministic passes as layer norm's
// parameters: a thread per column of a band of rows sums dm * x into partial (chunks, C), then
// the bands' sums in band order into dscale.
template <typename T>
__global__ void gelu_backward_partial_kernel(double* partial, T* dx, const T* dy, const T* x,
                                             const T* scale, const T* bias, int64_t rows, int64_t C,
                                             int64_t chunks) {
  for_band_columns(rows, C, chunks, [&](int64_t chunk, int64_t j, int64_t r0, int64_t r1) {
    double sum = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r * C + j;
      const T xi = x[i];  // read before dx (which may be dy) is written
      sum += double(mul_rn(gelu_backward_element(dx, dy, x, scale, bias, i, j), xi));
    }
    partial[chunk * C + j] = sum;
  });
}

}  // namespace seqforge::cuda
