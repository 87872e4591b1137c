#pragma once
// Scalar reference kernels, templated on the element type (float, double). They are the oracle
// every fast kernel is tested against, and the fallback for dtypes a fast path does not take.
// Row-range signatures let a backend split the work over threads.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are assigned (=).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/counter_hash.hpp"
#include "kernels/grad_clip.hpp"
#include "kernels/regression_loss.hpp"
#include "seqforge/backend/ops.hpp"
#include "seqforge/core/dtype.hpp"

namespace seqforge::ref {

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// A uniform number in [0, 1) that depends only on (seed, index): its top 53 bits.
inline double hash_uniform(uint64_t seed, uint64_t index) {
  return static_cast<double>(counter_hash(seed, index) >> 11) * 0x1.0p-53;
}

// hash_uniform(seed, i) < p exactly when counter_hash(seed, i) >> 11 < uniform_below(p):
// ceil(p 2^53), exact in double for p in [0, 1].
inline uint64_t uniform_below(double p) {
  return static_cast<uint64_t>(std::ceil(std::ldexp(p, 53)));
}

inline double widen(float x) { return x; }
inline double widen(double x) { return x; }
inline double widen(bf16 x) { return from_bf16(x); }
inline double widen(f16 x) { return from_f16(x.bits); }

// Element i of a half-precision copy (`low`: bf16 or f16), rounded through f32 as the host's
// converters round.
inline void store_low(void* p, DType low, int64_t i, double v) {
  if (low == DType::f16)
    static_cast<f16*>(p)[i].bits = to_f16(static_cast<float>(v));
  else
    static_cast<bf16*>(p)[i] = to_bf16(static_cast<float>(v));
}
inline double load_low(const void* p, DType low, int64_t i) {
  return low == DType::f16 ? widen(static_cast<const f16*>(p)[i])
                           : widen(static_cast<const bf16*>(p)[i]);
}

// C(m, n) = alpha * op(A) * op(B) + beta * C, rows [r0, r1) of C; accumulates in double, each
// element's products summed in order of p. B is read in its memory order (along rows for
// op(B) = B, along columns for op(B) = B^T), not across a long K.
// In = Out for f32 and f64; In = bf16 or f16 with Out = float for mixed precision.
template <typename In, typename T>
void gemm(const GemmShape& s, const In* a, const In* b, T* c, const T* bias, int64_t r0,
          int64_t r1) {
  std::vector<double> acc(static_cast<size_t>(s.n));
  for (int64_t i = r0; i < r1; ++i) {
    auto a_at = [&](int64_t p) { return widen(s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p]); };
    if (s.trans_b) {
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < s.k; ++p) sum += a_at(p) * widen(b[j * s.ldb + p]);
        acc[j] = sum;
      }
    } else {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t p = 0; p < s.k; ++p) {
        const double av = a_at(p);
        const In* b_row = b + p * s.ldb;
        for (int64_t j = 0; j < s.n; ++j) acc[j] += av * widen(b_row[j]);
      }
    }
    for (int64_t j = 0; j < s.n; ++j) {
      T& out = c[i * s.ldc + j];
      out = static_cast<T>(s.alpha * acc[j] + (s.beta == 0.0 ? 0.0 : s.beta * double(out)) +
                           (bias ? double(bias[j]) : 0.0));
    }
  }
}

// Adam / AdamW over elements [i0, i1), PyTorch's update order.
template <typename T>
void adam_step(T* p, T* grad, T* m, T* v, const AdamParams& a, int64_t i0, int64_t i1) {
  bool skip;
  const T gs = T(gradient_factor(a.grad_scale, a.clip, &skip));
  if (skip) {  // an overflowed step: only the gradients are cleared
    if (a.zero_grads)
      for (int64_t i = i0; i < i1; ++i) grad[i] = T(0);
    return;
  }
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(a.beta2, double(a.step)));
  const T step_size = T(a.lr / bc1);
  const T decay = T(1.0 - a.lr * a.weight_decay);
  const T b1 = T(a.beta1), b2 = T(a.beta2), eps = T(a.eps), wd = T(a.weight_decay);
  const T one_minus_b1 = T(1.0 - a.beta1), one_minus_b2 = T(1.0 - a.beta2);  // in double first
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
  bool skip;
  const T gs = T(gradient_factor(a.grad_scale, a.clip, &skip));
  if (skip) return;
  const T mom = T(a.momentum), damp = T(1.0 - a.dampening), wd = T(a.weight_decay);
  const T lr = T(a.lr);
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
