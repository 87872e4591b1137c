#pragma once
// The optimizers' element updates, PyTorch's order, as ref::adam_step and ref::sgd_step: the
// scalars are formed in double and rounded to T once, as the reference does; the
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

// Element i of an Adam or AdamW update by gs * grad[i].
template <typename T>
__device__ inline void adam_update(T* p, T* grad, T* m, T* v, int64_t i, T gs,
                                   const AdamScalars<T>& a) {
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

template <typename T>
__global__ void adam_kernel(T* p, T* grad, T* m, T* v, int64_t n, AdamScalars<T> a) {
  bool skip;
  const T gs = T(ref::gradient_factor(a.grad_scale, a.clip, &skip));
  SF_GRID_STRIDE(i, n) {
    if (skip) {  // an overflowed step: only the gradients are cleared
      if (a.zero_grads) grad[i] = T(0);
      continue;
    }
    adam_update(p, grad, m, v, i, gs, a);
  }
}

template <typename T>
struct SgdScalars {
  T mom, damp, wd, lr;
  double grad_scale;
  GradClip clip;
  bool decay, momentum, first_step, nesterov;
};

// Element i of an SGD update by gs * grad[i].
template <typename T>
__device__ inline void sgd_update(T* p, const T* grad, T* buf, int64_t i, T gs,
                                  const SgdScalars<T>& a) {
  T d = grad[i] * gs;
  if (a.decay) d += a.wd * p[i];
  if (a.momentum) {
    buf[i] = a.first_step ? d : buf[i] * a.mom + a.damp * d;
    d = a.nesterov ? d + a.mom * buf[i] : buf[i];
  }
  p[i] -= a.lr * d;
}

template <typename T>
__global__ void sgd_kernel(T* p, const T* grad, T* buf, int64_t n, SgdScalars<T> a) {
  bool skip;
  const T gs = T(ref::gradient_factor(a.grad_scale, a.clip, &skip));
  if (skip) return;
  SF_GRID_STRIDE(i, n) sgd_update(p, grad, buf, i, gs, a);
}

// The whole update in one pass (OptimizerStep): blocks stride over tiles of the gradient arena,
// each thread walking its elements' segments upward and forming a segment's scalars from the
// learning rate and update count in device memory, in double as the host forms them.
constexpr int64_t kOptimizerTile = 8 * kThreads;

__device__ inline int64_t segment_at(const OptimizerStep& a, int64_t i) {
  int64_t lo = 0, hi = a.segment_count - 1;  // the last segment starting at or before i
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a.segments[mid].grad_offset <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

template <typename T>
__global__ void optimizer_kernel(OptimizerStep a) {
  bool skip;
  const T gs = T(ref::gradient_factor(a.grad_scale, a.clip, &skip));
  const double lr = *a.lr;
  T* p = static_cast<T*>(a.params);
  T* grad = static_cast<T*>(a.grads);
  T* m = static_cast<T*>(a.m);
  T* v = static_cast<T*>(a.v);
  for (int64_t begin = int64_t(blockIdx.x) * kOptimizerTile; begin < a.grad_elements;
       begin += int64_t(gridDim.x) * kOptimizerTile) {
    const int64_t end =
        begin + kOptimizerTile < a.grad_elements ? begin + kOptimizerTile : a.grad_elements;
    int64_t i = begin + threadIdx.x;
    if (i >= end) continue;
    int64_t s = segment_at(a, i), seg_begin = 0, seg_end = 0, value_shift = 0;
    bool frozen = true, scalars_for_s = false;
    AdamScalars<T> adam{};
    SgdScalars<T> sgd{};
    for (; i < end; i += blockDim.x) {
      while (s + 1 < a.segment_count && a.segments[s + 1].grad_offset <= i) {
        ++s;
        scalars_for_s = false;
      }
      if (!scalars_for_s) {
        const OptimizerSegment seg = a.segments[s];
        seg_begin = seg.grad_offset;
        seg_end = seg.grad_offset + seg.numel;
        value_shift = seg.value_offset - seg.grad_offset;
        frozen = seg.flags & OptimizerSegment::kFrozen;
        const double step = double(a.steps[s] + 1);
        const double wd = seg.flags & OptimizerSegment::kDecays ? a.weight_decay : 0.0;
        if (a.kind == OptimizerKind::sgd) {
          sgd = {T(a.momentum), T(1.0 - a.dampening), T(wd),       T(lr),     1.0, {},
                 wd != 0.0,     a.momentum != 0.0,    step == 1.0, a.nesterov};
        } else {
          adam = {T(lr / (1.0 - pow(a.beta1, step))),
                  T(1.0 - mul_rn(lr, wd)),
                  T(a.beta1),
                  T(a.beta2),
                  T(a.eps),
                  T(wd),
                  T(1.0 - a.beta1),
                  T(1.0 - a.beta2),
                  T(sqrt(1.0 - pow(a.beta2, step))),
                  1.0,
                  {},
                  a.kind == OptimizerKind::adamw,
                  a.zero_grads};
        }
        scalars_for_s = true;
      }
      if (i < seg_begin || i >= seg_end) continue;  // padding between segments
      if (frozen || skip) {
        if (a.zero_grads) grad[i] = T(0);
        continue;
      }
      if (a.kind == OptimizerKind::sgd) {
        sgd_update(p + value_shift, grad, m, i, gs, sgd);
        if (a.zero_grads) grad[i] = T(0);
      } else {
        adam_update(p + value_shift, grad, m, v, i, gs, adam);
      }
    }
  }
}

// Afterwards: one more update for each segment updated.
__global__ void count_updates_kernel(OptimizerStep a) {
  bool skip;
  ref::gradient_factor(a.grad_scale, a.clip, &skip);
  if (skip) return;
  for (int64_t s = threadIdx.x; s < a.segment_count; s += blockDim.x)
    if (!(a.segments[s].flags & OptimizerSegment::kFrozen)) ++a.steps[s];
}

}  // namespace seqforge::cuda
