#pragma once
// Scalar reference kernels, templated on the element type (float, double). They are the oracle
// every fast kernel is tested against, and the fallback for dtypes a fast path does not take.
// Row-range signatures let a backend split the work over threads.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include <cmath>
#include <cstdint>
#include <vector>

#include "seqforge/backend/backend.hpp"

namespace seqforge::ref {

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// A uniform number in [0, 1) that depends only on (seed, index): counter-based, so any thread or
// device draws the same value for the same element.
inline double hash_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed ^ (index * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

inline double widen(float x) { return x; }
inline double widen(double x) { return x; }
inline double widen(bf16 x) { return from_bf16(x); }

// C(m, n) = alpha * op(A) * op(B) + beta * C, rows [r0, r1) of C; accumulates in double.
// In = Out for f32 and f64; In = bf16 with Out = float for mixed precision.
template <typename In, typename T>
void gemm(const GemmShape& s, const In* a, const In* b, T* c, const T* bias, int64_t r0,
          int64_t r1) {
  for (int64_t i = r0; i < r1; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double av = widen(s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p]);
        const double bv = widen(s.trans_b ? b[j * s.ldb + p] : b[p * s.ldb + j]);
        acc += av * bv;
      }
      T& out = c[i * s.ldc + j];
      out = static_cast<T>(s.alpha * acc + (s.beta == 0.0f ? 0.0 : s.beta * double(out)) +
                           (bias ? double(bias[j]) : 0.0));
    }
  }
}

// Forward LSTM step for batch rows [r0, r1).
//   i = sig(a_i), f = sig(a_f), g = tanh(a_g), o = sig(a_o)
//   c = f * c_prev + i * g,  h = o * tanh(c)
template <typename T>
void lstm_cell_forward(const LstmCellForward& p, int64_t r0, int64_t r1) {
  const int64_t H = p.hidden;
  std::vector<T> row(p.gates ? 0 : 4 * H);  // a row's pre-activations when gates is null
  for (int64_t b = r0; b < r1; ++b) {
    T* gates = p.gates ? static_cast<T*>(p.gates) + b * 4 * H : row.data();  // (4H)
    const T* c_prev = static_cast<const T*>(p.c_prev) + b * H;
    T* c = static_cast<T*>(p.c) + b * H;
    T* tanh_c = static_cast<T*>(p.tanh_c) + b * H;
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
      if (p.gates_bf16) {
        bf16* low = static_cast<bf16*>(p.gates_bf16) + b * 4 * H;
        low[j] = to_bf16(static_cast<float>(i));
        low[H + j] = to_bf16(static_cast<float>(f));
        low[2 * H + j] = to_bf16(static_cast<float>(g));
        low[3 * H + j] = to_bf16(static_cast<float>(o));
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
    if (p.h_bf16) {
      bf16* low = static_cast<bf16*>(p.h_bf16) + b * p.ldh;
      for (int64_t j = 0; j < H; ++j) low[j] = to_bf16(static_cast<float>(h[j]));
    }
  }
}

// Backward LSTM step for batch rows [r0, r1).
//   dh = dh_out + dh_rec;  dc_t = dc + dh * o * (1 - tanh(c)^2)
//   da_i = dc_t * g * i(1-i);  da_f = dc_t * c_prev * f(1-f)
//   da_g = dc_t * i * (1-g^2); da_o = dh * tanh(c) * o(1-o);  dc <- dc_t * f
template <typename T>
void lstm_cell_backward(const LstmCellBackward& p, int64_t r0, int64_t r1) {
  const int64_t H = p.hidden;
  std::vector<T> row(p.dgates ? 0 : 4 * H);  // a row's dgates when only the bf16 copy is kept
  for (int64_t b = r0; b < r1; ++b) {
    const T* c_prev = static_cast<const T*>(p.c_prev) + b * H;
    const T* tanh_c = static_cast<const T*>(p.tanh_c) + b * H;
    const T* saved = p.gates ? static_cast<const T*>(p.gates) + b * 4 * H : nullptr;
    const bf16* saved_low =
        p.gates_bf16 ? static_cast<const bf16*>(p.gates_bf16) + b * 4 * H : nullptr;
    auto gate = [&](int64_t j) { return saved_low ? T(from_bf16(saved_low[j])) : saved[j]; };
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
    if (p.dgates_bf16) {
      bf16* low = static_cast<bf16*>(p.dgates_bf16) + b * 4 * H;
      for (int64_t j = 0; j < 4 * H; ++j) low[j] = to_bf16(static_cast<float>(dgates[j]));
    }
    if (p.dbias) {
      T* db = static_cast<T*>(p.dbias);
      for (int64_t j = 0; j < 4 * H; ++j) db[j] += dgates[j];
    }
  }
}

// Adam / AdamW over elements [i0, i1), PyTorch's update order.
template <typename T>
void adam_step(T* p, T* grad, T* m, T* v, const AdamParams& a, int64_t i0, int64_t i1) {
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(a.beta2, double(a.step)));
  const T step_size = T(a.lr / bc1);
  const T decay = T(1.0 - a.lr * a.weight_decay);
  const T b1 = T(a.beta1), b2 = T(a.beta2), eps = T(a.eps), wd = T(a.weight_decay);
  const T one_minus_b1 = T(1.0 - a.beta1), one_minus_b2 = T(1.0 - a.beta2);  // in double first
  const T gs = T(a.grad_scale);
  for (int64_t i = i0; i < i1; ++i) {
    T g = grad[i] * gs;
    if (a.zero_grads) grad[i] = T(0);
    if (a.decoupled) {
      p[i] *= decay;
    } else {
      g += wd * p[i];
    }
    m[i] = m[i] * b1 + g * one_minus_b1;
    v[i] = v[i] * b2 + g * g * one_minus_b2;
    const T denom = std::sqrt(v[i]) / T(bc2_sqrt) + eps;
    p[i] -= step_size * (m[i] / denom);
  }
}

// SGD with momentum / dampening / Nesterov / L2 weight decay, PyTorch's semantics.
template <typename T>
void sgd_step(T* p, const T* grad, T* buf, const SgdParams& a, int64_t i0, int64_t i1) {
  const T mom = T(a.momentum), damp = T(1.0 - a.dampening), wd = T(a.weight_decay);
  const T lr = T(a.lr), gs = T(a.grad_scale);
  for (int64_t i = i0; i < i1; ++i) {
    T d = grad[i] * gs;
    if (a.weight_decay != 0.0) d += wd * p[i];
    if (a.momentum != 0.0) {
      buf[i] = a.first_step ? d : buf[i] * mom + damp * d;
      d = a.nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

}  // namespace seqforge::ref
