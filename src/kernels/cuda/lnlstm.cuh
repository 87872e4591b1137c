#pragma once
// The layer-normalised LSTM cell (kernels/cells/lnlstm.hpp's math), one block per batch row: the
// layer norms over a row's 4H and H values reduce across the block, in double.
#include "kernels/cuda/cells.cuh"

namespace seqforge::cuda {

constexpr double kLayerNormEpsilon = 1e-5;

// out = LN(x) over n values (strided over the block); returns 1 / sqrt(var + eps).
template <typename T>
__device__ inline T block_layer_norm(const T* x, T* out, int64_t n) {
  double sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += double(x[j]);
  const double mean = block_sum2(sum, 0).x / double(n);
  double sq = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    sq += (double(x[j]) - mean) * (double(x[j]) - mean);
  const T rstd = T(1.0 / sqrt(block_sum2(sq, 0).x / double(n) + kLayerNormEpsilon));
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) out[j] = (x[j] - T(mean)) * rstd;
  return rstd;
}

// dx = rstd (dy - mean(dy) - y mean(dy y)); dy may be recomputed per element by `dy_at`, which
// must round as it did for the means (mul_rn): where dy is constant dx is then exactly zero.
template <typename T, typename Dy>
__device__ inline void block_layer_norm_backward(Dy dy_at, const T* y, T rstd, T* dx, int64_t n) {
  double m1 = 0, m2 = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    m1 += double(dy_at(j));
    m2 += double(dy_at(j)) * double(y[j]);
  }
  const double2 m = block_sum2(m1, m2);
  const T mean_dy = T(m.x / double(n)), mean_dy_y = T(m.y / double(n));
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    dx[j] = rstd * (dy_at(j) - mean_dy - y[j] * mean_dy_y);
}

// saved per row (10H + 3): LN(G), LN(R), LN(c), tanh(g_c LN(c) + b_c), three 1/stddev.
// Shared: the row's activations (4H).
template <typename T>
__global__ void lnlstm_forward_kernel(CellForward p) {
  SF_DYNAMIC_SHARED(shared_bytes);
  T* act = reinterpret_cast<T*>(shared_bytes);
  const int64_t H = p.hidden, N = 4 * H, W = 10 * H + 3;
  const T* g_ih = static_cast<const T*>(p.params);
  const T *g_hh = g_ih + N, *g_c = g_hh + N, *b_c = g_c + H;
  const T* bias = static_cast<const T*>(p.bias);
  for (int64_t b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const T* gates_in = static_cast<const T*>(p.gates) + b * N;
    const T* rec = static_cast<const T*>(p.gates_rec) + b * N;
    T* saved = static_cast<T*>(p.saved) + b * W;
    T *g_hat = saved, *r_hat = saved + N, *c_hat = saved + 2 * N, *tc = c_hat + H, *rstd = tc + H;
    const T rstd_g = block_layer_norm(gates_in, g_hat, N);
    const T rstd_r = block_layer_norm(rec, r_hat, N);
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      const T pre = g_ih[j] * g_hat[j] + g_hh[j] * r_hat[j] + bias[j];
      act[j] = j >= 2 * H && j < 3 * H ? tanh(pre) : sigmoid(pre);
    }
    __syncthreads();
    const T* c_prev = static_cast<const T*>(p.c_prev) + b * H;
    T* c = static_cast<T*>(p.c) + b * H;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
      c[j] = act[H + j] * c_prev[j] + act[j] * act[2 * H + j];
    __syncthreads();
    const T rstd_c = block_layer_norm(static_cast<const T*>(c), c_hat, H);
    __syncthreads();
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      tc[j] = tanh(g_c[j] * c_hat[j] + b_c[j]);
      store_h(p, b, j, act[3 * H + j] * tc[j]);
    }
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) store_gate(p, 4, b, j, act[j]);
    if (threadIdx.x == 0) {
      rstd[0] = rstd_g;
      rstd[1] = rstd_r;
      rstd[2] = rstd_c;
    }
    __syncthreads();
  }
}

// Writes dgates, dgates_rec (both given), dc, and per row its bias-gradient terms to dbias_rows
// (batch, 18H): d b_ih, d b_hh, d g_ih, d g_hh, d g_c, d b_c, which the backend sums over rows.
// Shared: dpre (4H), dt (H).
template <typename T>
__global__ void lnlstm_backward_kernel(CellBackward p, T* dbias_rows) {
  SF_DYNAMIC_SHARED(shared_bytes);
  T* dpre = reinterpret_cast<T*>(shared_bytes);
  T* dt = dpre + 4 * p.hidden;
  const int64_t H = p.hidden, N = 4 * H, W = 10 * H + 3;
  const T* g_ih = static_cast<const T*>(p.params);
  const T *g_hh = g_ih + N, *g_c = g_hh + N;
  for (int64_t b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const T* saved = static_cast<const T*>(p.saved) + b * W;
    const T *g_hat = saved, *r_hat = saved + N, *c_hat = saved + 2 * N, *tc = c_hat + H;
    const T* rstd = tc + H;
    const T* c_prev = static_cast<const T*>(p.c_prev) + b * H;
    T* dc = static_cast<T*>(p.dc) + b * H;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      const T dh = incoming_dh<T>(p, b, j), o = load_gate<T>(p, 4, b, 3 * H + j);
      dt[j] = dh * o * (T(1) - tc[j] * tc[j]);
      dpre[3 * H + j] = dh * tc[j] * o * (T(1) - o);
    }
    __syncthreads();
    // dc_t = dc + LN'(c)(dt g_c); dc_norm lands in dpre[0, H) for the moment.
    block_layer_norm_backward([&](int64_t j) { return mul_rn(dt[j], g_c[j]); }, c_hat, rstd[2],
                              dpre, H);
    __syncthreads();
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      const T i = load_gate<T>(p, 4, b, j), f = load_gate<T>(p, 4, b, H + j);
      const T g = load_gate<T>(p, 4, b, 2 * H + j);
      const T dct = dc[j] + dpre[j];
      dpre[j] = dct * g * i * (T(1) - i);
      dpre[H + j] = dct * c_prev[j] * f * (T(1) - f);
      dpre[2 * H + j] = dct * i * (T(1) - g * g);
      dc[j] = dct * f;
    }
    __syncthreads();
    T* dg = static_cast<T*>(p.dgates) + b * N;
    T* dr = static_cast<T*>(p.dgates_rec) + b * N;
    block_layer_norm_backward([&](int64_t j) { return mul_rn(dpre[j], g_ih[j]); }, g_hat, rstd[0],
                              dg, N);
    block_layer_norm_backward([&](int64_t j) { return mul_rn(dpre[j], g_hh[j]); }, r_hat, rstd[1],
                              dr, N);
    __syncthreads();
    T* rows = dbias_rows + b * 18 * H;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      if (p.dgates_low) store_low(p.dgates_low, p.low, b * N + j, static_cast<float>(dg[j]));
      if (p.dgates_rec_low)
        store_low(p.dgates_rec_low, p.low, b * N + j, static_cast<float>(dr[j]));
      rows[j] = dpre[j];
      rows[N + j] = dpre[j];
      rows[2 * N + j] = dpre[j] * g_hat[j];
      rows[3 * N + j] = dpre[j] * r_hat[j];
    }
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      rows[4 * N + j] = dt[j] * c_hat[j];
      rows[4 * N + H + j] = dt[j];
    }
    __syncthreads();
  }
}

}  // namespace seqforge::cuda
