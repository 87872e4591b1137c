#pragma once
// The optimizers' element updates, PyTorch's order, as ref::adam_step and ref::sgd_step: the
// scalars are formed on the host in double and rounded to T once, as the reference does.
#include "kernels/cuda/common.cuh"

namespace seqforge::cuda {

template <typename T>
struct AdamScalars {
  T step_size, decay, b1, b2, eps, wd, one_minus_b1, one_minus_b2, gs, bc2_sqrt;
  bool decoupled, zero_grads;
};

template <typename T>
__global__ void adam_kernel(T* p, T* grad, T* m, T* v, int64_t n, AdamScalars<T> a) {
  SF_GRID_STRIDE(i, n) {
    T g = grad[i] * a.gs;
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
  T mom, damp, wd, lr, gs;
  bool decay, momentum, first_step, nesterov;
};

template <typename T>
__global__ void sgd_kernel(T* p, const T* grad, T* buf, int64_t n, SgdScalars<T> a) {
  SF_GRID_STRIDE(i, n) {
    T d = grad[i] * a.gs;
    if (a.decay) d += a.wd * p[i];
    if (a.momentum) {
      buf[i] = a.first_step ? d : buf[i] * a.mom + a.damp * d;
      d = a.nesterov ? d + a.mom * buf[i] : buf[i];
    }
    p[i] -= a.lr * d;
  }
}

}  // namespace seqforge::cuda
