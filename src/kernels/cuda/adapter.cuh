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
      report_bad(bad, i);
      out[idx] = T(0);
      continue;
    }
    out[idx] = table[id * e + idx % e];
  }
}

// The embedding's backward groups equal ids by sorting keys (id << 32 | position), which are
// unique, so that any sort gives the same order: each id's rows are then summed in position order
// and a run repeats bit for bit, with work in proportion to the ids rather than to the table.
// keys[i] for i < n2 (n rounded up to a power of two): an id in [0, V) and its position, else
// all ones (the padding and an id the forward reported: sorted last, never summed).
template <typename I>
__global__ void embedding_keys_kernel(unsigned long long* keys, const I* ids, int64_t n, int64_t n2,
                                      int64_t vocab) {
  SF_GRID_STRIDE(i, n2) {
    const int64_t id = i < n ? static_cast<int64_t>(ids[i]) : -1;
    keys[i] =
        id >= 0 && id < vocab ? static_cast<unsigned long long>(id) << 32 | uint64_t(i) : ~0ull;
  }
}

// Bitonic sort of n2 keys (a power of two), ascending. Stage (k, j) compares each key i whose bit
// j is clear with key i + j, in the order bit k of i asks for.
__device__ inline void bitonic_exchange(unsigned long long* keys, int64_t i, int64_t k, int64_t j) {
  const unsigned long long a = keys[i], b = keys[i + j];
  if ((a > b) == ((i & k) == 0)) keys[i] = b, keys[i + j] = a;
}
__global__ void bitonic_stage_kernel(unsigned long long* keys, int64_t n2, int64_t k, int64_t j) {
  SF_GRID_STRIDE(t, n2 / 2) bitonic_exchange(keys, t / j * 2 * j + t % j, k, j);
}
// Every stage with j < kSortChunk of the merges k_first .. k_last (powers of two), a block per
// chunk of kSortChunk keys held in shared memory (stages with smaller j stay inside a chunk).
constexpr int64_t kSortChunk = 2048;
__global__ void bitonic_chunk_kernel(unsigned long long* keys, int64_t n2, int64_t k_first,
                                     int64_t k_last) {
  __shared__ unsigned long long chunk[kSortChunk];
  const int64_t len = n2 < kSortChunk ? n2 : kSortChunk;
  for (int64_t c0 = int64_t(blockIdx.x) * len; c0 < n2; c0 += int64_t(gridDim.x) * len) {
    __syncthreads();  // the previous chunk's stores are done
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) chunk[i] = keys[c0 + i];
    for (int64_t k = k_first; k <= k_last; k *= 2)
      for (int64_t j = (k < len ? k : len) / 2; j > 0; j /= 2) {
        __syncthreads();
        for (int64_t t = threadIdx.x; t < len / 2; t += blockDim.x) {
          const int64_t i = t / j * 2 * j + t % j;
          const unsigned long long a = chunk[i], b = chunk[i + j];
          if ((a > b) == (((c0 + i) & k) == 0)) chunk[i] = b, chunk[i + j] = a;
        }
      }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) keys[c0 + i] = chunk[i];
  }
}

// dtable(V, E) += the rows of dout with each id, summed in position order (in double): a thread
// per (sorted key that starts a run of one id, column). A frequent id's run is long (a space in a
// character model's batch), so the thread loads kBatch keys and then their rows at once, rather
// than waiting for each key before its row.
template <typename T>
__global__ void embedding_backward_kernel(T* dtable, const T* dout, const unsigned long long* keys,
                                          int64_t n, int64_t e) {
  constexpr int kBatch = 8;
  SF_GRID_STRIDE(idx, n * e) {
    const int64_t k = idx / e, j = idx % e;
    const unsigned long long key = keys[k], id = key >> 32;
    if (key == ~0ull || (k > 0 && keys[k - 1] >> 32 == id)) continue;
    double acc = 0;
    for (int64_t m = k;; m += kBatch) {
      unsigned long long batch[kBatch];
      T row[kBatch];
      for (int u = 0; u < kBatch; ++u) batch[u] = m + u < n ? keys[m + u] : ~0ull;
      for (int u = 0; u < kBatch; ++u)
        row[u] = batch[u] >> 32 == id ? dout[int64_t(batch[u] & 0xffffffffu) * e + j] : T(0);
      for (int u = 0; u < kBatch; ++u)  // the run's keys come first: sorted
        if (batch[u] >> 32 == id) acc += double(row[u]);
      if (batch[kBatch - 1] >> 32 != id) break;
    }
    dtable[int64_t(id) * e + j] += static_cast<T>(acc);
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
