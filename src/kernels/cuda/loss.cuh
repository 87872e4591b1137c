#pragma once
// Loss kernels: gradients written per element, the loss and its denominator reduced in double on
// the device (sums[0], sums[1]; per block, then in a fixed order: block_partial), and the loss
// formed from them there (mean_kernel).
#include "kernels/cuda/common.cuh"
#include "kernels/regression_loss.hpp"

namespace seqforge::cuda {

// Block sum of `v` in double into *out.
__device__ inline void block_add(double* out, double v) {
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0 && partial[0] != 0) atomicAdd(out, partial[0]);
}

// sums[1] = the selected rows.
template <typename T>
__global__ void count_selected_kernel(const T* mask, int64_t rows, double* sums) {
  double n = 0;
  SF_GRID_STRIDE(r, rows) n += (!mask || mask[r] != T(0)) ? 1.0 : 0.0;
  block_add(sums + 1, n);
}

// denom = selected * f, known after count_selected_kernel; each term as the reference's.
template <typename T>
__global__ void regression_kernel(RegressionLoss kind, const T* pred, const T* target,
                                  const T* mask, T* dpred, int64_t rows, int64_t f,
                                  const double* sums, double* partials) {
  const double denom = sums[1] * double(f);
  double loss = 0;
  SF_GRID_STRIDE(i, rows * f) {
    const bool on = !mask || mask[i / f] != T(0);
    double value, grad;
    ref::regression_term(kind, double(pred[i]) - double(target[i]), i % f, &value, &grad);
    if (on) loss += value;
    dpred[i] = on ? static_cast<T>(grad / denom) : T(0);
  }
  block_partial(partials, loss);
}

template <typename I>
__device__ inline int64_t target_at(const void* targets, int64_t r) {
  return static_cast<int64_t>(static_cast<const I*>(targets)[r]);
}

// sums[1] = the total weight of the counted rows; a target out of range goes to bad_row
// (report_bad).
template <typename T, typename I>
__global__ void class_weight_kernel(const void* targets, const T* weights, int64_t ignore_index,
                                    int64_t rows, int64_t classes, double* partials,
                                    unsigned long long* bad_row) {
  double total = 0;
  SF_GRID_STRIDE(r, rows) {
    const int64_t y = target_at<I>(targets, r);
    if (y == ignore_index) continue;
    if (y < 0 || y >= classes) {
      report_bad(bad_row, r);
      continue;
    }
    total += weights ? double(weights[y]) : 1.0;
  }
  block_partial(partials, total);
}

// One block per row: max, log-sum-exp, then the gradient; the sums and the log-sum-exp in double,
// the exponentials in T.
template <typename T, typename I>
__global__ void cross_entropy_kernel(const T* logits, const void* targets, const T* weights,
                                     int64_t ignore_index, T* dlogits, int64_t rows,
                                     int64_t classes, const double* sums, double* partials) {
  __shared__ double shared[kThreads];
  const double total_weight = sums[1];
  double block_loss = 0;  // thread 0's: the block's rows' weighted terms
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * classes;
    T* d = dlogits + r * classes;
    const int64_t y = target_at<I>(targets, r);
    if (y == ignore_index || y < 0 || y >= classes || total_weight == 0) {
      for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) d[j] = T(0);
      continue;
    }
    double mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) mx = fmax(mx, double(x[j]));
    shared[threadIdx.x] = mx;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half)
        shared[threadIdx.x] = fmax(shared[threadIdx.x], shared[threadIdx.x + half]);
      __syncthreads();
    }
    mx = shared[0];
    __syncthreads();
    double sum = 0;
    // f32 math for f32: the consumer GPUs run f64 at a 64th of the f32 rate.
    const T mx_t = static_cast<T>(mx);
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) sum += double(exp(x[j] - mx_t));
    shared[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
      __syncthreads();
    }
    const double lse = mx + log(shared[0]);
    __syncthreads();
    const double wy = weights ? double(weights[y]) : 1.0;
    const double coef = wy / total_weight;
    if (threadIdx.x == 0) block_loss += wy * (lse - double(x[y]));
    __syncthreads();  // x[y] read before any gradient is written (dlogits may be logits)
    const T lse_t = static_cast<T>(lse), coef_t = static_cast<T>(coef);
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
      d[j] = coef_t * (exp(x[j] - lse_t) - (j == y ? T(1) : T(0)));
  }
  block_partial(partials, block_loss);
}

// *out = sums[0] / (sums[1] * per_term), 0 when nothing was counted.
__global__ void mean_kernel(double* out, const double* sums, double per_term) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    *out = sums[1] > 0 ? sums[0] / (sums[1] * per_term) : 0.0;
}

}  // namespace seqforge::cuda
