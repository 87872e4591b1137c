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
#include "kernels/recurrence_steps.hpp"

namespace seqforge::cuda {

constexpr int kTileRows = 32, kTileUnits = 8;
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

// fn(r, kk) for r < rows, kk < n, split over the block: a warp's threads along a row, its warps
// over the rows, so that a row's loads are consecutive and no index is divided.
template <typename Fn>
__device__ inline void for_each_in_block(int rows, int n, const Fn& fn) {
  const int lanes = blockDim.x < 32 ? blockDim.x : 32, groups = blockDim.x / lanes;
  const int lane = threadIdx.x % lanes, group = threadIdx.x / lanes;
  if (group >= groups) return;
  for (int r = group; r < rows; r += groups)
    for (int kk = lane; kk < n; kk += lanes) fn(r, kk);
}

// Gate g's recurrent pre-activation from a tile's product, gates `stride` apart.
template <typename T>
struct TileRec {
  const T* rec;
  int stride;
  __device__ T operator()(int g) const { return rec[g * stride]; }
};

// How a launch stages its product in shared memory (planned by the launcher for the GPU's
// shared memory): the K range in chunks of `chunk`, and the block's slice of W_hh loaded once for
// all steps when `resident` (each block then has one tile), else a chunk of it with each chunk.
struct RecurrencePlan {
  int chunk = 32;
  bool resident = false;
};

// G gates: 4 (LSTM) or 3 (GRU). The tile's product rec(r, c), c = g U + u (row g H + u0 + u of
// W_hh), is computed in 2 x 2 blocks of outputs per thread: each staged value read serves two
// products.
template <typename T, int G>
__global__ void recurrence_forward_kernel(RecurrenceForward a, RecurrencePlan plan) {
  constexpr int R = kTileRows, U = kTileUnits, GU = G * U;
  SF_DYNAMIC_SHARED(shared_bytes);
  const int64_t B = a.cell.batch, H = a.cell.hidden;
  const int K = plan.chunk;
  const int64_t w_stride = plan.resident ? H + 1 : K + 1;
  T* weights = reinterpret_cast<T*>(shared_bytes);  // [GU][w_stride]
  T* rows = weights + GU * w_stride;                // [R][K + 1]
  T* rec = rows + R * (K + 1);                      // [R][GU]
  const int64_t unit_groups = tile_groups(H, U), tiles = tile_groups(B, R) * unit_groups;
  // W_hh's rows of the tile's gates, columns [k0, k0 + n), into weights[c][kk].
  auto stage_weights = [&](int64_t u0, int64_t k0, int64_t n) {
    for_each_in_block(GU, static_cast<int>(n), [&](int c, int kk) {
      const int64_t unit = u0 + c % U;
      weights[c * w_stride + kk] =
          unit < H ? operand<T>(a.w_hh, a.gemm, (c / U * H + unit) * H + k0 + kk) : T(0);
    });
  };
  if (plan.resident && blockIdx.x < tiles) stage_weights(blockIdx.x % unit_groups * U, 0, H);
  for (int64_t k = 0; k < a.steps; ++k) {
    const ref::ForwardStep step = ref::forward_step(a, k, G, sizeof(T));
    const CellForward& p = step.cell;
    const void* h_prev = step.h_prev;  // the product's h, in a.gemm
    const int64_t ld = step.ld;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t r0 = tile / unit_groups * R, u0 = tile % unit_groups * U;
      for (int o = threadIdx.x; o < R * GU; o += blockDim.x) rec[o] = T(0);
      for (int64_t k0 = 0; k0 < H; k0 += K) {
        const int64_t n = k0 + K < H ? K : H - k0;
        __syncthreads();  // the previous chunk's readers are done
        for_each_in_block(R, static_cast<int>(n), [&](int r, int kk) {
          const int64_t b = r0 + r;
          rows[r * (K + 1) + kk] = b < B ? operand<T>(h_prev, a.gemm, b * ld + k0 + kk) : T(0);
        });
        if (!plan.resident) stage_weights(u0, k0, n);
        __syncthreads();
        const T* w0 = weights + (plan.resident ? k0 : 0);
        for (int m = threadIdx.x; m < R * GU / 4; m += blockDim.x) {
          const int r = m / (GU / 2) * 2, c = m % (GU / 2) * 2;
          const T *a0 = rows + r * (K + 1), *a1 = a0 + K + 1;
          const T *b0 = w0 + c * w_stride, *b1 = b0 + w_stride;
          T s00 = rec[r * GU + c], s01 = rec[r * GU + c + 1];
          T s10 = rec[(r + 1) * GU + c], s11 = rec[(r + 1) * GU + c + 1];
          for (int64_t kk = 0; kk < n; ++kk) {
            const T x0 = a0[kk], x1 = a1[kk], y0 = b0[kk], y1 = b1[kk];
            s00 += x0 * y0;
            s01 += x0 * y1;
            s10 += x1 * y0;
            s11 += x1 * y1;
          }
          rec[r * GU + c] = s00;
          rec[r * GU + c + 1] = s01;
          rec[(r + 1) * GU + c] = s10;
          rec[(r + 1) * GU + c + 1] = s11;
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
template <typename T, int G>
__global__ void recurrence_backward_kernel(RecurrenceBackward a, RecurrencePlan plan,
                                           T* dgates_step, T* drec_step, T* partial) {
  constexpr int R = kTileRows, U = kTileUnits, GU = G * U;
  SF_DYNAMIC_SHARED(shared_bytes);
  const int64_t B = a.cell.batch, H = a.cell.hidden, GH = G * H;
  const int K = plan.chunk;
  T* weights = reinterpret_cast<T*>(shared_bytes);         // [GH or K][U + 1]: W_hh(k, u0 + u)
  T* rows = weights + (plan.resident ? GH : K) * (U + 1);  // [R][K + 1]
  T* acc = rows + R * (K + 1);                             // [R][U]
  const int64_t unit_groups = tile_groups(H, U), tiles = tile_groups(B, R) * unit_groups;
  const int64_t bias_columns = G == 3 ? 2 * GH : GH;
  T* dh = static_cast<T*>(a.dh);
  constexpr bool direct = G == 3;  // the GRU's dh_direct, kept in dh
  // W_hh's rows [k0, k0 + n), the tile's units, into weights[kk][u].
  auto stage_weights = [&](int64_t u0, int64_t k0, int64_t n) {
    for (int e = threadIdx.x; e < n * U; e += blockDim.x) {
      const int64_t row = k0 + e / U, unit = u0 + e % U;
      weights[e / U * (U + 1) + e % U] =
          unit < H ? operand<T>(a.w_hh, a.gemm, row * H + unit) : T(0);
    }
  };
  if (plan.resident && blockIdx.x < tiles) stage_weights(blockIdx.x % unit_groups * U, 0, GH);
  for (int64_t k = 0; k <= a.steps; ++k) {
    if (k > 0) {  // dh = dR(t) W_hh (+ direct) for the step back just done
      // dR of the step back just done, in a.gemm
      const void* d = ref::recurrent_operand(a, k - 1, G, G == 3, sizeof(T));
      for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t r0 = tile / unit_groups * R, u0 = tile % unit_groups * U;
        for (int o = threadIdx.x; o < R * U; o += blockDim.x) acc[o] = T(0);
        for (int64_t k0 = 0; k0 < GH; k0 += K) {
          const int64_t n = k0 + K < GH ? K : GH - k0;
          __syncthreads();
          for_each_in_block(R, static_cast<int>(n), [&](int r, int kk) {
            const int64_t b = r0 + r;
            rows[r * (K + 1) + kk] = b < B ? operand<T>(d, a.gemm, b * GH + k0 + kk) : T(0);
          });
          if (!plan.resident) stage_weights(u0, k0, n);
          __syncthreads();
          const T* w0 = weights + (plan.resident ? k0 * (U + 1) : 0);
          for (int o = threadIdx.x; o < R * U; o += blockDim.x) {
            const T* row = rows + o / U * (K + 1);
            const T* w = w0 + o % U;
            T sum = acc[o];
            for (int64_t kk = 0; kk < n; ++kk) sum += row[kk] * w[kk * (U + 1)];
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
    CellBackward p = ref::backward_step(a, k, G, direct, sizeof(T));
    if (!p.dgates) p.dgates = dgates_step;
    if (G == 3 && !p.dgates_rec) p.dgates_rec = drec_step;
    p.dbias = nullptr;  // summed per tile into partial
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
