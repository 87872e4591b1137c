#pragma once
// Embedding lookup and the adapters' column scaling and DoRA norms (kernels/adapter.hpp's math).
#include "kernels/cuda/common.cuh"

namespace seqforge::cuda {

// out(N, E) = table[ids]; an id outside [0, V) sets *bad (UINT64_MAX when none) to its index.
template <typename T, typename I>
__global__ void embedding_forward_kernel(T* out, const T* table, const I* ids, int64_t n, int64_t e,
                                         int64_t vocab, unsigned long long* bad) {
  SF_GRID_STRIDE(idx, n * e) {
    const int64_t i = idx / e, id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= vocab) {
      report_bad(bad, i, id);
      out[idx] = T(0);
      continue;
    }
    out[idx] = table[id * e + idx % e];
  }
}

// dtable(V, E) += dout rows scattered by ids (ids checked by the forward): a thread per element of
// the table, summing its rows in order, so that a run repeats bit for bit.
template <typename T, typename I>
__global__ void embedding_backward_kernel(T* dtable, const T* dout, const I* ids, int64_t n,
                                          int64_t e, int64_t vocab) {
  SF_GRID_STRIDE(idx, vocab * e) {
    const int64_t id = idx / e, j = idx % e;
    double acc = 0;
    bool any = false;
    for (int64_t i = 0; i < n; ++i)
      if (static_cast<int64_t>(ids[i]) == id) {
        acc += double(dout[i * e + j]);
        any = true;
      }
    if (any) dtable[idx] += static_cast<T>(acc);
  }
}

// The same scattered by atomics, for tables too large to walk every row per element (the order of
// a repeated id's sums then varies from run to run).
template <typename T, typename I>
__global__ void embedding_backward_atomic_kernel(T* dtable, const T* dout, const I* ids, int64_t n,
                                                 int64_t e, int64_t vocab) {
  SF_GRID_STRIDE(idx, n * e) {
    const int64_t id = static_cast<int64_t>(ids[idx / e]);
    if (id >= 0 && id < vocab) atomicAdd(dtable + id * e + idx % e, dout[idx]);
  }
}

// y (rows ldy apart) = x * s (+ b) per column (+ addend, rows ldy apart).
template <typename T>
__global__ void scale_columns_kernel(T* y, int64_t ldy, const T* addend, const T* x, const T* s,
                                     const T* b, int64_t rows, int64_t cols) {
  SF_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, j = i % cols;
    const T v = b ? x[i] * s[j] + b[j] : x[i] * s[j];
    y[r * ldy + j] = addend ? addend[r * ldy + j] + v : v;
  }
}

// One thread per row of v (R, C): inv_norm = 1 / ||v_r|| in double, scale = m_r inv_norm.
template <typename T>
__global__ void dora_norm_kernel(T* scale, T* inv_norm, const T* v, const T* m, int64_t rows,
                                 int64_t cols) {
  SF_GRID_STRIDE(r, rows) {
    double sq = 0;
    for (int64_t j = 0; j < cols; ++j) sq += double(v[r * cols + j]) * double(v[r * cols + j]);
    const double inv = 1.0 / sqrt(sq);
    inv_norm[r] = static_cast<T>(inv);
    scale[r] = static_cast<T>(double(m[r]) * inv);
  }
}

// DoRA's backward in two deterministic passes, as layer norm's parameters: blocks stride over
// (band of rows, column tile) pairs, a thread per column writing dpre = dy * scale over its band
// and the band's sum of dy * pre into partial (chunks, cols); then dm += inv_norm * the bands'
// sums in band order. dy's rows are ldy apart.
template <typename T>
__global__ void dora_backward_partial_kernel(double* partial, T* dpre, const T* dy, int64_t ldy,
                                             const T* pre, const T* scale, int64_t rows,
                                             int64_t cols, int64_t chunks) {
  for_band_columns(rows, cols, chunks, [&](int64_t chunk, int64_t j, int64_t r0, int64_t r1) {
    double sum = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r * cols + j;
      const T g = dy[r * ldy + j];
      sum += double(g) * double(pre[i]);
      dpre[i] = g * scale[j];
    }
    partial[chunk * cols + j] = sum;
  });
}

template <typename T>
__global__ void dora_backward_final_kernel(T* dm, const double* partial, const T* inv_norm,
                                           int64_t cols, int64_t chunks) {
  SF_GRID_STRIDE(j, cols) {
    double sum = 0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * cols + j];
    dm[j] += static_cast<T>(sum * double(inv_norm[j]));
  }
}

}  // namespace seqforge::cuda
