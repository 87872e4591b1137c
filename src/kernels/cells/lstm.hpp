#pragma once
// The LSTM cell's reference kernels (gate order i, f, g, o, as PyTorch's nn.LSTM), for batch
// rows [r0, r1); the SIMD kernels are in kernels/cpu/lstm_simd.cpp.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/reference.hpp"

namespace seqforge::ref {

// Forward LSTM step for batch rows [r0, r1).
//   i = sig(a_i), f = sig(a_f), g = tanh(a_g), o = sig(a_o)
//   c = f * c_prev + i * g,  h = o * tanh(c)
template <typename T>
void lstm_cell_forward(const CellForward& p, int64_t r0, int64_t r1) {
  const int64_t H = p.hidden;
  std::vector<T> row(p.gates ? 0 : 4 * H);  // a row's pre-activations when gates is null
  for (int64_t b = r0; b < r1; ++b) {
    T* gates = p.gates ? static_cast<T*>(p.gates) + b * 4 * H : row.data();  // (4H)
    const T* c_prev = static_cast<const T*>(p.c_prev) + b * H;
    T* c = static_cast<T*>(p.c) + b * H;
    T* tanh_c = static_cast<T*>(p.saved) + b * H;
    T* h = static_cast<T*>(p.h) + b * p.ldh;
    if (p.x) {
      const T* x = static_cast<const T*>(p.x) + b * p.ldx;
      const T* w = static_cast<const T*>(p.w_ih_t);
      const T* bias = static_cast<const T*>(p.bias);
      for (int64_t j = 0; j < 4 * H; ++j) {
        T acc = bias[j];
        for (int64_t k = 0; k < p.input; ++k) acc += x[k] * w[k * 4 * H + j];
        gates[j] = acc;
      }
    }
    if (p.gates_rec) {
      const T* rec = static_cast<const T*>(p.gates_rec) + b * 4 * H;
      for (int64_t j = 0; j < 4 * H; ++j) gates[j] += rec[j];
    }
    for (int64_t j = 0; j < H; ++j) {
      const T i = sigmoid(gates[j]);
      const T f = sigmoid(gates[H + j]);
      const T g = std::tanh(gates[2 * H + j]);
      const T o = sigmoid(gates[3 * H + j]);
      if (p.gates_low) {
        store_low(p.gates_low, p.low, b * 4 * H + j, i);
        store_low(p.gates_low, p.low, b * 4 * H + H + j, f);
        store_low(p.gates_low, p.low, b * 4 * H + 2 * H + j, g);
        store_low(p.gates_low, p.low, b * 4 * H + 3 * H + j, o);
      } else {
        gates[j] = i;
        gates[H + j] = f;
        gates[2 * H + j] = g;
        gates[3 * H + j] = o;
      }
      c[j] = f * c_prev[j] + i * g;
      tanh_c[j] = std::tanh(c[j]);
      h[j] = o * tanh_c[j];
    }
    if (p.h_low) {
      for (int64_t j = 0; j < H; ++j) store_low(p.h_low, p.low, b * p.ldh + j, h[j]);
    }
  }
}

// Backward LSTM step for batch rows [r0, r1).
//   dh = dh_out + dh_rec;  dc_t = dc + dh * o * (1 - tanh(c)^2)
//   da_i = dc_t * g * i(1-i);  da_f = dc_t * c_prev * f(1-f)
//   da_g = dc_t * i * (1-g^2); da_o = dh * tanh(c) * o(1-o);  dc <- dc_t * f
template <typename T>
void lstm_cell_backward(const CellBackward& p, int64_t r0, int64_t r1) {
  const int64_t H = p.hidden;
  std::vector<T> row(p.dgates ? 0 : 4 * H);  // a row's dgates when only the low copy is kept
  for (int64_t b = r0; b < r1; ++b) {
    const T* c_prev = static_cast<const T*>(p.c_prev) + b * H;
    const T* tanh_c = static_cast<const T*>(p.saved) + b * H;
    const T* saved = p.gates ? static_cast<const T*>(p.gates) + b * 4 * H : nullptr;
    const int64_t low_row = b * 4 * H;
    auto gate = [&](int64_t j) {
      return p.gates_low ? T(load_low(p.gates_low, p.low, low_row + j)) : saved[j];
    };
    const T* dh_out = p.dh_out ? static_cast<const T*>(p.dh_out) + b * p.ld_dh_out : nullptr;
    const T* dh_rec = p.dh_rec ? static_cast<const T*>(p.dh_rec) + b * H : nullptr;
    T* dc = static_cast<T*>(p.dc) + b * H;
    T* dgates = p.dgates ? static_cast<T*>(p.dgates) + b * 4 * H : row.data();
    for (int64_t j = 0; j < H; ++j) {
      const T i = gate(j), f = gate(H + j), g = gate(2 * H + j), o = gate(3 * H + j);
      T dh = 0;
      if (dh_out) dh += dh_out[j];
      if (dh_rec) dh += dh_rec[j];
      const T tc = tanh_c[j];
      const T dct = dc[j] + dh * o * (T(1) - tc * tc);
      dgates[j] = dct * g * i * (T(1) - i);
      dgates[H + j] = dct * c_prev[j] * f * (T(1) - f);
      dgates[2 * H + j] = dct * i * (T(1) - g * g);
      dgates[3 * H + j] = dh * tc * o * (T(1) - o);
      dc[j] = dct * f;
    }
    if (p.dgates_low) {
      for (int64_t j = 0; j < 4 * H; ++j) store_low(p.dgates_low, p.low, b * 4 * H + j, dgates[j]);
    }
    if (p.dbias) {
      T* db = static_cast<T*>(p.dbias);
      for (int64_t j = 0; j < 4 * H; ++j) db[j] += dgates[j];
    }
  }
}

}  // namespace seqforge::ref
