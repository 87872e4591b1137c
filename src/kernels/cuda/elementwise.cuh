#pragma once
// Memory, elementwise, layout and dropout kernels: grid-stride loops, one element per thread.
#include "kernels/counter_hash.hpp"
#include "kernels/cuda/common.cuh"

namespace seqforge::cuda {

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, T value) {
  SF_GRID_STRIDE(i, n) p[i] = value;
}

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  SF_GRID_STRIDE(i, n) Element<D>::store(dst + i, Element<S>::load(src + i));
}

// f32 -> bf16 directly (not through double): the hot conversion of mixed precision.
__global__ void f32_to_bf16_kernel(bf16* dst, const float* src, int64_t n) {
  SF_GRID_STRIDE(i, n) dst[i].bits = bf16_bits(src[i]);
}

template <typename T>
__global__ void add_kernel(T* y, const T* x, int64_t n) {
  SF_GRID_STRIDE(i, n) y[i] += x[i];
}

template <typename T>
__global__ void mul_kernel(T* y, const T* a, const T* b, int64_t n) {
  SF_GRID_STRIDE(i, n) y[i] = a[i] * b[i];
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, T alpha) {
  SF_GRID_STRIDE(i, n) x[i] *= alpha;
}

// Column sums of dy(rows, cols) over bands of rows into partial (chunks, cols), a thread per
// column of a band, in double; with `low`, each value is also written there in low_type (the
// half GEMMs' copy of dy, from the same read, rounded as convert rounds).
template <typename T>
__global__ void sum_rows_partial_kernel(double* partial, const T* dy, void* low, DType low_type,
                                        int64_t rows, int64_t cols, int64_t chunks) {
  for_band_columns(rows, cols, chunks, [&](int64_t chunk, int64_t j, int64_t r0, int64_t r1) {
    double sum = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const T v = dy[r * cols + j];
      sum += double(v);
      if (low) store_low(low, low_type, r * cols + j, static_cast<float>(v));
    }
    partial[chunk * cols + j] = sum;
  });
}

// One thread per column, summing down the rows in double as the reference does (for few rows:
// a recurrent layer's batch).
template <typename T>
__global__ void sum_rows_acc_kernel(T* db, const T* dy, int64_t rows, int64_t cols) {
  SF_GRID_STRIDE(j, cols) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += dy[r * cols + j];
    db[j] += static_cast<T>(acc);
  }
}

template <typename T>
__global__ void add_bias_rows_kernel(T* c, int64_t ldc, const T* bias, int64_t rows, int64_t cols) {
  SF_GRID_STRIDE(i, rows * cols) c[(i / cols) * ldc + i % cols] += bias[i % cols];
}

// A GEMM with k = 0: C = beta C (+ bias per column), rows ldc apart; beta 0 overwrites.
template <typename T>
__global__ void gemm_without_k_kernel(T* c, int64_t ldc, int64_t rows, int64_t cols, T beta,
                                      const T* bias) {
  SF_GRID_STRIDE(i, rows * cols) {
    T& x = c[(i / cols) * ldc + i % cols];
    x = (beta == T(0) ? T(0) : beta * x) + (bias ? bias[i % cols] : T(0));
  }
}

// The GEMM of GemmShape (row-major: C = alpha op(A) op(B) + beta C, + bias per column) for a call
// cuBLASLt offers no algorithm for: a thread per element of C summing its products in order, in
// Acc (f32, or f64 for f64 operands); operands f32, f64, or bf16 / f16 read as f32.
template <typename Acc>
__device__ inline Acc gemm_operand(const void* p, DType dtype, int64_t i) {
  if (dtype == DType::bf16 || dtype == DType::f16) return Acc(load_low(p, dtype, i));
  if (dtype == DType::f64) return Acc(static_cast<const double*>(p)[i]);
  return Acc(static_cast<const float*>(p)[i]);
}
template <typename Acc>
__global__ void gemm_fallback_kernel(Acc* c, const void* a, const void* b, DType dtype, GemmShape s,
                                     const Acc* bias) {
  SF_GRID_STRIDE(i, s.m * s.n) {
    const int64_t r = i / s.n, col = i % s.n;
    Acc acc = 0;
    for (int64_t p = 0; p < s.k; ++p)
      acc += gemm_operand<Acc>(a, dtype, s.trans_a ? p * s.lda + r : r * s.lda + p) *
             gemm_operand<Acc>(b, dtype, s.trans_b ? col * s.ldb + p : p * s.ldb + col);
    Acc& out = c[r * s.ldc + col];
    out = Acc(s.alpha) * acc + (s.beta == 0 ? Acc(0) : Acc(s.beta) * out) +
          (bias ? bias[col] : Acc(0));
  }
}

// Per block a partial sum in double (block_partial).
template <typename T>
__global__ void sum_squares_kernel(double* partials, const T* x, int64_t n) {
  double acc = 0;
  SF_GRID_STRIDE(i, n) acc += double(x[i]) * double(x[i]);
  block_partial(partials, acc);
}

template <typename E>
__global__ void transpose01_kernel(E* dst, const E* src, int64_t d0, int64_t d1, int64_t f) {
  SF_GRID_STRIDE(i, d0 * d1 * f) {  // i indexes src (d0, d1, f)
    const int64_t k = i % f, j = (i / f) % d1, r = i / (f * d1);
    dst[(j * d0 + r) * f + k] = src[i];
  }
}

template <typename E>
__global__ void copy_transposed_kernel(E* dst, int64_t ld_dst, const E* src, int64_t ld_src,
                                       int64_t rows, int64_t cols) {
  SF_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    dst[c * ld_dst + r] = src[r * ld_src + c];
  }
}

template <typename T>
__global__ void dropout_mask_kernel(T* mask, int64_t n, uint64_t below, T keep, uint64_t given,
                                    const uint64_t* base) {
  const uint64_t seed = ref::seed_with_base(base, given);
  SF_GRID_STRIDE(i, n) {
    mask[i] = (ref::counter_hash(seed, static_cast<uint64_t>(i)) >> 11) < below ? T(0) : keep;
  }
}

}  // namespace seqforge::cuda
