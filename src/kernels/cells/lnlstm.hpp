#pragma once
// The layer-normalised LSTM cell's reference kernels (Ba et al. 2016), for batch rows [r0, r1);
// the SIMD kernels are in kernels/cpu/lnlstm_simd.cpp. Gate order i, f, g, o. Per row, with G the
// input projection x W_ih^T and R the recurrent one h_prev W_hh^T (neither with a bias):
//   pre = g_ih LN(G) + g_hh LN(R) + (b_ih + b_hh)        LN over the 4H values, no bias of its own
//   i, f, o = sig(pre_i, pre_f, pre_o),  g = tanh(pre_g),  c = f c_prev + i g
//   h = o tanh(g_c LN(c) + b_c)                           LN over the H values
// LN(v) = (v - mean(v)) / sqrt(var(v) + 1e-5), var the mean square deviation (as nn.LayerNorm).
// params: g_ih (4H), g_hh (4H), g_c (H), b_c (H). saved per row: LN(G) (4H), LN(R) (4H),
// LN(c) (H), tanh(g_c LN(c) + b_c) (H), then the three 1 / sqrt(var + eps).
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/reference.hpp"

namespace seqforge::ref {

constexpr double kLayerNormEps = 1e-5;

// out = LN(x) over n values; returns 1 / sqrt(var + eps).
template <typename T>
T layer_norm(const T* x, T* out, int64_t n) {
  T mean = 0, var = 0;
  for (int64_t j = 0; j < n; ++j) mean += x[j];
  mean /= T(n);
  for (int64_t j = 0; j < n; ++j) var += (x[j] - mean) * (x[j] - mean);
  const T rstd = T(1) / std::sqrt(var / T(n) + T(kLayerNormEps));
  for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - mean) * rstd;
  return rstd;
}

// dx = rstd (dy - mean(dy) - y mean(dy y)) for y = LN(x): the gradient through the norm.
template <typename T>
void layer_norm_backward(const T* dy, const T* y, T rstd, T* dx, int64_t n) {
  T m1 = 0, m2 = 0;
  for (int64_t j = 0; j < n; ++j) {
    m1 += dy[j];
    m2 += dy[j] * y[j];
  }
  m1 /= T(n);
  m2 /= T(n);
  for (int64_t j = 0; j < n; ++j) dx[j] = rstd * (dy[j] - m1 - y[j] * m2);
}

template <typename T>
void lnlstm_cell_forward(const CellForward& p, int64_t r0, int64_t r1) {
  const int64_t H = p.hidden, N = 4 * H, W = 10 * H + 3;
  const T* g_ih = static_cast<const T*>(p.params);
  const T *g_hh = g_ih + N, *g_c = g_hh + N, *b_c = g_c + H;
  const T* bias = static_cast<const T*>(p.bias);
  std::vector<T> act(N);
  for (int64_t b = r0; b < r1; ++b) {
    T* gates = static_cast<T*>(p.gates) + b * N;
    const T* rec = static_cast<const T*>(p.gates_rec) + b * N;
    T* saved = static_cast<T*>(p.saved) + b * W;
    T *g_hat = saved, *r_hat = saved + N, *c_hat = saved + 2 * N, *tc = c_hat + H;
    T* rstd = tc + H;
    rstd[0] = layer_norm(gates, g_hat, N);
    rstd[1] = layer_norm(rec, r_hat, N);
    for (int64_t j = 0; j < N; ++j) {
      const T pre = g_ih[j] * g_hat[j] + g_hh[j] * r_hat[j] + bias[j];
      act[j] = j >= 2 * H && j < 3 * H ? std::tanh(pre) : sigmoid(pre);
    }
    const T* c_prev = static_cast<const T*>(p.c_prev) + b * H;
    T* c = static_cast<T*>(p.c) + b * H;
    for (int64_t j = 0; j < H; ++j) c[j] = act[H + j] * c_prev[j] + act[j] * act[2 * H + j];
    rstd[2] = layer_norm(c, c_hat, H);
    T* h = static_cast<T*>(p.h) + b * p.ldh;
    for (int64_t j = 0; j < H; ++j) {
      tc[j] = std::tanh(g_c[j] * c_hat[j] + b_c[j]);
      h[j] = act[3 * H + j] * tc[j];
    }
    if (p.gates_low) {
      for (int64_t j = 0; j < N; ++j) store_low(p.gates_low, p.low, b * N + j, act[j]);
    } else {
      for (int64_t j = 0; j < N; ++j) gates[j] = act[j];
    }
    if (p.h_low) {
      for (int64_t j = 0; j < H; ++j) store_low(p.h_low, p.low, b * p.ldh + j, h[j]);
    }
  }
}

//   dh = dh_out + dh_rec;  d(tanh arg) = dh o (1 - tc^2);  dLN(c) = that g_c
//   dc_t = dc + LN'(c)(dLN(c));  dpre as the LSTM's from dc_t and dh tc
//   dG = LN'(G)(dpre g_ih),  dR = LN'(R)(dpre g_hh),  dc <- dc_t f
//   dbias: d b_ih = d b_hh = dpre, d g_ih = dpre LN(G), d g_hh = dpre LN(R),
//          d g_c = d(tanh arg) LN(c), d b_c = d(tanh arg)
template <typename T>
void lnlstm_cell_backward(const CellBackward& p, int64_t r0, int64_t r1) {
  const int64_t H = p.hidden, N = 4 * H, W = 10 * H + 3;
  const T* g_ih = static_cast<const T*>(p.params);
  const T *g_hh = g_ih + N, *g_c = g_hh + N;
  std::vector<T> act(N), dpre(N), d_hat(N), dg(N), dr(N), dt(H), dc_hat(H), dc_norm(H);
  for (int64_t b = r0; b < r1; ++b) {
    const T* saved_act = p.gates ? static_cast<const T*>(p.gates) + b * N : nullptr;
    const int64_t low_row = b * N;
    for (int64_t j = 0; j < N; ++j)
      act[j] = p.gates_low ? T(load_low(p.gates_low, p.low, low_row + j)) : saved_act[j];
    const T* saved = static_cast<const T*>(p.saved) + b * W;
    const T *g_hat = saved, *r_hat = saved + N, *c_hat = saved + 2 * N, *tc = c_hat + H;
    const T* rstd = tc + H;
    const T* c_prev = static_cast<const T*>(p.c_prev) + b * H;
    const T* dh_out = p.dh_out ? static_cast<const T*>(p.dh_out) + b * p.ld_dh_out : nullptr;
    const T* dh_rec = p.dh_rec ? static_cast<const T*>(p.dh_rec) + b * H : nullptr;
    T* dc = static_cast<T*>(p.dc) + b * H;
    for (int64_t j = 0; j < H; ++j) {
      T dh = 0;
      if (dh_out) dh += dh_out[j];
      if (dh_rec) dh += dh_rec[j];
      const T o = act[3 * H + j];
      dt[j] = dh * o * (T(1) - tc[j] * tc[j]);
      dc_hat[j] = dt[j] * g_c[j];
      dpre[3 * H + j] = dh * tc[j] * o * (T(1) - o);
    }
    layer_norm_backward(dc_hat.data(), c_hat, rstd[2], dc_norm.data(), H);
    for (int64_t j = 0; j < H; ++j) {
      const T i = act[j], f = act[H + j], g = act[2 * H + j];
      const T dct = dc[j] + dc_norm[j];
      dpre[j] = dct * g * i * (T(1) - i);
      dpre[H + j] = dct * c_prev[j] * f * (T(1) - f);
      dpre[2 * H + j] = dct * i * (T(1) - g * g);
      dc[j] = dct * f;
    }
    for (int64_t j = 0; j < N; ++j) d_hat[j] = dpre[j] * g_ih[j];
    layer_norm_backward(d_hat.data(), g_hat, rstd[0], dg.data(), N);
    for (int64_t j = 0; j < N; ++j) d_hat[j] = dpre[j] * g_hh[j];
    layer_norm_backward(d_hat.data(), r_hat, rstd[1], dr.data(), N);
    if (p.dgates) {
      T* out = static_cast<T*>(p.dgates) + b * N;
      for (int64_t j = 0; j < N; ++j) out[j] = dg[j];
    }
    if (p.dgates_low) {
      for (int64_t j = 0; j < N; ++j) store_low(p.dgates_low, p.low, b * N + j, dg[j]);
    }
    if (p.dgates_rec) {
      T* out = static_cast<T*>(p.dgates_rec) + b * N;
      for (int64_t j = 0; j < N; ++j) out[j] = dr[j];
    }
    if (p.dgates_rec_low) {
      for (int64_t j = 0; j < N; ++j) store_low(p.dgates_rec_low, p.low, b * N + j, dr[j]);
    }
    if (p.dbias) {  // d b_ih, d b_hh, d g_ih, d g_hh, d g_c, d b_c
      T* db = static_cast<T*>(p.dbias);
      for (int64_t j = 0; j < N; ++j) {
        db[j] += dpre[j];
        db[N + j] += dpre[j];
        db[2 * N + j] += dpre[j] * g_hat[j];
        db[3 * N + j] += dpre[j] * r_hat[j];
      }
      for (int64_t j = 0; j < H; ++j) {
        db[4 * N + j] += dt[j] * c_hat[j];
        db[4 * N + H + j] += dt[j];
      }
    }
  }
}

}  // namespace seqforge::ref
