#pragma once
// Multi-head attention in tiles held in shared memory (kernels/attention/reference.cpp's math),
// products and sums in T (f32 or f64), the (T, T) scores never stored:
//   forward: a block per (pair, tile of R query rows) walks the key tiles its rows may see (tiles
//     above the causal diagonal, before the sliding window and past the row's valid keys are
//     never visited), with an online softmax; it keeps only each row's log-sum-exp.
//   backward: D_i = dO_i . O_i first; then a block per (batch row, key/value head, key tile) sums
//     dK and dV over the group's query heads and the query tiles that see it, and a block per
//     (pair, query tile) sums dQ over its key tiles, both from P recomputed with the saved
//     log-sum-exp: every gradient is one block's, in a fixed order, so a run repeats bit for bit.
// Dropout draws M_ij from kernels/attention/dropout_mask.hpp, as the CPU kernels do.
#include "kernels/attention.hpp"
#include "kernels/attention/dropout_mask.hpp"
#include "kernels/cuda/common.cuh"
#include "seqforge/backend/ops.hpp"

namespace seqforge::cuda {

// Pair p = (batch row, head): where its rows are (k and v: its key/value head's) and which keys
// each query row may see.
struct AttentionPair {
  const AttentionShape& s;
  int64_t T, C, D, ld, b, h, g, keys;
  __device__ AttentionPair(const AttentionShape& shape, const void* lengths, int64_t p)
      : s(shape),
        T(s.seq),
        C(s.heads * s.head_dim),
        D(s.head_dim),
        ld(s.qkv_width()),
        b(p / s.heads),
        h(p % s.heads),
        g(h / s.group()),
        keys(s.seq) {
    if (lengths) {
      const int64_t n = static_cast<const int64_t*>(lengths)[b];
      keys = n < 0 ? 0 : n > T ? T : n;
    }
  }
  // Offsets into (B, T, qkv_width()) of row t's q, k and v; into (B, T, C) of its output; into
  // (B, heads, T) of its log-sum-exp.
  __device__ int64_t q(int64_t t) const { return (b * T + t) * ld + h * D; }
  __device__ int64_t k(int64_t t) const { return (b * T + t) * ld + (s.heads + g) * D; }
  __device__ int64_t v(int64_t t) const { return k(t) + s.kv() * D; }
  __device__ int64_t o(int64_t t) const { return (b * T + t) * C + h * D; }
  __device__ int64_t row(int64_t t) const { return (b * s.heads + h) * T + t; }
  // Keys [first(i), last(i)) are query row i's.
  __device__ int64_t last(int64_t i) const { return s.last_key(i, keys); }
  __device__ int64_t first(int64_t i) const {
    const int64_t f = s.first_key(i), l = last(i);
    return f < l ? f : l;
  }
  __device__ bool sees(int64_t i, int64_t j) const { return j >= s.first_key(i) && j < last(i); }
};

// The dropout factor of P_ij: 1 without dropout, else 0 or 1 / (1 - p).
struct AttentionDropout {
  uint64_t threshold = 0;  // attention_drop_threshold(p); unused when p == 0
  double keep_scale = 1;   // 1 / (1 - p), 0 when there is no dropout
  __device__ uint64_t row_key(const AttentionShape& s, const AttentionPair& pr, int64_t i) const {
    if (!keep_scale) return 0;
    const uint64_t seed = ref::seed_with_base(s.seed_base, s.seed);
    return kernels::attention_row_key(kernels::attention_pair_key(seed, pr.b, pr.h), i);
  }
  template <typename T>
  __device__ T factor(uint64_t row_key, int64_t j) const {
    if (!keep_scale) return T(1);
    return kernels::attention_keep(row_key, j, threshold) ? T(keep_scale) : T(0);
  }
};

// Shared tiles are (R, D) with rows D + 1 apart, and P (R, R) with rows R + 1 apart: threads that
// walk a column of a tile then reach distinct banks.
__host__ __device__ constexpr int64_t tile_ld(int64_t width) { return width + 1; }

// Rows [r0, r0 + n) of a (rows, 3C or C) tensor, one head's D values each, into a tile of R rows;
// rows past n are zeros.
template <typename T>
__device__ inline void load_rows(T* tile, const T* src, int64_t R, int64_t D, int64_t n,
                                 int64_t first, int64_t stride) {
  for (int64_t e = threadIdx.x; e < R * D; e += blockDim.x) {
    const int64_t r = e / D, d = e % D;
    tile[r * tile_ld(D) + d] = r < n ? src[first + r * stride + d] : T(0);
  }
}

template <typename T>
__device__ inline T dot(const T* a, const T* b, int64_t D) {
  T acc = 0;
  for (int64_t d = 0; d < D; ++d) acc += a[d] * b[d];
  return acc;
}

// Shared: Q, K, V, O (R, D), P (R, R), the rows' running max, sum and correction (R).
template <typename T>
__global__ void attention_forward_kernel(AttentionForward a, int64_t R, AttentionDropout drop) {
  SF_DYNAMIC_SHARED(shared_bytes);
  const AttentionShape& s = a.shape;
  const int64_t D = s.head_dim, T_ = s.seq, stride = s.qkv_width();
  T* sQ = reinterpret_cast<T*>(shared_bytes);
  const int64_t L = tile_ld(D), PL = tile_ld(R);
  T *sK = sQ + R * L, *sV = sK + R * L, *sO = sV + R * L, *sP = sO + R * L;
  T *row_max = sP + R * PL, *row_sum = row_max + R, *corr = row_sum + R;
  const T* qkv = static_cast<const T*>(a.qkv);
  const int64_t tiles = (T_ - a.first_row + R - 1) / R;
  for (int64_t t = blockIdx.x; t < s.batch * s.heads * tiles; t += gridDim.x) {
    const AttentionPair pr(s, a.lengths, t / tiles);
    const int64_t i0 = a.first_row + t % tiles * R;
    const int64_t nq = T_ - i0 < R ? T_ - i0 : R;
    load_rows(sQ, qkv, R, D, nq, pr.q(i0), stride);
    for (int64_t e = threadIdx.x; e < R * L; e += blockDim.x) sO[e] = T(0);
    for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
      row_max[r] = -INFINITY;
      row_sum[r] = T(0);
    }
    // From the first row's first key to the last row's last.
    const int64_t key_end = pr.last(i0 + nq - 1);
    for (int64_t k0 = pr.first(i0); k0 < key_end; k0 += R) {
      const int64_t nk = key_end - k0 < R ? key_end - k0 : R;
      __syncthreads();  // the previous tile's readers are done
      load_rows(sK, qkv, R, D, nk, pr.k(k0), stride);
      load_rows(sV, qkv, R, D, nk, pr.v(k0), stride);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < R * R; e += blockDim.x) {
        const int64_t r = e / R, c = e % R;
        const bool on = r < nq && c < nk && pr.sees(i0 + r, k0 + c);
        sP[r * PL + c] =
            on ? kernels::capped_score(T(s.scale) * dot(sQ + r * L, sK + c * L, D), T(s.softcap))
               : T(-INFINITY);
      }
      __syncthreads();
      for (int64_t r = threadIdx.x; r < nq; r += blockDim.x) {
        T mx = row_max[r];
        for (int64_t c = 0; c < nk; ++c) mx = sP[r * PL + c] > mx ? sP[r * PL + c] : mx;
        const T rescale = mx == T(-INFINITY) ? T(1) : exp(row_max[r] - mx);
        const uint64_t key = drop.row_key(s, pr, i0 + r);
        T sum = 0;
        for (int64_t c = 0; c < R; ++c) {
          const T score = sP[r * PL + c];
          const T p = c < nk && score != T(-INFINITY) ? exp(score - mx) : T(0);
          sum += p;
          sP[r * PL + c] = p * drop.factor<T>(key, k0 + c);
        }
        row_sum[r] = row_sum[r] * rescale + sum;
        row_max[r] = mx;
        corr[r] = rescale;
      }
      __syncthreads();
      for (int64_t e = threadIdx.x; e < R * D; e += blockDim.x) {
        const int64_t r = e / D, d = e % D;
        if (r >= nq) continue;
        T acc = 0;
        for (int64_t c = 0; c < nk; ++c) acc += sP[r * PL + c] * sV[c * L + d];
        sO[r * L + d] = sO[r * L + d] * corr[r] + acc;
      }
    }
    __syncthreads();
    T* out = static_cast<T*>(a.out);
    for (int64_t e = threadIdx.x; e < nq * D; e += blockDim.x) {
      const int64_t r = e / D, d = e % D;
      out[pr.o(i0 + r) + d] = row_sum[r] > T(0) ? sO[r * L + d] / row_sum[r] : T(0);
    }
    T* lse = static_cast<T*>(a.lse);
    for (int64_t r = threadIdx.x; r < nq; r += blockDim.x)
      lse[pr.row(i0 + r)] = row_sum[r] > T(0) ? row_max[r] + log(row_sum[r]) : T(-INFINITY);
    __syncthreads();
  }
}

// delta (B, heads, T) = rowsum(dO * O) per head: D_i of the backward.
template <typename T>
__global__ void attention_delta_kernel(T* delta, const T* out, const T* dout, AttentionShape s) {
  const int64_t C = s.heads * s.head_dim;
  SF_GRID_STRIDE(n, s.batch * s.heads * s.seq) {
    const int64_t i = n % s.seq, h = n / s.seq % s.heads, b = n / (s.seq * s.heads);
    const int64_t at = (b * s.seq + i) * C + h * s.head_dim;
    delta[n] = dot(out + at, dout + at, s.head_dim);
  }
}

// Query rows [i0, i0 + nq)'s log-sum-exp and D_i into lse and delta (R); zeros past nq.
template <typename T>
__device__ inline void load_row_terms(T* lse, T* delta, const T* lse_all, const T* delta_all,
                                      const AttentionPair& pr, int64_t R, int64_t i0, int64_t nq) {
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    lse[r] = r < nq ? lse_all[pr.row(i0 + r)] : T(0);
    delta[r] = r < nq ? delta_all[pr.row(i0 + r)] : T(0);
  }
}

// P_ij (with its dropout factor, for dV) and dS_ij = P_ij (c_ij dO_i . v_j - D_i) (times the
// capped score's slope under soft-capping) of query rows [i0, i0 + nq) against keys
// [j0, j0 + nk), into p and ds (R, R); zero where the mask is off.
template <typename T>
__device__ inline void attention_probabilities(T* p, T* ds, const T* sQ, const T* sK, const T* sV,
                                               const T* sdO, const T* lse, const T* delta,
                                               const AttentionShape& s, const AttentionPair& pr,
                                               const AttentionDropout& drop, int64_t R, int64_t i0,
                                               int64_t nq, int64_t j0, int64_t nk) {
  const int64_t D = s.head_dim, L = tile_ld(D), PL = tile_ld(R);
  for (int64_t e = threadIdx.x; e < R * R; e += blockDim.x) {
    const int64_t r = e / R, c = e % R;
    if (r >= nq || c >= nk || !pr.sees(i0 + r, j0 + c)) {
      p[r * PL + c] = ds[r * PL + c] = T(0);
      continue;
    }
    const T x = T(s.scale) * dot(sQ + r * L, sK + c * L, D);
    const T prob = exp(kernels::capped_score(x, T(s.softcap)) - lse[r]);
    const T factor = drop.factor<T>(drop.row_key(s, pr, i0 + r), j0 + c);
    const T dp = factor * dot(sdO + r * L, sV + c * L, D);
    p[r * PL + c] = prob * factor;
    ds[r * PL + c] = prob * (dp - delta[r]) * kernels::capped_score_slope(x, T(s.softcap));
  }
}

// A block per (batch row, key/value head, key tile): dK and dV of its keys, over the group's
// query heads. Shared: K, V, dK, dV, Q, dO (R, D), P, dS (R, R), lse and delta (R).
template <typename T>
__global__ void attention_dkdv_kernel(AttentionBackward a, const T* delta_all, int64_t R,
                                      AttentionDropout drop) {
  SF_DYNAMIC_SHARED(shared_bytes);
  const AttentionShape& s = a.shape;
  const int64_t D = s.head_dim, T_ = s.seq, stride = s.qkv_width(), C = s.heads * D;
  T* sK = reinterpret_cast<T*>(shared_bytes);
  const int64_t L = tile_ld(D), PL = tile_ld(R);
  T *sV = sK + R * L, *dK = sV + R * L, *dV = dK + R * L, *sQ = dV + R * L, *sdO = sQ + R * L;
  T *sP = sdO + R * L, *sdS = sP + R * PL, *lse = sdS + R * PL, *delta = lse + R;
  const T* qkv = static_cast<const T*>(a.qkv);
  const T* dout = static_cast<const T*>(a.dout);
  const T* lse_all = static_cast<const T*>(a.lse);
  const int64_t tiles = (T_ + R - 1) / R, G = s.group();
  for (int64_t t = blockIdx.x; t < s.batch * s.kv() * tiles; t += gridDim.x) {
    const int64_t b = t / tiles / s.kv(), kvh = t / tiles % s.kv();
    const AttentionPair first_pair(s, a.lengths, b * s.heads + kvh * G);
    const int64_t j0 = t % tiles * R, nk = T_ - j0 < R ? T_ - j0 : R;
    load_rows(sK, qkv, R, D, nk, first_pair.k(j0), stride);
    load_rows(sV, qkv, R, D, nk, first_pair.v(j0), stride);
    for (int64_t e = threadIdx.x; e < R * L; e += blockDim.x) dK[e] = dV[e] = T(0);
    // Query rows that may see keys [j0, j0 + nk): from j0 on when causal, up to the last key's
    // window; none past the valid keys.
    const int64_t first = j0 < first_pair.keys ? (s.causal ? j0 : 0) : T_;
    const int64_t end = s.window > 0 && j0 + nk - 1 + s.window < T_ ? j0 + nk - 1 + s.window : T_;
    for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
      const AttentionPair pr(s, a.lengths, b * s.heads + h);
      for (int64_t i0 = first; i0 < end; i0 += R) {
        const int64_t nq = end - i0 < R ? end - i0 : R;
        __syncthreads();
        load_rows(sQ, qkv, R, D, nq, pr.q(i0), stride);
        load_rows(sdO, dout, R, D, nq, pr.o(i0), C);
        load_row_terms(lse, delta, lse_all, delta_all, pr, R, i0, nq);
        __syncthreads();
        attention_probabilities(sP, sdS, sQ, sK, sV, sdO, lse, delta, s, pr, drop, R, i0, nq, j0,
                                nk);
        __syncthreads();
        for (int64_t e = threadIdx.x; e < R * D; e += blockDim.x) {
          const int64_t c = e / D, d = e % D;
          T acc_v = 0, acc_k = 0;
          for (int64_t r = 0; r < nq; ++r) {
            acc_v += sP[r * PL + c] * sdO[r * L + d];
            acc_k += sdS[r * PL + c] * sQ[r * L + d];
          }
          dV[c * L + d] += acc_v;
          dK[c * L + d] += T(s.scale) * acc_k;
        }
      }
    }
    __syncthreads();
    T* dqkv = static_cast<T*>(a.dqkv);
    for (int64_t e = threadIdx.x; e < nk * D; e += blockDim.x) {
      const int64_t c = e / D, d = e % D;
      dqkv[first_pair.k(j0 + c) + d] = dK[c * L + d];
      dqkv[first_pair.v(j0 + c) + d] = dV[c * L + d];
    }
    __syncthreads();
  }
}

// A block per (pair, query tile): dQ of its rows. Shared: Q, dO, dQ, K, V (R, D), P, dS (R, R),
// lse and delta (R).
template <typename T>
__global__ void attention_dq_kernel(AttentionBackward a, const T* delta_all, int64_t R,
                                    AttentionDropout drop) {
  SF_DYNAMIC_SHARED(shared_bytes);
  const AttentionShape& s = a.shape;
  const int64_t D = s.head_dim, T_ = s.seq, stride = s.qkv_width(), C = s.heads * D;
  T* sQ = reinterpret_cast<T*>(shared_bytes);
  const int64_t L = tile_ld(D), PL = tile_ld(R);
  T *sdO = sQ + R * L, *dQ = sdO + R * L, *sK = dQ + R * L, *sV = sK + R * L;
  T *sP = sV + R * L, *sdS = sP + R * PL, *lse = sdS + R * PL, *delta = lse + R;
  const T* qkv = static_cast<const T*>(a.qkv);
  const T* lse_all = static_cast<const T*>(a.lse);
  const int64_t tiles = (T_ + R - 1) / R;
  for (int64_t t = blockIdx.x; t < s.batch * s.heads * tiles; t += gridDim.x) {
    const AttentionPair pr(s, a.lengths, t / tiles);
    const int64_t i0 = t % tiles * R, nq = T_ - i0 < R ? T_ - i0 : R;
    load_rows(sQ, qkv, R, D, nq, pr.q(i0), stride);
    load_rows(sdO, static_cast<const T*>(a.dout), R, D, nq, pr.o(i0), C);
    for (int64_t e = threadIdx.x; e < R * L; e += blockDim.x) dQ[e] = T(0);
    load_row_terms(lse, delta, lse_all, delta_all, pr, R, i0, nq);
    const int64_t key_end = pr.last(i0 + nq - 1);
    for (int64_t j0 = pr.first(i0); j0 < key_end; j0 += R) {
      const int64_t nk = key_end - j0 < R ? key_end - j0 : R;
      __syncthreads();
      load_rows(sK, qkv, R, D, nk, pr.k(j0), stride);
      load_rows(sV, qkv, R, D, nk, pr.v(j0), stride);
      __syncthreads();
      attention_probabilities(sP, sdS, sQ, sK, sV, sdO, lse, delta, s, pr, drop, R, i0, nq, j0, nk);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < R * D; e += blockDim.x) {
        const int64_t r = e / D, d = e % D;
        T acc = 0;
        for (int64_t c = 0; c < nk; ++c) acc += sdS[r * PL + c] * sK[c * L + d];
        dQ[r * L + d] += T(s.scale) * acc;
      }
    }
    __syncthreads();
    T* dqkv = static_cast<T*>(a.dqkv);
    for (int64_t e = threadIdx.x; e < nq * D; e += blockDim.x) {
      const int64_t r = e / D, d = e % D;
      dqkv[pr.q(i0 + r) + d] = dQ[r * L + d];
    }
    __syncthreads();
  }
}

}  // namespace seqforge::cuda
