#pragma once
// Attention on tensor cores, for bf16 or fp16 products (AttentionShape::bf16_products,
// fp16_products) of f32 tensors: attention.cuh's tiles, masks, dropout and online softmax, with its
// five products as warp matrix operations on 16-bit operands (H: __nv_bfloat16 or __half) summing
// in f32:
//   forward:  S = Q K^T, O = O * correction + P V;
//   backward: (per key tile) S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q;
//             (per query tile) S = Q K^T, dP = dO V^T, dQ += dS K.
// q, k, v and dO are rounded to H as they are staged in shared memory, P and dS after the f32
// softmax; row statistics, accumulators (in shared memory, f32) and outputs stay f32, as the CPU's
// bf16-products kernel. A block owns `rows` rows (query rows forward and for dQ, keys for
// dK/dV); the other side comes in tiles of `other` rows (each 64, 32 or 16: the largest tiles the
// GPU's shared memory holds for the head size, TcTile). The warps share a product's 16 x 16
// output tiles. Head sizes are padded to a multiple of 16 with zeros.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "kernels/cuda/attention.cuh"

namespace seqforge::cuda {

namespace wmma = nvcuda::wmma;

constexpr int64_t kTcSlice = 16;
constexpr int kTcThreads = 128;

// A kernel's tiles: its block's rows and the other side's rows per step.
struct TcTile {
  int64_t rows = 0, other = 0;
  explicit operator bool() const { return rows > 0 && other > 0; }
};

template <typename H>
using TcA = wmma::fragment<wmma::matrix_a, 16, 16, 16, H, wmma::row_major>;
template <typename H>
using TcBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::col_major>;
template <typename H>
using TcBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::row_major>;
using TcAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// An f32 rounded to the operands' type, and back.
template <typename H>
__device__ inline H tc_round(float x);
template <>
__device__ inline __nv_bfloat16 tc_round<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ inline __half tc_round<__half>(float x) {
  return __float2half_rn(x);
}
__device__ inline float tc_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float tc_float(__half x) { return __half2float(x); }

// Widths: the head padded to 16; leading dimensions padded by 8 16-bit or 4 f32 elements (the warp
// matrix functions' multiples), so that consecutive rows start in different banks.
__host__ __device__ inline int64_t tc_head(int64_t D) { return (D + 15) / 16 * 16; }
__host__ __device__ inline int64_t tc_ld16(int64_t width) { return width + 8; }
__host__ __device__ inline int64_t tc_ld32(int64_t width) { return width + 4; }

// A kernel's shared memory, each region 128-byte aligned: `own` tiles of its block's rows of the
// head (H), `others` tiles of the other side's rows, `scores` (f32) and `probs` (H) tiles of
// rows x other, `accs` (f32) tiles of the block's rows of the head, and `values` f32s.
// With a null base only `bytes` is meaningful: the launcher sizes what the kernel carves.
struct TcTiles {
  void *own, *other;  // of H
  float* scores;
  void* probs;  // of H
  float *acc, *values;
  size_t bytes = 0;
};
__host__ __device__ inline TcTiles tc_tiles(unsigned char* base, int64_t D, TcTile tile, int own,
                                            int others, int scores, int probs, int accs,
                                            int64_t values) {
  const int64_t Dp = tc_head(D), R = tile.rows, other = tile.other;
  TcTiles t{};
  auto take = [&](int64_t elements, size_t element) {
    unsigned char* p = base ? base + t.bytes : nullptr;
    t.bytes += (static_cast<size_t>(elements) * element + 127) / 128 * 128;
    return p;
  };
  t.own = take(own * R * tc_ld16(Dp), 2);
  t.other = take(others * other * tc_ld16(Dp), 2);
  t.scores = reinterpret_cast<float*>(take(scores * R * tc_ld32(other), 4));
  t.probs = take(probs * R * tc_ld16(other), 2);
  t.acc = reinterpret_cast<float*>(take(accs * R * tc_ld32(Dp), 4));
  t.values = reinterpret_cast<float*>(take(values, 4));
  return t;
}
// Each kernel's: forward Q | K, V | S | P | O | max, sum, correction; dK/dV K, V | Q, dO |
// S^T, dP^T | P^T, dS^T | dK, dV | lse, delta; dQ Q, dO | K, V | S, dP | dS | dQ | lse, delta.
__host__ __device__ inline TcTiles tc_forward_tiles(unsigned char* base, int64_t D, TcTile t) {
  return tc_tiles(base, D, t, 1, 2, 1, 1, 1, 3 * t.rows);
}
__host__ __device__ inline TcTiles tc_dkdv_tiles(unsigned char* base, int64_t D, TcTile t) {
  return tc_tiles(base, D, t, 2, 2, 2, 2, 2, 2 * t.other);
}
__host__ __device__ inline TcTiles tc_dq_tiles(unsigned char* base, int64_t D, TcTile t) {
  return tc_tiles(base, D, t, 2, 2, 2, 1, 1, 2 * t.rows);
}
inline size_t tc_forward_shared(int64_t D, TcTile t) {
  return tc_forward_tiles(nullptr, D, t).bytes;
}
inline size_t tc_dkdv_shared(int64_t D, TcTile t) { return tc_dkdv_tiles(nullptr, D, t).bytes; }
inline size_t tc_dq_shared(int64_t D, TcTile t) { return tc_dq_tiles(nullptr, D, t).bytes; }

// The block's warps and this thread's: an emulated block of fewer than 32 threads is one warp.
__device__ inline int tc_warps() {
  return blockDim.x >= 32 ? static_cast<int>(blockDim.x / 32) : 1;
}
__device__ inline int tc_warp() {
  return blockDim.x >= 32 ? static_cast<int>(threadIdx.x / 32) : 0;
}

// Rows [first, first + n) of a tensor whose rows are `stride` apart, D values each, rounded to
// H into a (R, tc_head(D)) tile; rows past n and columns past D are zeros.
template <typename H>
__device__ inline void tc_load_rows(H* tile, const float* src, int64_t R, int64_t D, int64_t n,
                                    int64_t first, int64_t stride) {
  const int64_t Dp = tc_head(D), ld = tc_ld16(Dp);
  for (int64_t e = threadIdx.x; e < R * Dp; e += blockDim.x) {
    const int64_t r = e / Dp, d = e % Dp;
    tile[r * ld + d] = tc_round<H>(r < n && d < D ? src[first + r * stride + d] : 0.0f);
  }
}

// out (R, cols) f32 = a (R, depth) b^T: a's rows and b's rows (cols of them) both `depth` long,
// H with leading dimensions lda and ldb; the warps take its 16 x 16 tiles in turn.
template <typename H>
__device__ inline void tc_abt(float* out, int64_t ldo, const H* a, int64_t lda, const H* b,
                              int64_t ldb, int64_t R, int64_t cols, int64_t depth) {
  const int64_t col_tiles = cols / 16;
  for (int64_t tile = tc_warp(); tile < R / kTcSlice * col_tiles; tile += tc_warps()) {
    const int64_t slice = tile / col_tiles, c = tile % col_tiles * 16;
    TcAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int64_t k = 0; k < depth; k += 16) {
      TcA<H> fa;
      TcBCol<H> fb;
      wmma::load_matrix_sync(fa, a + slice * kTcSlice * lda + k, lda);
      wmma::load_matrix_sync(fb, b + c * ldb + k, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + slice * kTcSlice * ldo + c, acc, ldo, wmma::mem_row_major);
  }
}

// acc (R, width) f32 += a (R, depth) b: b's rows `depth` of them, `width` long; the warps take
// its 16 x 16 tiles in turn.
template <typename H>
__device__ inline void tc_acc_ab(float* acc, int64_t ldacc, const H* a, int64_t lda, const H* b,
                                 int64_t ldb, int64_t R, int64_t width, int64_t depth) {
  const int64_t col_tiles = width / 16;
  for (int64_t tile = tc_warp(); tile < R / kTcSlice * col_tiles; tile += tc_warps()) {
    const int64_t slice = tile / col_tiles, c = tile % col_tiles * 16;
    TcAcc f;
    float* at = acc + slice * kTcSlice * ldacc + c;
    wmma::load_matrix_sync(f, at, ldacc, wmma::mem_row_major);
    for (int64_t k = 0; k < depth; k += 16) {
      TcA<H> fa;
      TcBRow<H> fb;
      wmma::load_matrix_sync(fa, a + slice * kTcSlice * lda + k, lda);
      wmma::load_matrix_sync(fb, b + k * ldb + c, ldb);
      wmma::mma_sync(f, fa, fb, f);
    }
    wmma::store_matrix_sync(at, f, ldacc, wmma::mem_row_major);
  }
}

// A block per (pair, tile of tile.rows query rows), key tiles of tile.other.
template <typename H>
__global__ void attention_forward_tc_kernel(AttentionForward a, TcTile tile,
                                            AttentionDropout drop) {
  SF_DYNAMIC_SHARED(shared_bytes);
  const AttentionShape& s = a.shape;
  const float cap = static_cast<float>(s.softcap);
  const int64_t D = s.head_dim, Dp = tc_head(D), T_ = s.seq, stride = s.qkv_width();
  const int64_t R = tile.rows, other = tile.other, LB = tc_ld16(Dp), LS = tc_ld32(other),
                LP = tc_ld16(other), LO = tc_ld32(Dp);
  const TcTiles tiles_at = tc_forward_tiles(shared_bytes, D, tile);
  H *sQ = static_cast<H*>(tiles_at.own), *sK = static_cast<H*>(tiles_at.other),
    *sV = sK + other * LB, *sP = static_cast<H*>(tiles_at.probs);
  float *sS = tiles_at.scores, *sO = tiles_at.acc;
  float *row_max = tiles_at.values, *row_sum = row_max + R, *corr = row_sum + R;
  const float* qkv = static_cast<const float*>(a.qkv);
  const int64_t tiles = (T_ - a.first_row + R - 1) / R;
  for (int64_t t = blockIdx.x; t < s.batch * s.heads * tiles; t += gridDim.x) {
    const AttentionPair pr(s, a.lengths, t / tiles);
    const int64_t i0 = a.first_row + t % tiles * R;
    const int64_t nq = T_ - i0 < R ? T_ - i0 : R;
    tc_load_rows(sQ, qkv, R, D, nq, pr.q(i0), stride);
    for (int64_t e = threadIdx.x; e < R * LO; e += blockDim.x) sO[e] = 0.0f;
    for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
    }
    const int64_t key_end = pr.last(i0 + nq - 1);
    for (int64_t k0 = pr.first(i0); k0 < key_end; k0 += other) {
      const int64_t nk = key_end - k0 < other ? key_end - k0 : other;
      __syncthreads();  // the previous tile's readers are done
      tc_load_rows(sK, qkv, other, D, nk, pr.k(k0), stride);
      tc_load_rows(sV, qkv, other, D, nk, pr.v(k0), stride);
      __syncthreads();
      tc_abt(sS, LS, sQ, LB, sK, LB, R, other, Dp);
      __syncthreads();
      for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
        float* row = sS + r * LS;
        float mx = row_max[r];
        for (int64_t c = 0; c < other; ++c) {
          const bool on = r < nq && c < nk && pr.sees(i0 + r, k0 + c);
          row[c] =
              on ? kernels::capped_score(static_cast<float>(s.scale) * row[c], cap) : -INFINITY;
          mx = row[c] > mx ? row[c] : mx;
        }
        const float rescale = mx == -INFINITY ? 1.0f : expf(row_max[r] - mx);
        const uint64_t key = r < nq ? drop.row_key(s, pr, i0 + r) : 0;
        float sum = 0.0f;
        for (int64_t c = 0; c < other; ++c) {
          const float p = row[c] != -INFINITY ? expf(row[c] - mx) : 0.0f;
          sum += p;
          sP[r * LP + c] = tc_round<H>(p * drop.factor<float>(key, k0 + c));
        }
        row_sum[r] = row_sum[r] * rescale + sum;
        row_max[r] = mx;
        corr[r] = rescale;
      }
      __syncthreads();
      for (int64_t e = threadIdx.x; e < R * Dp; e += blockDim.x) {
        const int64_t r = e / Dp, d = e % Dp;
        sO[r * LO + d] *= corr[r];
      }
      __syncthreads();
      tc_acc_ab(sO, LO, sP, LP, sV, LB, R, Dp, other);
    }
    __syncthreads();
    float* out = static_cast<float*>(a.out);
    for (int64_t e = threadIdx.x; e < nq * D; e += blockDim.x) {
      const int64_t r = e / D, d = e % D;
      out[pr.o(i0 + r) + d] = row_sum[r] > 0.0f ? sO[r * LO + d] / row_sum[r] : 0.0f;
    }
    float* lse = static_cast<float*>(a.lse);
    for (int64_t r = threadIdx.x; r < nq; r += blockDim.x)
      lse[pr.row(i0 + r)] = row_sum[r] > 0.0f ? row_max[r] + logf(row_sum[r]) : -INFINITY;
    __syncthreads();
  }
}

// delta (B, heads, T) = rowsum(H(dO) * O): D_i from the dO the products see, so that a row
// whose P is one-hot gets dP - D_i within the products' own rounding of 0 (the tensor cores sum
// dP in their own order, so not exactly 0), not within dO's rounding to H.
template <typename H>
__global__ void attention_delta_tc_kernel(float* delta, const float* out, const float* dout,
                                          AttentionShape s) {
  const int64_t C = s.heads * s.head_dim;
  SF_GRID_STRIDE(n, s.batch * s.heads * s.seq) {
    const int64_t i = n % s.seq, h = n / s.seq % s.heads, b = n / (s.seq * s.heads);
    const int64_t at = (b * s.seq + i) * C + h * s.head_dim;
    float acc = 0.0f;
    for (int64_t d = 0; d < s.head_dim; ++d)
      acc += tc_float(tc_round<H>(dout[at + d])) * out[at + d];
    delta[n] = acc;
  }
}

// A block per (batch row, key/value head, tile of tile.rows keys): dK and dV of its keys over the
// group's query heads, query tiles of tile.other.
template <typename H>
__global__ void attention_dkdv_tc_kernel(AttentionBackward a, const float* delta_all, TcTile tile,
                                         AttentionDropout drop) {
  SF_DYNAMIC_SHARED(shared_bytes);
  const AttentionShape& s = a.shape;
  const float cap = static_cast<float>(s.softcap);
  const int64_t D = s.head_dim, Dp = tc_head(D), T_ = s.seq, stride = s.qkv_width(),
                C = s.heads * D;
  const int64_t R = tile.rows, other = tile.other, LB = tc_ld16(Dp), LS = tc_ld32(other),
                LP = tc_ld16(other), LO = tc_ld32(Dp);
  const TcTiles tiles_at = tc_dkdv_tiles(shared_bytes, D, tile);
  H *sK = static_cast<H*>(tiles_at.own), *sV = sK + R * LB, *sQ = static_cast<H*>(tiles_at.other),
    *sdO = sQ + other * LB;
  H *sPT = static_cast<H*>(tiles_at.probs), *sdST = sPT + R * LP;
  float *sST = tiles_at.scores, *sdPT = sST + R * LS, *dK = tiles_at.acc, *dV = dK + R * LO;
  float *lse = tiles_at.values, *delta = lse + other;
  const float* qkv = static_cast<const float*>(a.qkv);
  const float* dout = static_cast<const float*>(a.dout);
  const float* lse_all = static_cast<const float*>(a.lse);
  const int64_t tiles = (T_ + R - 1) / R, G = s.group();
  for (int64_t t = blockIdx.x; t < s.batch * s.kv() * tiles; t += gridDim.x) {
    const int64_t b = t / tiles / s.kv(), kvh = t / tiles % s.kv();
    const AttentionPair first_pair(s, a.lengths, b * s.heads + kvh * G);
    const int64_t j0 = t % tiles * R, nk = T_ - j0 < R ? T_ - j0 : R;
    tc_load_rows(sK, qkv, R, D, nk, first_pair.k(j0), stride);
    tc_load_rows(sV, qkv, R, D, nk, first_pair.v(j0), stride);
    for (int64_t e = threadIdx.x; e < 2 * R * LO; e += blockDim.x) dK[e] = 0.0f;
    // Query rows that may see keys [j0, j0 + nk), as attention_dkdv_kernel's.
    const int64_t first = j0 < first_pair.keys ? (s.causal ? j0 : 0) : T_;
    const int64_t end = s.window > 0 && j0 + nk - 1 + s.window < T_ ? j0 + nk - 1 + s.window : T_;
    for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
      const AttentionPair pr(s, a.lengths, b * s.heads + h);
      for (int64_t i0 = first; i0 < end; i0 += other) {
        const int64_t nq = end - i0 < other ? end - i0 : other;
        __syncthreads();
        tc_load_rows(sQ, qkv, other, D, nq, pr.q(i0), stride);
        tc_load_rows(sdO, dout, other, D, nq, pr.o(i0), C);
        for (int64_t c = threadIdx.x; c < other; c += blockDim.x) {
          lse[c] = c < nq ? lse_all[pr.row(i0 + c)] : 0.0f;
          delta[c] = c < nq ? delta_all[pr.row(i0 + c)] : 0.0f;
        }
        __syncthreads();
        tc_abt(sST, LS, sK, LB, sQ, LB, R, other, Dp);
        tc_abt(sdPT, LS, sV, LB, sdO, LB, R, other, Dp);
        __syncthreads();
        for (int64_t e = threadIdx.x; e < R * other; e += blockDim.x) {
          const int64_t r = e / other, c = e % other;  // key j0 + r, query row i0 + c
          float p = 0.0f, ds = 0.0f;
          if (r < nk && c < nq && pr.sees(i0 + c, j0 + r)) {
            const float x = static_cast<float>(s.scale) * sST[r * LS + c];
            const float prob = expf(kernels::capped_score(x, cap) - lse[c]);
            const float factor = drop.factor<float>(drop.row_key(s, pr, i0 + c), j0 + r);
            p = prob * factor;
            ds =
                prob * (factor * sdPT[r * LS + c] - delta[c]) * kernels::capped_score_slope(x, cap);
          }
          sPT[r * LP + c] = tc_round<H>(p);
          sdST[r * LP + c] = tc_round<H>(ds);
        }
        __syncthreads();
        tc_acc_ab(dV, LO, sPT, LP, sdO, LB, R, Dp, other);
        tc_acc_ab(dK, LO, sdST, LP, sQ, LB, R, Dp, other);
      }
    }
    __syncthreads();
    float* dqkv = static_cast<float*>(a.dqkv);
    for (int64_t e = threadIdx.x; e < nk * D; e += blockDim.x) {
      const int64_t c = e / D, d = e % D;
      dqkv[first_pair.k(j0 + c) + d] = static_cast<float>(s.scale) * dK[c * LO + d];
      dqkv[first_pair.v(j0 + c) + d] = dV[c * LO + d];
    }
    __syncthreads();
  }
}

// A block per (pair, tile of tile.rows query rows): dQ of its rows, key tiles of tile.other.
template <typename H>
__global__ void attention_dq_tc_kernel(AttentionBackward a, const float* delta_all, TcTile tile,
                                       AttentionDropout drop) {
  SF_DYNAMIC_SHARED(shared_bytes);
  const AttentionShape& s = a.shape;
  const float cap = static_cast<float>(s.softcap);
  const int64_t D = s.head_dim, Dp = tc_head(D), T_ = s.seq, stride = s.qkv_width(),
                C = s.heads * D;
  const int64_t R = tile.rows, other = tile.other, LB = tc_ld16(Dp), LS = tc_ld32(other),
                LP = tc_ld16(other), LO = tc_ld32(Dp);
  const TcTiles tiles_at = tc_dq_tiles(shared_bytes, D, tile);
  H *sQ = static_cast<H*>(tiles_at.own), *sdO = sQ + R * LB, *sK = static_cast<H*>(tiles_at.other),
    *sV = sK + other * LB;
  H* sdS = static_cast<H*>(tiles_at.probs);
  float *sS = tiles_at.scores, *sdP = sS + R * LS, *dQ = tiles_at.acc;
  float *lse = tiles_at.values, *delta = lse + R;
  const float* qkv = static_cast<const float*>(a.qkv);
  const float* lse_all = static_cast<const float*>(a.lse);
  const int64_t tiles = (T_ + R - 1) / R;
  for (int64_t t = blockIdx.x; t < s.batch * s.heads * tiles; t += gridDim.x) {
    const AttentionPair pr(s, a.lengths, t / tiles);
    const int64_t i0 = t % tiles * R, nq = T_ - i0 < R ? T_ - i0 : R;
    tc_load_rows(sQ, qkv, R, D, nq, pr.q(i0), stride);
    tc_load_rows(sdO, static_cast<const float*>(a.dout), R, D, nq, pr.o(i0), C);
    for (int64_t e = threadIdx.x; e < R * LO; e += blockDim.x) dQ[e] = 0.0f;
    for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
      lse[r] = r < nq ? lse_all[pr.row(i0 + r)] : 0.0f;
      delta[r] = r < nq ? delta_all[pr.row(i0 + r)] : 0.0f;
    }
    const int64_t key_end = pr.last(i0 + nq - 1);
    for (int64_t j0 = pr.first(i0); j0 < key_end; j0 += other) {
      const int64_t nk = key_end - j0 < other ? key_end - j0 : other;
      __syncthreads();
      tc_load_rows(sK, qkv, other, D, nk, pr.k(j0), stride);
      tc_load_rows(sV, qkv, other, D, nk, pr.v(j0), stride);
      __syncthreads();
      tc_abt(sS, LS, sQ, LB, sK, LB, R, other, Dp);
      tc_abt(sdP, LS, sdO, LB, sV, LB, R, other, Dp);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < R * other; e += blockDim.x) {
        const int64_t r = e / other, c = e % other;
        float ds = 0.0f;
        if (r < nq && c < nk && pr.sees(i0 + r, j0 + c)) {
          const float x = static_cast<float>(s.scale) * sS[r * LS + c];
          const float prob = expf(kernels::capped_score(x, cap) - lse[r]);
          const float factor = drop.factor<float>(drop.row_key(s, pr, i0 + r), j0 + c);
          ds = prob * (factor * sdP[r * LS + c] - delta[r]) * kernels::capped_score_slope(x, cap);
        }
        sdS[r * LP + c] = tc_round<H>(ds);
      }
      __syncthreads();
      tc_acc_ab(dQ, LO, sdS, LP, sK, LB, R, Dp, other);
    }
    __syncthreads();
    float* dqkv = static_cast<float*>(a.dqkv);
    for (int64_t e = threadIdx.x; e < nq * D; e += blockDim.x) {
      const int64_t r = e / D, d = e % D;
      dqkv[pr.q(i0 + r) + d] = static_cast<float>(s.scale) * dQ[r * LO + d];
    }
    __syncthreads();
  }
}

}  // namespace seqforge::cuda
