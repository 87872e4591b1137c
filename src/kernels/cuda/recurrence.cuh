#pragma once
// Whole chains' recurrences (ops.hpp's RecurrenceForward and RecurrenceBackward) in one
// cooperative launch, instead of a GEMM and a cell kernel per step from the host: independent
// chains of one shape (a bidirectional layer's directions) step together, and the blocks split
// each step into tiles of a chain's batch rows x hidden units (a tile's units with all their
// gates), compute the tile's part of the recurrent product from operands staged in shared memory,
// run cells.cuh's unit steps on it, and wait for each other (a grid sync) before the next step,
// which reads every tile's output. A stack's two layers (ops.hpp) step together as a wavefront,
// the upper layer's step t (its input product x[t] W_ih^T in its tiles beside the recurrent one)
// after the lower layer's step t forward, and the lower layer's step t (its output gradient
// dG_upper[t] W_ih beside dR W_hh) after the upper layer's backward: one grid sync a step for
// both. Each block keeps the same tiles at every step, so a unit's
// carried state (c, dc, dh) is only ever touched by one block. A step's latency is its cost: a
// thread issues its loads of a staged operand in batches before it stores them, loads its cell's
// other inputs before the product, and the products read 16-byte vectors along K from rows padded
// so that those reads spread over the banks.
#include <cooperative_groups.h>

#include <type_traits>

#include "kernels/cuda/cells.cuh"
#include "kernels/recurrence_steps.hpp"

namespace seqforge::cuda {

constexpr int kTileRows = 32, kTileUnits = 8;
constexpr int kRecurrenceThreads = 256;
static_assert(kTileRows * kTileUnits == kRecurrenceThreads, "a tile's units, one per thread");
// Registers are held to what two blocks per SM allow (__launch_bounds__), so that grids of up to
// twice the SMs' count keep their weights resident.

__host__ __device__ inline int64_t tile_groups(int64_t n, int64_t per) {
  return (n + per - 1) / per;
}

// Up to kMaxChains independent chains of one batch, width and length, passed by value to a launch.
constexpr int kMaxChains = 2;
template <typename Chain>
struct Chains {
  Chain chain[kMaxChains];
  int count = 0;
};
// Chain c, by value and each member selected with static indices: indexing the parameter array
// with c would copy the whole array to local memory.
template <typename Chain>
__device__ inline Chain chain_at(const Chains<Chain>& chains, int64_t c) {
  static_assert(kMaxChains == 2);
  return c == 0 ? chains.chain[0] : chains.chain[1];
}

// Element i of a product operand, T's own or a half-precision copy's (`dtype` bf16 or f16).
template <typename T>
__device__ inline T operand(const void* p, DType dtype, int64_t i) {
  if (dtype == DType::bf16 || dtype == DType::f16) return T(load_low(p, dtype, i));
  return static_cast<const T*>(p)[i];
}

// 16 bytes of T: the unit the products read shared memory in.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int n = 16 / sizeof(T);
  T v[n];
};
template <typename T>
__device__ inline Vec16<T> load16(const T* p) {
  return *reinterpret_cast<const Vec16<T>*>(p);
}

// The row stride, in elements of `size` bytes, of n values staged in shared memory: an odd
// number of 16-byte vectors, so that 8 threads reading a vector each from 8 consecutive rows
// touch 8 different groups of banks.
__host__ __device__ inline int64_t staged_stride(int64_t n, int64_t size) {
  const int64_t vec = 16 / size;
  return (n + 2 * vec - 1) / (2 * vec) * (2 * vec) + vec;
}
// n rounded up to whole 16-byte vectors of `size`-byte elements.
__host__ __device__ inline int64_t staged_width(int64_t n, int64_t size) {
  const int64_t vec = 16 / size;
  return (n + vec - 1) / vec * vec;
}

// dst[r * ld + kk] = value(r, kk) for r < rows, kk < width, split over the block with
// consecutive threads along a row. Each thread loads kBatch values before it stores any, so that
// the loads' latencies overlap rather than add up, and steps through its elements by additions
// (a division per element would cost more than the loads).
template <int kBatch, typename T, typename Value>
__device__ inline void stage(T* dst, int64_t ld, int rows, int width, const Value& value) {
  if (rows <= 0 || width <= 0) return;
  const int stride = static_cast<int>(blockDim.x), dr = stride / width, dc = stride % width;
  int r = static_cast<int>(threadIdx.x) / width, c = static_cast<int>(threadIdx.x) % width;
  const auto next = [&](int& row, int& col) {  // the element stride further on
    row += dr, col += dc;
    if (col >= width) col -= width, ++row;
  };
  while (r < rows) {
    T v[kBatch];
    const int r0 = r, c0 = c;
    for (int i = 0; i < kBatch; ++i, next(r, c)) v[i] = r < rows ? value(r, c) : T{};
    r = r0, c = c0;
    for (int i = 0; i < kBatch; ++i, next(r, c))
      if (r < rows) dst[r * ld + c] = v[i];
  }
}

// stage() of rows of a product operand (T's own or a half-precision copy, `dtype`): row r,
// column kk is element (row0 + r) * ld_src + col0 + kk of src where row0 + r < nrows and kk < n,
// else 0. With kVectors, T's own rows whose vectors are 16-byte aligned are read 16 bytes at a
// time. kBatch values (kBatch / 2 vectors) a thread are in flight at once: what the registers
// the kernel has to spare allow.
template <typename T, bool kVectors, int kBatch>
__device__ inline void stage_operand(T* dst, int64_t ld, int rows, int width, const void* src,
                                     DType dtype, int64_t ld_src, int64_t row0, int64_t nrows,
                                     int64_t col0, int64_t n) {
  constexpr int V = Vec16<T>::n;
  const bool low = dtype == DType::bf16 || dtype == DType::f16;
  if (kVectors && !low && ld_src % V == 0 && col0 % V == 0 &&
      reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const T* from = static_cast<const T*>(src);
    stage<kBatch / 2>(
        reinterpret_cast<Vec16<T>*>(dst), ld / V, rows, width / V, [&](int r, int cv) {
          const int64_t row = row0 + r, kk = int64_t{cv} * V, at = row * ld_src + col0 + kk;
          Vec16<T> x{};
          if (row >= nrows) return x;
          if (kk + V <= n) return load16(from + at);
          for (int v = 0; v < V; ++v) x.v[v] = kk + v < n ? from[at + v] : T(0);
          return x;
        });
    return;
  }
  const auto from = [&](auto load) {
    stage<kBatch>(dst, ld, rows, width, [&](int r, int kk) {
      return row0 + r < nrows && kk < n ? T(load((row0 + r) * ld_src + col0 + kk)) : T(0);
    });
  };
  if (low)
    from([&](int64_t i) { return load_low(src, dtype, i); });
  else
    from([&](int64_t i) { return static_cast<const T*>(src)[i]; });
}

// Gate g's recurrent pre-activation from a tile's product, gates `stride` apart.
template <typename T>
struct TileRec {
  const T* rec;
  int stride;
  __device__ T operator()(int g) const { return rec[g * stride]; }
};

// Between steps, a launch given progress counters (one per chain and row group, zeroed: the
// tile-steps done there) waits on them instead of a grid sync: a tile's step waits only for the
// steps it reads, its row group's of its own chain (and of the other chain of a stack), so a
// row group runs on while another is late. Each count is cooperative groups' grid barrier taken
// apart: the block's writes, a barrier, a fence by one thread, then its count; a waiting block's
// first thread spins on the counts, fences, and a barrier lets the block read.
__device__ inline void wait_for_steps(const unsigned* a, unsigned at_least_a, const unsigned* b,
                                      unsigned at_least_b) {
  if (threadIdx.x == 0) {
    while (*static_cast<const volatile unsigned*>(a) < at_least_a) __nanosleep(32);
    if (b)
      while (*static_cast<const volatile unsigned*>(b) < at_least_b) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
}
// After a barrier that follows the block's writes of the step.
__device__ inline void count_step(unsigned* count) {
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(count, 1u);
  }
}

// How a launch stages its product in shared memory (planned by the launcher for the GPU's
// shared memory): the K range in chunks of `chunk`, and the block's slice of W_hh loaded once for
// all steps when `resident` (each block then has one tile), else a chunk of it with each chunk.
struct RecurrencePlan {
  int chunk = 32;
  bool resident = false;
};

// Whether a launch's chains are a stack: chain 1 the layer above chain 0 (ops.hpp).
template <typename Chain>
__host__ __device__ inline bool stacked(const Chains<Chain>& chains) {
  return chains.count == 2 && chains.chain[1].w_ih != nullptr;
}

// Where a whole-chain launch's shared arrays start, in elements, and the elements it needs:
// weights [weight_rows][w_stride] (all k_total columns when resident, else a chunk), a resident
// stack's W_ih slices the same again, rows [R][r_stride] (a chunk of the other operand), out
// [R][out_columns] and a stack's second out alike.
struct RecurrenceShared {
  int64_t w_stride, r_stride;
  int64_t weights_in, rows, out, out2, elements;
};
__host__ __device__ inline RecurrenceShared recurrence_shared(int64_t weight_rows, int64_t k_total,
                                                              int64_t out_columns,
                                                              const RecurrencePlan& p, int64_t size,
                                                              bool stack) {
  RecurrenceShared s{};
  s.w_stride = staged_stride(p.resident ? k_total : p.chunk, size);
  s.r_stride = staged_stride(p.chunk, size);
  s.weights_in = weight_rows * s.w_stride;
  s.rows = s.weights_in + (stack && p.resident ? weight_rows * s.w_stride : 0);
  s.out = s.rows + kTileRows * s.r_stride;
  s.out2 = s.out + kTileRows * out_columns;
  s.elements = s.out2 + (stack ? kTileRows * out_columns : 0);
  return s;
}
// Forward: the tile's G U rows of W_hh (and W_ih) over K = H; out is rec, out2 a stack's pre.
__host__ __device__ inline RecurrenceShared recurrence_forward_shared(int gates, int64_t hidden,
                                                                      const RecurrencePlan& p,
                                                                      int64_t size, bool stack) {
  return recurrence_shared(gates * kTileUnits, hidden, gates * kTileUnits, p, size, stack);
}

// A cell's inputs besides the recurrent product, for unit e of the tile at (r0, u0) (zeros for
// a unit outside the batch or the layer).
template <typename T, int G>
using ForwardInputs = std::conditional_t<G == 4, LstmForwardInputs<T>, GruForwardInputs<T>>;
template <typename T, int G>
__device__ inline ForwardInputs<T, G> forward_inputs(const CellForward& p, int64_t r0, int64_t u0,
                                                     int e, int64_t B, int64_t H, bool with_pre) {
  const int64_t b = r0 + e / kTileUnits, j = u0 + e % kTileUnits;
  if (e >= kTileRows * kTileUnits || b >= B || j >= H) return {};
  if constexpr (G == 4)
    return lstm_forward_inputs<T>(p, b, j, with_pre);
  else
    return gru_forward_inputs<T>(p, b, j, with_pre);
}
template <typename T, int G>
using BackwardInputs = std::conditional_t<G == 4, LstmBackwardInputs<T>, GruBackwardInputs<T>>;
template <typename T, int G>
__device__ inline BackwardInputs<T, G> backward_inputs(const CellBackward& p, int64_t r0,
                                                       int64_t u0, int e, int64_t B, int64_t H) {
  const int64_t b = r0 + e / kTileUnits, j = u0 + e % kTileUnits;
  if (e >= kTileRows * kTileUnits || b >= B || j >= H) return {};
  if constexpr (G == 4)
    return lstm_backward_inputs<T>(p, b, j);
  else
    return gru_backward_inputs<T>(p, b, j);
}

// G gates: 4 (LSTM) or 3 (GRU). The tile's product rec(r, c), c = g U + u (row g H + u0 + u of
// W_hh), is computed in 2 x 2 blocks of outputs per thread, rows r and r + 1, columns c and
// c + GU / 2: each staged vector read serves two products of each of its elements, and a warp's
// columns are consecutive rows of the staged weights. A stack's upper layer computes its input
// product pre(r, c) from x[t] and W_ih alike.
template <typename T, int G>
__global__ void __launch_bounds__(kRecurrenceThreads, 2)
    recurrence_forward_kernel(Chains<RecurrenceForward> chains, RecurrencePlan plan,
                              unsigned* progress) {
  constexpr int R = kTileRows, U = kTileUnits, GU = G * U, V = Vec16<T>::n;
  SF_DYNAMIC_SHARED(shared_bytes);
  const int64_t B = chains.chain[0].cell.batch, H = chains.chain[0].cell.hidden;
  const int K = plan.chunk;
  const bool stack = stacked(chains);  // chain 1 then runs a step behind chain 0
  const RecurrenceShared at = recurrence_forward_shared(G, H, plan, sizeof(T), stack);
  const int64_t w_stride = at.w_stride, r_stride = at.r_stride;
  T* weights = reinterpret_cast<T*>(shared_bytes);  // [GU][w_stride]
  T* weights_in = weights + at.weights_in;          // [GU][w_stride]: a resident stack's W_ih
  T* rows = weights + at.rows;                      // [R][r_stride]
  T* rec = weights + at.out;                        // [R][GU]
  T* pre = weights + at.out2;                       // [R][GU]: a stack's
  // Tile t is chain t / per_chain's tile t % per_chain.
  const int64_t unit_groups = tile_groups(H, U), row_groups = tile_groups(B, R);
  const int64_t per_chain = row_groups * unit_groups, tiles = chains.count * per_chain;
  auto count = [&](int64_t c, int64_t rg) { return progress + c * row_groups + rg; };
  // Rows of the tile's gates of w ((G H, H) in dtype: W_hh or W_ih), columns [k0, k0 + n), into
  // into[c][kk], zero-padded to whole vectors.
  auto stage_weights = [&](T* into, const void* w, DType dtype, int64_t u0, int64_t k0, int64_t n) {
    const int width = static_cast<int>(staged_width(n, sizeof(T)));
    for (int g = 0; g < G; ++g)  // gate g's U rows: rows g H + u0 ..
      stage_operand<T, false, 8>(into + g * U * w_stride, w_stride, U, width, w, dtype, H,
                                 g * H + u0, g * H + (H < u0 + U ? H : u0 + U), k0, n);
  };
  if (plan.resident && blockIdx.x < tiles) {
    const RecurrenceForward a = chain_at(chains, blockIdx.x / per_chain);
    const int64_t u0 = blockIdx.x % unit_groups * U;
    stage_weights(weights, a.w_hh, a.gemm, u0, 0, H);
    if (a.w_ih) stage_weights(weights_in, a.w_ih, a.gemm, u0, 0, H);
  }
  // acc[r][c] += src(r0 + r, :) . w(row c of the tile's gates, :), K = H: src's rows ld_src apart
  // in dtype, w's slice resident (resident_w) or staged a chunk at a time.
  auto product = [&](T* acc, const void* src, int64_t ld_src, DType dtype, const T* resident_w,
                     const void* w, int64_t r0, int64_t u0) {
    for (int64_t k0 = 0; k0 < H; k0 += K) {
      const int64_t n = k0 + K < H ? K : H - k0;
      const int width = static_cast<int>(staged_width(n, sizeof(T)));
      __syncthreads();  // the previous chunk's readers are done
      // Scalars, 4 at a time: more registers would spill here (sm_80 to sm_89).
      stage_operand<T, false, 4>(rows, r_stride, R, width, src, dtype, ld_src, r0, B, k0, n);
      if (!resident_w) stage_weights(weights, w, dtype, u0, k0, n);
      __syncthreads();
      const T* w0 = resident_w ? resident_w + k0 : weights;
      for (int m = threadIdx.x; m < R * GU / 4; m += blockDim.x) {
        const int r = m / (GU / 2) * 2, c = m % (GU / 2), c2 = c + GU / 2;
        const T *a0 = rows + r * r_stride, *a1 = a0 + r_stride;
        const T *b0 = w0 + c * w_stride, *b1 = w0 + c2 * w_stride;
        T s00 = acc[r * GU + c], s01 = acc[r * GU + c2];
        T s10 = acc[(r + 1) * GU + c], s11 = acc[(r + 1) * GU + c2];
        for (int kk = 0; kk < width; kk += V) {
          const Vec16<T> x0 = load16(a0 + kk), x1 = load16(a1 + kk);
          const Vec16<T> y0 = load16(b0 + kk), y1 = load16(b1 + kk);
          for (int v = 0; v < V; ++v) {
            s00 += x0.v[v] * y0.v[v];
            s01 += x0.v[v] * y1.v[v];
            s10 += x1.v[v] * y0.v[v];
            s11 += x1.v[v] * y1.v[v];
          }
        }
        acc[r * GU + c] = s00;
        acc[r * GU + c2] = s01;
        acc[(r + 1) * GU + c] = s10;
        acc[(r + 1) * GU + c2] = s11;
      }
    }
  };
  using Inputs = ForwardInputs<T, G>;
  const int64_t steps = chains.chain[0].steps;
  for (int64_t k = 0; k < steps + (stack ? 1 : 0); ++k) {
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t c = tile / per_chain, kc = stack && c == 1 ? k - 1 : k;  // the chain's step
      if (kc < 0 || kc >= steps) continue;
      const RecurrenceForward a = chain_at(chains, c);
      const bool upper = a.w_ih != nullptr;
      const ref::ForwardStep step = ref::forward_step(a, kc, G, sizeof(T));
      const CellForward& p = step.cell;
      const int64_t rg = tile % per_chain / unit_groups, r0 = rg * R, u0 = tile % unit_groups * U;
      // The thread's first unit (its only one at kRecurrenceThreads) reads its inputs now.
      const Inputs first = forward_inputs<T, G>(p, r0, u0, threadIdx.x, B, H, !upper);
      if (progress)  // h of the step before, and a stack's upper chain's x of this one
        wait_for_steps(count(c, rg), unsigned(kc * unit_groups), upper ? count(0, rg) : nullptr,
                       unsigned((kc + 1) * unit_groups));
      for (int o = threadIdx.x; o < R * GU; o += blockDim.x) {
        rec[o] = T(0);
        if (upper) pre[o] = T(0);
      }
      if (upper) {  // pre = x[t] W_ih^T, x[t] the lower chain's output of this step
        const int64_t t = a.reverse ? steps - 1 - kc : kc;
        const int64_t size = a.gemm == DType::bf16 || a.gemm == DType::f16 ? 2 : sizeof(T);
        product(pre, ref::moved(a.x, t * B * a.ld_x, size), a.ld_x, a.gemm,
                plan.resident ? weights_in : nullptr, a.w_ih, r0, u0);
      }
      product(rec, step.h_prev, step.ld, a.gemm, plan.resident ? weights : nullptr, a.w_hh, r0, u0);
      __syncthreads();
      const T* bias = static_cast<const T*>(a.bias);
      for (int e = threadIdx.x; e < R * U; e += blockDim.x) {
        const int64_t b = r0 + e / U, j = u0 + e % U;
        if (b >= B || j >= H) continue;
        Inputs in = e == threadIdx.x ? first : forward_inputs<T, G>(p, r0, u0, e, B, H, !upper);
        if (upper)
          for (int g = 0; g < G; ++g)
            in.pre[g] = pre[e / U * GU + g * U + e % U] + (bias ? bias[g * H + j] : T(0));
        const TileRec<T> from{rec + e / U * GU + e % U, U};
        if constexpr (G == 4)
          lstm_forward_finish<T>(p, b, j, in, from);
        else
          gru_forward_finish<T>(p, b, j, in, from);
      }
      __syncthreads();  // rec and pre are read before the next tile zeroes them
      if (progress) count_step(count(c, rg));
    }
    if (!progress) cooperative_groups::this_grid().sync();
  }
}

// Backward: the tile's U columns of W_hh (and the upper W_ih) over K = G H; out is acc, out2 a
// stack's din.
__host__ __device__ inline RecurrenceShared recurrence_backward_shared(int gates, int64_t hidden,
                                                                       const RecurrencePlan& p,
                                                                       int64_t size, bool stack) {
  return recurrence_shared(kTileUnits, gates * hidden, kTileUnits, p, size, stack);
}

// Per step back: dh = dR(prev step back) W_hh (+ the cell's direct term, already in dh), then
// the cell; a stack's lower layer, a step behind the upper one, takes its output gradient
// dG_upper[t] W_ih (din) in place of dh_out. dgates_step and drec_step stand in for dgates and
// dgates_rec when the caller keeps only their low copies ((B, G*H) a chain, overwritten each
// step: only the bias sums read them, each tile's own). partial ((row groups, bias columns) a
// chain), zeroed, gets each tile's bias sums.
template <typename T, int G>
__global__ void __launch_bounds__(kRecurrenceThreads, 2)
    recurrence_backward_kernel(Chains<RecurrenceBackward> chains, RecurrencePlan plan,
                               T* dgates_step, T* drec_step, T* partial, unsigned* progress) {
  constexpr int R = kTileRows, U = kTileUnits, GU = G * U, V = Vec16<T>::n;
  SF_DYNAMIC_SHARED(shared_bytes);
  const int64_t B = chains.chain[0].cell.batch, H = chains.chain[0].cell.hidden, GH = G * H;
  const int K = plan.chunk;
  const bool stack = stacked(chains);  // chain 0 then runs a step behind chain 1
  const RecurrenceShared at = recurrence_backward_shared(G, H, plan, sizeof(T), stack);
  const int64_t w_stride = at.w_stride, r_stride = at.r_stride;
  T* weights = reinterpret_cast<T*>(shared_bytes);  // [U][w_stride]: W_hh(k, u0 + u) at [u][k]
  T* weights_in = weights + at.weights_in;  // [U][w_stride]: a resident stack's upper W_ih, alike
  T* rows = weights + at.rows;              // [R][r_stride]
  T* acc = weights + at.out;                // [R][U]
  T* din = weights + at.out2;               // [R][U]: a stack's
  // Tile t is chain t / per_chain's tile t % per_chain.
  const int64_t unit_groups = tile_groups(H, U), row_groups = tile_groups(B, R);
  const int64_t per_chain = row_groups * unit_groups, tiles = chains.count * per_chain;
  auto count = [&](int64_t c, int64_t rg) { return progress + c * row_groups + rg; };
  const int64_t bias_columns = G == 3 ? 2 * GH : GH;
  constexpr bool direct = G == 3;  // the GRU's dh_direct, kept in dh
  // Rows [k0, k0 + n) of w ((G H, H) in dtype: W_hh or W_ih), the tile's units, into into[u][kk],
  // zero-padded to whole vectors.
  auto stage_weights = [&](T* into, const void* w, DType dtype, int64_t u0, int64_t k0, int64_t n) {
    stage<8>(into, w_stride, U, static_cast<int>(staged_width(n, sizeof(T))), [&](int u, int kk) {
      return u0 + u < H && kk < n ? operand<T>(w, dtype, (k0 + kk) * H + u0 + u) : T(0);
    });
  };
  if (plan.resident && blockIdx.x < tiles) {
    const int64_t c = blockIdx.x / per_chain, u0 = blockIdx.x % unit_groups * U;
    const RecurrenceBackward a = chain_at(chains, c);
    stage_weights(weights, a.w_hh, a.gemm, u0, 0, GH);
    if (stack && c == 0) stage_weights(weights_in, chains.chain[1].w_ih, a.gemm, u0, 0, GH);
  }
  // out = d(rows r0.., all G H columns; in dtype) w, the tile's units: w's slice resident
  // (resident_w) or staged a chunk at a time. out[e] is unit e's, written by the thread that
  // later reads it.
  auto product = [&](T* out, const void* d, DType dtype, const T* resident_w, const void* w,
                     int64_t r0, int64_t u0) {
    for (int o = threadIdx.x; o < R * U; o += blockDim.x) out[o] = T(0);
    for (int64_t k0 = 0; k0 < GH; k0 += K) {
      const int64_t n = k0 + K < GH ? K : GH - k0;
      const int width = static_cast<int>(staged_width(n, sizeof(T)));
      __syncthreads();
      stage_operand<T, true, 8>(rows, r_stride, R, width, d, dtype, GH, r0, B, k0, n);
      if (!resident_w) stage_weights(weights, w, dtype, u0, k0, n);
      __syncthreads();
      const T* w0 = resident_w ? resident_w + k0 : weights;
      for (int o = threadIdx.x; o < R * U; o += blockDim.x) {
        const T* row = rows + o / U * r_stride;
        const T* wu = w0 + o % U * w_stride;
        T sum = out[o];
        for (int kk = 0; kk < width; kk += V) {
          const Vec16<T> x = load16(row + kk), y = load16(wu + kk);
          for (int v = 0; v < V; ++v) sum += x.v[v] * y.v[v];
        }
        out[o] = sum;
      }
    }
  };
  // The tile's dh (+)= dR W_hh of chain a: into dh, and into acc[e] for unit e, which the thread
  // that wrote it reads back.
  auto recurrent_dh = [&](const RecurrenceBackward& a, const void* d, int64_t r0, int64_t u0) {
    T* dh = static_cast<T*>(a.dh);
    product(acc, d, a.gemm, plan.resident ? weights : nullptr, a.w_hh, r0, u0);
    __syncthreads();
    for (int e = threadIdx.x; e < R * U; e += blockDim.x) {
      const int64_t b = r0 + e / U, j = u0 + e % U;
      if (b >= B || j >= H) continue;
      acc[e] += direct ? dh[b * H + j] : T(0);
      dh[b * H + j] = acc[e];
    }
  };
  using Inputs = BackwardInputs<T, G>;
  const int64_t steps = chains.chain[0].steps;
  for (int64_t k = 0; k < steps + (stack ? 1 : 0); ++k) {
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t c = tile / per_chain, kc = stack && c == 0 ? k - 1 : k;  // the chain's step
      if (kc < 0 || kc >= steps) continue;
      const RecurrenceBackward a = chain_at(chains, c);
      const bool lower = stack && c == 0;
      CellBackward p = ref::backward_step(a, kc, G, direct, sizeof(T));
      if (!p.dgates) p.dgates = dgates_step + c * B * GH;
      if (G == 3 && !p.dgates_rec) p.dgates_rec = drec_step + c * B * GH;
      p.dbias = nullptr;  // summed per tile into partial
      T* dh = static_cast<T*>(a.dh);
      const int64_t rg = tile % per_chain / unit_groups, r0 = rg * R, u0 = tile % unit_groups * U;
      // The thread's first unit (its only one at kRecurrenceThreads) reads its inputs now.
      const Inputs first = backward_inputs<T, G>(p, r0, u0, threadIdx.x, B, H);
      if (progress)  // dR of the step back before, and a stack's lower chain's dG_upper of this one
        wait_for_steps(count(c, rg), unsigned(kc * unit_groups), lower ? count(1, rg) : nullptr,
                       unsigned((kc + 1) * unit_groups));
      if (lower) {  // din = dG_upper[t] W_ih, the upper chain's step of the same time
        const RecurrenceBackward above = chain_at(chains, 1);
        product(din, ref::recurrent_operand(above, kc, G, false, sizeof(T)), above.gemm,
                plan.resident ? weights_in : nullptr, above.w_ih, r0, u0);
      }
      // dh from the step back just done: dR(k - 1) W_hh (+ direct); at the first, a.dh as given.
      if (kc > 0) recurrent_dh(a, ref::recurrent_operand(a, kc - 1, G, direct, sizeof(T)), r0, u0);
      for (int e = threadIdx.x; e < R * U; e += blockDim.x) {
        const int64_t b = r0 + e / U, j = u0 + e % U;
        if (b >= B || j >= H) continue;
        Inputs in = e == threadIdx.x ? first : backward_inputs<T, G>(p, r0, u0, e, B, H);
        if (lower) in.dh_out = din[e];
        const T dh_rec = kc > 0 ? acc[e] : dh[b * H + j];
        if constexpr (G == 4)
          lstm_backward_finish<T>(p, b, j, in, dh_rec);
        else
          gru_backward_finish<T>(p, b, j, in, dh_rec);
      }
      if (partial || progress) __syncthreads();  // the tile's dgates are written
      if (progress) count_step(count(c, rg));
      if (!partial) continue;
      for (int column = threadIdx.x; column < (G == 3 ? 2 : 1) * GU; column += blockDim.x) {
        const int64_t unit = u0 + column % GU % U, col = column % GU / U * H + unit;
        if (unit >= H) continue;
        const T* from = static_cast<const T*>(column < GU ? p.dgates : p.dgates_rec);
        T sum = T(0);
        for (int64_t row = r0; row < r0 + R && row < B; ++row) sum += from[row * GH + col];
        partial[(c * row_groups + rg) * bias_columns + (column < GU ? 0 : GH) + col] += sum;
      }
    }
    if (!progress) cooperative_groups::this_grid().sync();
  }
  // dh of each chain's first step forward: dR of the last step back, W_hh (+ direct).
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t c = tile / per_chain, rg = tile % per_chain / unit_groups;
    const RecurrenceBackward a = chain_at(chains, c);
    if (progress) wait_for_steps(count(c, rg), unsigned(steps * unit_groups), nullptr, 0);
    recurrent_dh(a, ref::recurrent_operand(a, a.steps - 1, G, direct, sizeof(T)), rg * R,
                 tile % unit_groups * U);
  }
}

}  // namespace seqforge::cuda
