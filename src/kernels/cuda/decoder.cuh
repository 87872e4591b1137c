#pragma once
// The Llama-style decoders' ops (kernels/decoder_ops.hpp's math): RMS norm over the last axis,
// rotary position embeddings in Hugging Face's rotate-half layout, and the gated activations
// (SiLU, GELU's tanh form), forward and backward; the norm's sums and formulas in double as the
// reference, the activations' in T.
#include "kernels/cuda/common.cuh"
#include "seqforge/backend/ops.hpp"

namespace seqforge::cuda {

// One block per row of x (N, C): y = x rstd (offset + w), rstd = 1 / sqrt(mean(x^2) + eps);
// saved (N) = rstd.
template <typename T>
__global__ void rms_norm_forward_kernel(T* y, T* saved, const T* x, const T* w, double offset,
                                        int64_t rows, int64_t C, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * C;
    double sq = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
      sq += mul_rn(double(xr[j]), double(xr[j]));
    const double rstd = 1.0 / sqrt(block_sum2(sq, 0).x / double(C) + eps);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
      y[r * C + j] = static_cast<T>(mul_rn(mul_rn(double(xr[j]), rstd), offset + double(w[j])));
    if (threadIdx.x == 0) saved[r] = static_cast<T>(rstd);
  }
}

// One block per row: dx = rstd (g - x rstd^2 mean(g x)), g = dy (offset + w).
template <typename T>
__global__ void rms_norm_backward_input_kernel(T* dx, const T* residual, const T* dy, const T* x,
                                               const T* w, double offset, const T* saved,
                                               int64_t rows, int64_t C) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const double rstd = saved[r];
    const T *xr = x + r * C, *dyr = dy + r * C;
    double gx = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
      gx += mul_rn(mul_rn(double(dyr[j]), offset + double(w[j])), double(xr[j]));
    const double k = mul_rn(mul_rn(rstd, rstd), block_sum2(gx, 0).x) / double(C);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const double g = mul_rn(double(dyr[j]), offset + double(w[j]));
      const double v = mul_rn(rstd, g - mul_rn(double(xr[j]), k));
      dx[r * C + j] = static_cast<T>(residual ? v + double(residual[r * C + j]) : v);
    }
  }
}

// dw's column sums of dy x rstd in two deterministic passes, as layer norm's: partial sums over
// `chunks` bands of rows (partial: (chunks, C) doubles), then their sum in band order.
template <typename T>
__global__ void rms_norm_params_partial_kernel(double* partial, const T* dy, const T* x,
                                               const T* saved, int64_t rows, int64_t C,
                                               int64_t chunks) {
  for_band_columns(rows, C, chunks, [&](int64_t chunk, int64_t j, int64_t r0, int64_t r1) {
    double s = 0;
    for (int64_t r = r0; r < r1; ++r)
      s += mul_rn(mul_rn(double(dy[r * C + j]), double(x[r * C + j])), double(saved[r]));
    partial[chunk * C + j] = s;
  });
}

template <typename T>
__global__ void rms_norm_params_final_kernel(T* dw, const double* partial, int64_t C,
                                             int64_t chunks) {
  SF_GRID_STRIDE(j, C) {
    double s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * C + j];
    dw[j] += static_cast<T>(s);
  }
}

// Every (row, head, i < head_dim / 2) pair of a.x turned by its position's angle, in place.
template <typename T>
__global__ void rotary_kernel(Rotary a) {
  const int64_t half = a.head_dim / 2;
  const T* cos = static_cast<const T*>(a.cos);
  const T* sin = static_cast<const T*>(a.sin);
  const double sign = a.inverse ? -1.0 : 1.0;
  SF_GRID_STRIDE(n, a.rows * a.heads * half) {
    const int64_t i = n % half, h = n / half % a.heads, r = n / (half * a.heads);
    const int64_t pos = a.first_pos + r % a.seq;
    T* v = static_cast<T*>(a.x) + r * a.ld + h * a.head_dim;
    const double c = cos[pos * half + i], s = sign * double(sin[pos * half + i]);
    const double x0 = v[i], x1 = v[i + half];
    v[i] = static_cast<T>(mul_rn(x0, c) - mul_rn(x1, s));
    v[i + half] = static_cast<T>(mul_rn(x1, c) + mul_rn(x0, s));
  }
}

// The gate's activation and its derivative (kernels::glu_act), in T.
template <typename T>
__device__ inline T glu_activation(GluKind kind, T g, T* derivative) {
  const T one(1), half(0.5);
  if (kind == GluKind::silu) {
    const T s = one / (one + exp(-g));
    *derivative = mul_rn(s, one + mul_rn(g, one - s));
    return mul_rn(g, s);
  }
  const T kC(0.7978845608028654), kCubic(0.044715);  // sqrt(2 / pi)
  const T t = tanh(mul_rn(kC, g + mul_rn(mul_rn(mul_rn(kCubic, g), g), g)));
  *derivative =
      mul_rn(half, one + t) + mul_rn(mul_rn(mul_rn(mul_rn(half, g), one - mul_rn(t, t)), kC),
                                     one + mul_rn(mul_rn(T(3) * kCubic, g), g));
  return mul_rn(mul_rn(half, g), one + t);
}

// A GLU's per-column input maps (Backend's GluAffine); null: left out.
template <typename T>
struct GluMaps {
  const T *gate_scale, *gate_bias, *up_scale, *up_bias;
};

// y = act(g) * u over gate, up (rows of C), g and u the inputs mapped per column; in T (f32 math
// for f32: the consumer GPUs run f64 at a 64th of the f32 rate).
template <typename T>
__global__ void glu_forward_kernel(T* y, const T* gate, const T* up, GluMaps<T> m, GluKind kind,
                                   int64_t n, int64_t C) {
  SF_GRID_STRIDE(i, n) {
    const int64_t j = i % C;
    const T g = column_mapped(gate[i], m.gate_scale, m.gate_bias, j);
    const T u = column_mapped(up[i], m.up_scale, m.up_bias, j);
    T d;
    y[i] = mul_rn(glu_activation(kind, g, &d), u);
  }
}

// Element i of the backward: dg = dy * u * act'(g), du = dy * act(g); dgate = dg * gate_scale,
// dup = du * up_scale.
template <typename T>
__device__ inline void glu_backward_element(T* dgate, T* dup, const T* dy, const T* gate,
                                            const T* up, const GluMaps<T>& m, GluKind kind,
                                            int64_t i, int64_t j, T& dg, T& du) {
  const T g = column_mapped(gate[i], m.gate_scale, m.gate_bias, j);
  const T u = column_mapped(up[i], m.up_scale, m.up_bias, j);
  T d;
  const T a = glu_activation(kind, g, &d), e = dy[i];
  dg = mul_rn(mul_rn(e, u), d), du = mul_rn(e, a);
  dgate[i] = m.gate_scale ? mul_rn(dg, m.gate_scale[j]) : dg;
  dup[i] = m.up_scale ? mul_rn(du, m.up_scale[j]) : du;
}

template <typename T>
__global__ void glu_backward_kernel(T* dgate, T* dup, const T* dy, const T* gate, const T* up,
                                    GluMaps<T> m, GluKind kind, int64_t n, int64_t C) {
  SF_GRID_STRIDE(i, n) {
    T dg, du;
    glu_backward_element(dgate, dup, dy, gate, up, m, kind, i, i % C, dg, du);
  }
}

// The same writing the scales' gradients, in two deterministic passes as layer norm's
// parameters: blocks stride over (band of rows, column tile) pairs, a thread per column summing
// dg * gate and du * up over its band into partial (chunks, 2, C); then the bands' sums in band
// order into dgate_scale and dup_scale (each where given).
template <typename T>
__global__ void glu_backward_partial_kernel(double* partial, T* dgate, T* dup, const T* dy,
                                            const T* gate, const T* up, GluMaps<T> m, GluKind kind,
                                            int64_t rows, int64_t C, int64_t chunks) {
  for_band_columns(rows, C, chunks, [&](int64_t chunk, int64_t j, int64_t r0, int64_t r1) {
    double gate_sum = 0, up_sum = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r * C + j;
      T dg, du;
      glu_backward_element(dgate, dup, dy, gate, up, m, kind, i, j, dg, du);
      gate_sum += double(mul_rn(dg, gate[i]));
      up_sum += double(mul_rn(du, up[i]));
    }
    partial[(chunk * 2) * C + j] = gate_sum;
    partial[(chunk * 2 + 1) * C + j] = up_sum;
  });
}

template <typename T>
__global__ void glu_backward_final_kernel(T* dgate_scale, T* dup_scale, const double* partial,
                                          int64_t C, int64_t chunks) {
  SF_GRID_STRIDE(j, C) {
    double gate_sum = 0, up_sum = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      gate_sum += partial[(c * 2) * C + j];
      up_sum += partial[(c * 2 + 1) * C + j];
    }
    if (dgate_scale) dgate_scale[j] = static_cast<T>(gate_sum);
    if (dup_scale) dup_scale[j] = static_cast<T>(up_sum);
  }
}

// y = cap tanh(x / cap) (y may be x).
template <typename T>
__global__ void soft_cap_forward_kernel(T* y, const T* x, double cap, int64_t n) {
  const T c = static_cast<T>(cap);
  SF_GRID_STRIDE(i, n) { y[i] = mul_rn(c, tanh(x[i] / c)); }
}

// dx = dy (1 - (y / cap)^2) from the capped y (dx may be dy).
template <typename T>
__global__ void soft_cap_backward_kernel(T* dx, const T* dy, const T* y, double cap, int64_t n) {
  const T c = static_cast<T>(cap);
  SF_GRID_STRIDE(i, n) {
    const T t = y[i] / c;
    dx[i] = mul_rn(dy[i], T(1) - mul_rn(t, t));
  }
}

}  // namespace seqforge::cuda
