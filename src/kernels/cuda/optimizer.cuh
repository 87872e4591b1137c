#pragma once
// The optimizers' element updates, PyTorch's order, as ref::adam_step and ref::sgd_step: the
// scalars are formed on the host in double and rounded to T once, as the reference does; the
// gradients' factor (unscaling, clipping, an overflowed step skipped) from their sum of squares
// in device memory, by each thread.
#include "kernels/cuda/common.cuh"
#include "kernels/grad_clip.hpp"

namespace seqforge::cuda {

template <typename T>
struct AdamScalars {
  T step_size, decay, b1, b2, eps, wd, one_minus_b1, one_minus_b2, bc2_sqrt;
  double grad_scale;
  GradClip clip;
  bool decoupled, zero_grads;
};

template <typename T>
__global__ void adam_kernel(T* p, T* grad, T* m, T* v, int64_t n, AdamScalars<T> a) {
  bool skip;
  const T gs = T(ref::gradient_factor(a.grad_scale, a.clip, &skip));
  SF_GRID_STRIDE(i, n) {
    if (skip) {  // an overflowed step: only the gradients are cleared
      if (a.zero_grads) grad[i] = T(0);
      continue;
    }
    T g = grad[i] * gs;
    if (a.zero_grads) grad[i] = T(0);
    if (a.decoupled) {
      p[i] *= a.decay;
    } else {
      g += a.wd * p[i];
    }
    m[i] = m[i] * a.b1 + g * a.one_minus_b1;
    v[i] = v[i] * a.b2 + g * g * a.one_minus_b2;
    const T denom = sqrt(v[i]) / a.bc2_sqrt + a.eps;
    p[i] -= a.step_size * (m[i] / denom);
  }
}

template <typename T>
struct SgdScalars {
  T mom, damp, wd, lr;
  double grad_scale;
  GradClip clip;
  bool decay, momentum, first_step, nesterov;
};

template <typename T>
__global__ void sgd_kernel(T* p, const T* grad, T* buf, int64_t n, SgdScalars<T> a) {
  bool skip;
  const T gs = T(ref::gradient_factor(a.grad_scale, a.clip, &skip));
  if (skip) return;
  SF_GRID_STRIDE(i, n) {
    T d = grad[i] * gs;
    if (a.decay) d += a.wd * p[i];
    if (a.momentum) {
      buf[i] = a.first_step ? d : buf[i] * a.mom + a.damp * d;
      d = a.nesterov ? d + a.mom * buf[i] : buf[i];
    }
    p[i] -= a.lr * d;
  }
}

}  // namespace seqforge::cuda
