#pragma once
// The GRU cell's reference kernels, PyTorch's nn.GRU (gate order r, z, n; the reset gate scales
// the recurrent part of n including its bias), for batch rows [r0, r1); the SIMD kernels are in
// kernels/cpu/gru_simd.cpp.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/reference.hpp"

namespace seqforge::ref {

// G = x W_ih^T + (b_ih + [b_hr, b_hz, 0]) (given, or made here from x), R = h_prev W_hh^T:
//   r = sig(G_r + R_r),  z = sig(G_z + R_z),  hn = R_n + b_hn,  n = tanh(G_n + r hn)
//   h = (1 - z) n + z h_prev = n + z (h_prev - n);  saved: hn
template <typename T>
void gru_cell_forward(const CellForward& p, int64_t r0, int64_t r1) {
  const int64_t H = p.hidden;
  std::vector<T> row(p.gates ? 0 : 3 * H);  // a row's input projection when gates is null
  const T* b_hn = static_cast<const T*>(p.bias_rec);
  for (int64_t b = r0; b < r1; ++b) {
    T* gates = p.gates ? static_cast<T*>(p.gates) + b * 3 * H : row.data();  // (3H)
    const T* rec = static_cast<const T*>(p.gates_rec) + b * 3 * H;
    const T* h_prev = static_cast<const T*>(p.h_prev) + b * p.ld_h_prev;
    T* hn = static_cast<T*>(p.saved) + b * H;
    T* h = static_cast<T*>(p.h) + b * p.ldh;
    if (p.x) {
      const T* x = static_cast<const T*>(p.x) + b * p.ldx;
      const T* w = static_cast<const T*>(p.w_ih_t);
      const T* bias = static_cast<const T*>(p.bias);
      for (int64_t j = 0; j < 3 * H; ++j) {
        T acc = bias[j];
        for (int64_t k = 0; k < p.input; ++k) acc += x[k] * w[k * 3 * H + j];
        gates[j] = acc;
      }
    }
    for (int64_t j = 0; j < H; ++j) {
      const T r = sigmoid(gates[j] + rec[j]);
      const T z = sigmoid(gates[H + j] + rec[H + j]);
      hn[j] = rec[2 * H + j] + b_hn[j];
      const T n = std::tanh(gates[2 * H + j] + r * hn[j]);
      if (p.gates_low) {
        store_low(p.gates_low, p.low, b * 3 * H + j, r);
        store_low(p.gates_low, p.low, b * 3 * H + H + j, z);
        store_low(p.gates_low, p.low, b * 3 * H + 2 * H + j, n);
      } else {
        gates[j] = r;
        gates[H + j] = z;
        gates[2 * H + j] = n;
      }
      h[j] = n + z * (h_prev[j] - n);
    }
    if (p.h_low) {
      for (int64_t j = 0; j < H; ++j) store_low(p.h_low, p.low, b * p.ldh + j, h[j]);
    }
  }
}

//   dh = dh_out + dh_rec;  dn = dh (1 - z);  da_n = dn (1 - n^2)
//   da_r = da_n hn r (1 - r);  da_z = dh (h_prev - n) z (1 - z)
//   dG = [da_r, da_z, da_n],  dR = [da_r, da_z, da_n r],  dh_direct = dh z
template <typename T>
void gru_cell_backward(const CellBackward& p, int64_t r0, int64_t r1) {
  const int64_t H = p.hidden;
  std::vector<T> row(p.dgates ? 0 : 3 * H), row_rec(p.dgates_rec ? 0 : 3 * H);
  for (int64_t b = r0; b < r1; ++b) {
    const T* saved = p.gates ? static_cast<const T*>(p.gates) + b * 3 * H : nullptr;
    const int64_t low_row = b * 3 * H;
    auto gate = [&](int64_t j) {
      return p.gates_low ? T(load_low(p.gates_low, p.low, low_row + j)) : saved[j];
    };
    const T* hn = static_cast<const T*>(p.saved) + b * H;
    const T* h_prev = static_cast<const T*>(p.h_prev) + b * p.ld_h_prev;
    const T* dh_out = p.dh_out ? static_cast<const T*>(p.dh_out) + b * p.ld_dh_out : nullptr;
    const T* dh_rec = p.dh_rec ? static_cast<const T*>(p.dh_rec) + b * H : nullptr;
    T* dgates = p.dgates ? static_cast<T*>(p.dgates) + b * 3 * H : row.data();
    T* drec = p.dgates_rec ? static_cast<T*>(p.dgates_rec) + b * 3 * H : row_rec.data();
    T* dh_direct = static_cast<T*>(p.dh_direct) + b * H;
    for (int64_t j = 0; j < H; ++j) {
      const T r = gate(j), z = gate(H + j), n = gate(2 * H + j);
      T dh = 0;
      if (dh_out) dh += dh_out[j];
      if (dh_rec) dh += dh_rec[j];
      const T da_n = dh * (T(1) - z) * (T(1) - n * n);
      const T da_r = da_n * hn[j] * r * (T(1) - r);
      const T da_z = dh * (h_prev[j] - n) * z * (T(1) - z);
      dgates[j] = drec[j] = da_r;
      dgates[H + j] = drec[H + j] = da_z;
      dgates[2 * H + j] = da_n;
      drec[2 * H + j] = da_n * r;
      dh_direct[j] = dh * z;
    }
    if (p.dgates_low) {
      for (int64_t j = 0; j < 3 * H; ++j) store_low(p.dgates_low, p.low, b * 3 * H + j, dgates[j]);
    }
    if (p.dgates_rec_low) {
      for (int64_t j = 0; j < 3 * H; ++j)
        store_low(p.dgates_rec_low, p.low, b * 3 * H + j, drec[j]);
    }
    if (p.dbias) {
      T* db = static_cast<T*>(p.dbias);
      for (int64_t j = 0; j < 3 * H; ++j) db[j] += dgates[j];
      for (int64_t j = 0; j < 3 * H; ++j) db[3 * H + j] += drec[j];
    }
  }
}

}  // namespace seqforge::ref
