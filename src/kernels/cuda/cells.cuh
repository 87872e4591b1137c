#pragma once
// The recurrent cells' pointwise steps, forward and backward, one thread per (batch row, hidden
// unit): each thread reads and writes only its unit's gates, so the activations may replace the
// pre-activations in place. The math is the reference's (kernels/cells/lstm.hpp, gru.hpp); the
// bias gradient is summed over the rows afterwards (sum_rows_acc), never with atomics.
// Each unit step comes in two parts: *_inputs loads what the step reads besides the recurrent
// product (so that a whole-chain kernel can issue those loads before it waits for the product),
// *_finish does the rest; *_unit is the two together.
#include "kernels/cuda/common.cuh"
#include "seqforge/backend/ops.hpp"

namespace seqforge::cuda {

template <typename T>
__device__ inline T sigmoid(T x) {
  return T(1) / (T(1) + exp(-x));
}

// The pre-activation of gate g of unit j for row b: G (+ the in-cell input projection when x is
// given: bias + x W_ih^T, written to gates when there are gates).
template <typename T>
__device__ inline T preact(const CellForward& p, int gates, int64_t b, int64_t gj) {
  const int64_t GH = gates * p.hidden;
  if (!p.x) return static_cast<const T*>(p.gates)[b * GH + gj];
  const T* x = static_cast<const T*>(p.x) + b * p.ldx;
  const T* w = static_cast<const T*>(p.w_ih_t);
  T acc = static_cast<const T*>(p.bias)[gj];
  for (int64_t k = 0; k < p.input; ++k) acc += x[k] * w[k * GH + gj];
  return acc;
}

template <typename T>
__device__ inline void store_gate(const CellForward& p, int gates, int64_t b, int64_t gj, T v) {
  const int64_t GH = gates * p.hidden;
  if (p.gates_low)
    store_low(p.gates_low, p.low, b * GH + gj, static_cast<float>(v));
  else
    static_cast<T*>(p.gates)[b * GH + gj] = v;
}

template <typename T>
__device__ inline T load_gate(const CellBackward& p, int gates, int64_t b, int64_t gj) {
  const int64_t GH = gates * p.hidden;
  if (p.gates_low) return T(load_low(p.gates_low, p.low, b * GH + gj));
  return static_cast<const T*>(p.gates)[b * GH + gj];
}

template <typename T>
__device__ inline void store_h(const CellForward& p, int64_t b, int64_t j, T h) {
  static_cast<T*>(p.h)[b * p.ldh + j] = h;
  if (p.h_low) store_low(p.h_low, p.low, b * p.ldh + j, static_cast<float>(h));
}

// dh_out's term of the incoming dh (0 without one); dh_rec's is added to it.
template <typename T>
__device__ inline T outer_dh(const CellBackward& p, int64_t b, int64_t j) {
  return p.dh_out ? static_cast<const T*>(p.dh_out)[b * p.ld_dh_out + j] : T(0);
}
template <typename T>
__device__ inline T rec_dh(const CellBackward& p, int64_t b, int64_t j) {
  return p.dh_rec ? static_cast<const T*>(p.dh_rec)[b * p.hidden + j] : T(0);
}

template <typename T>
__device__ inline T incoming_dh(const CellBackward& p, int64_t b, int64_t j) {
  return outer_dh<T>(p, b, j) + rec_dh<T>(p, b, j);
}

// dgates (never null here: the backend gives scratch when the step keeps only the low copy).
template <typename T>
__device__ inline void store_dgate(const CellBackward& p, int gates, int64_t b, int64_t gj, T v) {
  const int64_t GH = gates * p.hidden;
  static_cast<T*>(p.dgates)[b * GH + gj] = v;
  if (p.dgates_low) store_low(p.dgates_low, p.low, b * GH + gj, static_cast<float>(v));
}

// The recurrent pre-activations a unit's step adds: R(b, g*H + j) from gates_rec (or zero), or,
// in a whole-chain kernel, its own tile's (recurrence.cuh).
template <typename T>
struct GatesRec {
  const T* rec;  // (B, G*H) or null
  int64_t row;   // b * G*H + j
  int64_t hidden;
  __device__ T operator()(int g) const { return rec ? rec[row + g * hidden] : T(0); }
};

//   c = f c_prev + i g,  h = o tanh(c);  saved: tanh(c)
// Unit j of row b; rec(g) is gate g's recurrent pre-activation.
template <typename T>
struct LstmForwardInputs {
  T pre[4], c_prev;
};
// with_pre false: the pre-activations left 0, for a caller that computes them (a stack's upper
// layer in a whole-chain kernel).
template <typename T>
__device__ inline LstmForwardInputs<T> lstm_forward_inputs(const CellForward& p, int64_t b,
                                                           int64_t j, bool with_pre = true) {
  const int64_t H = p.hidden;
  LstmForwardInputs<T> in;
  for (int g = 0; g < 4; ++g) in.pre[g] = with_pre ? preact<T>(p, 4, b, g * H + j) : T(0);
  in.c_prev = static_cast<const T*>(p.c_prev)[b * H + j];
  return in;
}
template <typename T, typename Rec>
__device__ inline void lstm_forward_finish(const CellForward& p, int64_t b, int64_t j,
                                           const LstmForwardInputs<T>& in, const Rec& rec) {
  const int64_t H = p.hidden;
  T a[4];
  for (int g = 0; g < 4; ++g) a[g] = in.pre[g] + rec(g);
  const T i = sigmoid(a[0]), f = sigmoid(a[1]), g = tanh(a[2]), o = sigmoid(a[3]);
  store_gate(p, 4, b, j, i);
  store_gate(p, 4, b, H + j, f);
  store_gate(p, 4, b, 2 * H + j, g);
  store_gate(p, 4, b, 3 * H + j, o);
  const T c = f * in.c_prev + i * g;
  static_cast<T*>(p.c)[b * H + j] = c;
  const T tc = tanh(c);
  static_cast<T*>(p.saved)[b * H + j] = tc;
  store_h(p, b, j, o * tc);
}
template <typename T, typename Rec>
__device__ inline void lstm_forward_unit(const CellForward& p, int64_t b, int64_t j,
                                         const Rec& rec) {
  lstm_forward_finish<T>(p, b, j, lstm_forward_inputs<T>(p, b, j), rec);
}

template <typename T>
struct LstmBackwardInputs {
  T i, f, g, o, tc, dc, c_prev, dh_out;
};
template <typename T>
__device__ inline LstmBackwardInputs<T> lstm_backward_inputs(const CellBackward& p, int64_t b,
                                                             int64_t j) {
  const int64_t H = p.hidden;
  LstmBackwardInputs<T> in;
  in.i = load_gate<T>(p, 4, b, j), in.f = load_gate<T>(p, 4, b, H + j);
  in.g = load_gate<T>(p, 4, b, 2 * H + j), in.o = load_gate<T>(p, 4, b, 3 * H + j);
  in.tc = static_cast<const T*>(p.saved)[b * H + j];
  in.dc = static_cast<const T*>(p.dc)[b * H + j];
  in.c_prev = static_cast<const T*>(p.c_prev)[b * H + j];
  in.dh_out = outer_dh<T>(p, b, j);
  return in;
}
// dh_rec: the recurrent term of the incoming dh.
template <typename T>
__device__ inline void lstm_backward_finish(const CellBackward& p, int64_t b, int64_t j,
                                            const LstmBackwardInputs<T>& in, T dh_rec) {
  const int64_t H = p.hidden;
  const T i = in.i, f = in.f, g = in.g, o = in.o, tc = in.tc;
  const T dh = in.dh_out + dh_rec;
  const T dct = in.dc + dh * o * (T(1) - tc * tc);
  store_dgate(p, 4, b, j, dct * g * i * (T(1) - i));
  store_dgate(p, 4, b, H + j, dct * in.c_prev * f * (T(1) - f));
  store_dgate(p, 4, b, 2 * H + j, dct * i * (T(1) - g * g));
  store_dgate(p, 4, b, 3 * H + j, dh * tc * o * (T(1) - o));
  static_cast<T*>(p.dc)[b * H + j] = dct * f;
}
template <typename T>
__device__ inline void lstm_backward_unit(const CellBackward& p, int64_t b, int64_t j) {
  lstm_backward_finish<T>(p, b, j, lstm_backward_inputs<T>(p, b, j), rec_dh<T>(p, b, j));
}

//   r = sig(G_r + R_r), z = sig(G_z + R_z), hn = R_n + b_hn, n = tanh(G_n + r hn),
//   h = n + z (h_prev - n);  saved: hn
template <typename T>
struct GruForwardInputs {
  T pre[3], bias_hn, h_prev;
};
template <typename T>
__device__ inline GruForwardInputs<T> gru_forward_inputs(const CellForward& p, int64_t b, int64_t j,
                                                         bool with_pre = true) {
  const int64_t H = p.hidden;
  GruForwardInputs<T> in;
  for (int g = 0; g < 3; ++g) in.pre[g] = with_pre ? preact<T>(p, 3, b, g * H + j) : T(0);
  in.bias_hn = static_cast<const T*>(p.bias_rec)[j];
  in.h_prev = static_cast<const T*>(p.h_prev)[b * p.ld_h_prev + j];
  return in;
}
template <typename T, typename Rec>
__device__ inline void gru_forward_finish(const CellForward& p, int64_t b, int64_t j,
                                          const GruForwardInputs<T>& in, const Rec& rec) {
  const int64_t H = p.hidden;
  const T r = sigmoid(in.pre[0] + rec(0));
  const T z = sigmoid(in.pre[1] + rec(1));
  const T hn = rec(2) + in.bias_hn;
  static_cast<T*>(p.saved)[b * H + j] = hn;
  const T n = tanh(in.pre[2] + r * hn);
  store_gate(p, 3, b, j, r);
  store_gate(p, 3, b, H + j, z);
  store_gate(p, 3, b, 2 * H + j, n);
  store_h(p, b, j, n + z * (in.h_prev - n));
}
template <typename T, typename Rec>
__device__ inline void gru_forward_unit(const CellForward& p, int64_t b, int64_t j,
                                        const Rec& rec) {
  gru_forward_finish<T>(p, b, j, gru_forward_inputs<T>(p, b, j), rec);
}

//   da_n = dh (1 - z)(1 - n^2), da_r = da_n hn r (1 - r), da_z = dh (h_prev - n) z (1 - z)
//   dG = [da_r, da_z, da_n], dR = [da_r, da_z, da_n r], dh_direct = dh z
template <typename T>
struct GruBackwardInputs {
  T r, z, n, hn, h_prev, dh_out;
};
template <typename T>
__device__ inline GruBackwardInputs<T> gru_backward_inputs(const CellBackward& p, int64_t b,
                                                           int64_t j) {
  const int64_t H = p.hidden;
  GruBackwardInputs<T> in;
  in.r = load_gate<T>(p, 3, b, j), in.z = load_gate<T>(p, 3, b, H + j);
  in.n = load_gate<T>(p, 3, b, 2 * H + j);
  in.hn = static_cast<const T*>(p.saved)[b * H + j];
  in.h_prev = static_cast<const T*>(p.h_prev)[b * p.ld_h_prev + j];
  in.dh_out = outer_dh<T>(p, b, j);
  return in;
}
// dh_rec: the recurrent term of the incoming dh (with the direct term of the step after).
template <typename T>
__device__ inline void gru_backward_finish(const CellBackward& p, int64_t b, int64_t j,
                                           const GruBackwardInputs<T>& in, T dh_rec) {
  const int64_t H = p.hidden;
  const T r = in.r, z = in.z, n = in.n, hn = in.hn;
  const T dh = in.dh_out + dh_rec;
  const T da_n = dh * (T(1) - z) * (T(1) - n * n);
  const T da_r = da_n * hn * r * (T(1) - r);
  const T da_z = dh * (in.h_prev - n) * z * (T(1) - z);
  store_dgate(p, 3, b, j, da_r);
  store_dgate(p, 3, b, H + j, da_z);
  store_dgate(p, 3, b, 2 * H + j, da_n);
  T* drec = static_cast<T*>(p.dgates_rec) + b * 3 * H;
  const T rec[3] = {da_r, da_z, da_n * r};
  for (int g = 0; g < 3; ++g) {
    drec[g * H + j] = rec[g];
    if (p.dgates_rec_low)
      store_low(p.dgates_rec_low, p.low, b * 3 * H + g * H + j, static_cast<float>(rec[g]));
  }
  static_cast<T*>(p.dh_direct)[b * H + j] = dh * z;
}
template <typename T>
__device__ inline void gru_backward_unit(const CellBackward& p, int64_t b, int64_t j) {
  gru_backward_finish<T>(p, b, j, gru_backward_inputs<T>(p, b, j), rec_dh<T>(p, b, j));
}

template <typename T>
__global__ void lstm_forward_kernel(CellForward p) {
  const int64_t H = p.hidden;
  SF_GRID_STRIDE(idx, p.batch * H) {
    const int64_t b = idx / H, j = idx % H;
    lstm_forward_unit<T>(p, b, j,
                         GatesRec<T>{static_cast<const T*>(p.gates_rec), b * 4 * H + j, H});
  }
}

template <typename T>
__global__ void lstm_backward_kernel(CellBackward p) {
  SF_GRID_STRIDE(idx, p.batch * p.hidden) {
    lstm_backward_unit<T>(p, idx / p.hidden, idx % p.hidden);
  }
}

template <typename T>
__global__ void gru_forward_kernel(CellForward p) {
  const int64_t H = p.hidden;
  SF_GRID_STRIDE(idx, p.batch * H) {
    const int64_t b = idx / H, j = idx % H;
    gru_forward_unit<T>(p, b, j, GatesRec<T>{static_cast<const T*>(p.gates_rec), b * 3 * H + j, H});
  }
}

template <typename T>
__global__ void gru_backward_kernel(CellBackward p) {
  SF_GRID_STRIDE(idx, p.batch * p.hidden) {
    gru_backward_unit<T>(p, idx / p.hidden, idx % p.hidden);
  }
}

}  // namespace seqforge::cuda
