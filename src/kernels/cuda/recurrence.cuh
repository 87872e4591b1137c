#pragma once
// A chain's whole recurrence (ops.hpp's RecurrenceForward and RecurrenceBackward) in one
// cooperative launch, instead of a GEMM and a cell kernel per step from the host: the blocks
// split each step into tiles of batch rows x hidden units (a tile's units with all their gates),
// compute the tile's part of the recurrent product from operands staged in shared memory, run
// cells.cuh's unit steps on it, and wait for each other (a grid sync) before the next step, which
// reads every tile's output. Each block keeps the same tiles at every step, so a unit's carried
// state (c, dc, dh) is only ever touched by one block.
#include <cooperative_groups.h>

#include "kernels/cuda/cells.cuh"

namespace seqforge::cuda {

constexpr int kTileRows = 32, kTileUnits = 8, kTileChunk = 32;  // the product's K, staged
constexpr int kRecurrenceThreads = 256;

__host__ __device__ inline int64_t tile_groups(int64_t n, int64_t per) {
  return (n + per - 1) / per;
}

// Element i of a product operand, T's own or a half-precision copy's (`dtype` bf16 or f16).
template <typename T>
__device__ inline T operand(const void* p, DType dtype, int64_t i) {
  if (dtype == DType::bf16 || dtype == DType::f16) return T(load_low(p, dtype, i));
  return static_cast<const T*>(p)[i];
}

// p moved by `elements` of `size` bytes (null stays null).
__device__ inline const void* moved(const void* p, int64_t elements, int64_t size) {
  return p ? static_cast<const char*>(p) + elements * size : nullptr;
}
__device__ inline void* moved(void* p, int64_t elements, int64_t size) {
  return p ? static_cast<char*>(p) + elements * size : nullptr;
}

// Gate g's recurrent pre-activation from a tile's product, gates `stride` apart.
template <typename T>
struct TileRec {
  const T* rec;
  int stride;
  __device__ T operator()(int g) const { return rec[g * stride]; }
};

// G gates: 4 (LSTM) or 3 (GRU). Shared: the h chunk (rows x chunk), the weight chunk (G units x
// chunk) and the tile's product (rows x G units).
template <typename T, int G>
__global__ void recurrence_forward_kernel(RecurrenceForward a) {
  constexpr int R = kTileRows, U = kTileUnits, K = kTileChunk, GU = G * U;
  SF_DYNAMIC_SHARED(shared_bytes);
  T* rows = reinterpret_cast<T*>(shared_bytes);  // [R][K + 1]
  T* weights = rows + R * (K + 1);               // [GU][K + 1]
  T* rec = weights + GU * (K + 1);               // [R][GU]
  const CellForward& c0 = a.cell;
  const int64_t B = c0.batch, H = c0.hidden, GH = G * H, es = sizeof(T), ls = 2;
  const int64_t unit_groups = tile_groups(H, U), tiles = tile_groups(B, R) * unit_groups;
  for (int64_t k = 0; k < a.steps; ++k) {
    const int64_t t = a.reverse ? a.steps - 1 - k : k, tp = a.reverse ? t + 1 : t - 1;
    CellForward p = c0;
    p.gates = moved(c0.gates, t * B * GH, es);
    p.gates_low = moved(c0.gates_low, t * B * GH, ls);
    p.c = moved(c0.c, t * B * H, es);
    p.saved = moved(c0.saved, t * B * H, es);
    p.h = moved(c0.h, t * B * c0.ldh, es);
    p.h_low = moved(c0.h_low, t * B * c0.ldh, ls);
    p.x = moved(c0.x, t * B * c0.ldx, es);
    const void* h_prev = a.h0;  // the product's h, in a.gemm
    int64_t ld = a.ld_h0;
    if (k > 0) {
      p.c_prev = moved(c0.c, tp * B * H, es);
      p.h_prev = moved(c0.h, tp * B * c0.ldh, es);
      p.ld_h_prev = c0.ldh;
      h_prev = c0.h_low ? moved(c0.h_low, tp * B * c0.ldh, ls) : p.h_prev;
      ld = c0.ldh;
    }
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t r0 = tile / unit_groups * R, u0 = tile % unit_groups * U;
      for (int o = threadIdx.x; o < R * GU; o += blockDim.x) rec[o] = T(0);
      // rec(r, c) = sum_k h(r0 + r, k) W_hh(row of c, k), c = g U + u the row g H + u0 + u
      for (int64_t k0 = 0; k0 < H; k0 += K) {
        __syncthreads();  // the previous chunk's readers are done
        for (int e = threadIdx.x; e < R * K; e += blockDim.x) {
          const int64_t b = r0 + e / K, col = k0 + e % K;
          rows[e / K * (K + 1) + e % K] =
              b < B && col < H ? operand<T>(h_prev, a.gemm, b * ld + col) : T(0);
        }
        for (int e = threadIdx.x; e < GU * K; e += blockDim.x) {
          const int c = e / K;
          const int64_t unit = u0 + c % U, col = k0 + e % K;
          weights[c * (K + 1) + e % K] =
              unit < H && col < H ? operand<T>(a.w_hh, a.gemm, (c / U * H + unit) * H + col) : T(0);
        }
        __syncthreads();
        for (int o = threadIdx.x; o < R * GU; o += blockDim.x) {
          const T* row = rows + o / GU * (K + 1);
          const T* w = weights + o % GU * (K + 1);
          T acc = rec[o];
          for (int kk = 0; kk < K; ++kk) acc += row[kk] * w[kk];
          rec[o] = acc;
        }
      }
      __syncthreads();
      for (int e = threadIdx.x; e < R * U; e += blockDim.x) {
        const int r = e / U, u = e % U;
        const int64_t b = r0 + r, j = u0 + u;
        if (b >= B || j >= H) continue;
        const TileRec<T> from{rec + r * GU + u, U};
        if constexpr (G == 4)
          lstm_forward_unit<T>(p, b, j, from);
        else
          gru_forward_unit<T>(p, b, j, from);
      }
      __syncthreads();  // rec is read before the next tile zeroes it
    }
    cooperative_groups::this_grid().sync();
  }
}

// Per step back: dh = dR(prev step back) W_hh (+ the cell's direct term, already in dh), then
// the cell. dgates_step and drec_step stand in for dgates and dgates_rec when the caller keeps
// only their low copies (B, G*H, overwritten each step: only the bias sums read them, each
// tile's own). partial (row groups, bias columns), zeroed, gets each tile's bias sums.
// Shared: the dR chunk (rows x chunk), the W_hh chunk (chunk x units), the tile's dh.
template <typename T, int G>
__global__ void recurrence_backward_kernel(RecurrenceBackward a, T* dgates_step, T* drec_step,
                                           T* partial) {
  constexpr int R = kTileRows, U = kTileUnits, K = kTileChunk, GU = G * U;
  SF_DYNAMIC_SHARED(shared_bytes);
  T* rows = reinterpret_cast<T*>(shared_bytes);  // [R][K + 1]
  T* weights = rows + R * (K + 1);               // [K][U + 1]
  T* acc = weights + K * (U + 1);                // [R][U]
  const CellBackward& c0 = a.cell;
  const int64_t B = c0.batch, H = c0.hidden, GH = G * H, es = sizeof(T), ls = 2;
  const int64_t unit_groups = tile_groups(H, U), tiles = tile_groups(B, R) * unit_groups;
  const int64_t bias_columns = G == 3 ? 2 * GH : GH;
  T* dh = static_cast<T*>(a.dh);
  constexpr bool direct = G == 3;  // the GRU's dh_direct, kept in dh
  // dR: the gradient of the recurrent pre-activations, in a.gemm
  const void* d_rec = G == 3 ? (c0.dgates_rec_low ? c0.dgates_rec_low : c0.dgates_rec)
                             : (c0.dgates_low ? c0.dgates_low : c0.dgates);
  const int64_t d_rec_size = a.gemm == DType::bf16 || a.gemm == DType::f16 ? ls : es;
  auto time_of = [&](int64_t k) { return a.reverse ? k : a.steps - 1 - k; };
  for (int64_t k = 0; k <= a.steps; ++k) {
    if (k > 0) {  // dh = dR(t) W_hh (+ direct) for the step back just done
      const void* d = moved(d_rec, time_of(k - 1) * B * GH, d_rec_size);
      for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t r0 = tile / unit_groups * R, u0 = tile % unit_groups * U;
        for (int o = threadIdx.x; o < R * U; o += blockDim.x) acc[o] = T(0);
        for (int64_t k0 = 0; k0 < GH; k0 += K) {
          __syncthreads();
          for (int e = threadIdx.x; e < R * K; e += blockDim.x) {
            const int64_t b = r0 + e / K, col = k0 + e % K;
            rows[e / K * (K + 1) + e % K] =
                b < B && col < GH ? operand<T>(d, a.gemm, b * GH + col) : T(0);
          }
          for (int e = threadIdx.x; e < K * U; e += blockDim.x) {
            const int64_t row = k0 + e / U, unit = u0 + e % U;
            weights[e / U * (U + 1) + e % U] =
                row < GH && unit < H ? operand<T>(a.w_hh, a.gemm, row * H + unit) : T(0);
          }
          __syncthreads();
          for (int o = threadIdx.x; o < R * U; o += blockDim.x) {
            const T* row = rows + o / U * (K + 1);
            const T* w = weights + o % U;
            T sum = acc[o];
            for (int kk = 0; kk < K; ++kk) sum += row[kk] * w[kk * (U + 1)];
            acc[o] = sum;
          }
        }
        __syncthreads();
        for (int o = threadIdx.x; o < R * U; o += blockDim.x) {
          const int64_t b = r0 + o / U, j = u0 + o % U;
          if (b < B && j < H) dh[b * H + j] = (direct ? dh[b * H + j] : T(0)) + acc[o];
        }
      }
    }
    if (k == a.steps) break;
    const int64_t t = time_of(k), tp = a.reverse ? t + 1 : t - 1;
    const bool first = a.reverse ? t == a.steps - 1 : t == 0;  // the chain's first step forward
    CellBackward p = c0;
    p.gates = moved(c0.gates, t * B * GH, es);
    p.gates_low = moved(c0.gates_low, t * B * GH, ls);
    p.saved = moved(c0.saved, t * B * H, es);
    p.dh_out = moved(c0.dh_out, t * B * c0.ld_dh_out, es);
    p.dgates = c0.dgates ? moved(c0.dgates, t * B * GH, es) : dgates_step;
    p.dgates_low = moved(c0.dgates_low, t * B * GH, ls);
    if (G == 3) p.dgates_rec = c0.dgates_rec ? moved(c0.dgates_rec, t * B * GH, es) : drec_step;
    p.dgates_rec_low = moved(c0.dgates_rec_low, t * B * GH, ls);
    if (!first) {
      p.c_prev = moved(a.c, tp * B * H, es);
      p.h_prev = moved(a.h, tp * B * a.ldh, es);
      p.ld_h_prev = a.ldh;
    }
    p.dh_rec = dh;
    p.dh_direct = direct ? dh : nullptr;
    p.dbias = nullptr;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t rg = tile / unit_groups, r0 = rg * R, u0 = tile % unit_groups * U;
      __syncthreads();  // this tile's dh is written
      for (int e = threadIdx.x; e < R * U; e += blockDim.x) {
        const int64_t b = r0 + e / U, j = u0 + e % U;
        if (b >= B || j >= H) continue;
        if constexpr (G == 4)
          lstm_backward_unit<T>(p, b, j);
        else
          gru_backward_unit<T>(p, b, j);
      }
      if (!partial) continue;
      __syncthreads();  // the tile's dgates are written
      for (int c = threadIdx.x; c < (G == 3 ? 2 : 1) * GU; c += blockDim.x) {
        const int64_t unit = u0 + c % GU % U, col = c % GU / U * H + unit;
        if (unit >= H) continue;
        const T* from = static_cast<const T*>(c < GU ? p.dgates : p.dgates_rec);
        T sum = T(0);
        for (int64_t b = r0; b < r0 + R && b < B; ++b) sum += from[b * GH + col];
        partial[rg * bias_columns + (c < GU ? 0 : GH) + col] += sum;
      }
    }
    cooperative_groups::this_grid().sync();
  }
}

}  // namespace seqforge::cuda
