#pragma once
// Shared by the CUDA kernel families: launch geometry, dtype dispatch and bf16/f16 rounding that
// matches the host's bit for bit.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.hpp"  // kPartialBlocks
#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill any GPU, no more than n needs.
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

// The grid of for_band_columns: a block per (band, column tile) pair of kThreads columns.
inline unsigned band_blocks(int64_t chunks, int64_t C) {
  const int64_t pairs = chunks * ((C + kThreads - 1) / kThreads);
  return static_cast<unsigned>(pairs < 65535 ? pairs : 65535);
}

// kernel<<<grid, block, shared, stream>>>(args...) as SF_LAUNCH(grid, block, shared, stream,
// kernel)(args...), and dynamic shared memory as SF_DYNAMIC_SHARED(name): macros, so that the
// kernels and their launchers also run in the tests' host emulation (tests/cuda/emulated).
// A cooperative launch (all blocks resident at once, so that they may wait for each other) is
// SF_LAUNCH_COOPERATIVE(...)(args...); a failed one is reported by cudaGetLastError. Dynamic
// shared memory is 128-byte aligned (warp matrix loads need 32).
#ifndef SF_LAUNCH
#define SF_LAUNCH(grid, block, shared, stream, ...) __VA_ARGS__<<<grid, block, shared, stream>>>
#define SF_LAUNCH_COOPERATIVE(grid, block, shared, stream, ...) \
  ::seqforge::cuda::Cooperative<decltype(&__VA_ARGS__)> {       \
    &__VA_ARGS__, grid, block, shared, stream                   \
  }
#define SF_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
// The arguments take the kernel's parameter types (cudaLaunchCooperativeKernel reads each at the
// size of its parameter: an int passed for an int64_t would be misread).
template <typename Kernel>
struct Cooperative;
template <typename... Params>
struct Cooperative<void (*)(Params...)> {
  void (*kernel)(Params...);
  unsigned grid, block;
  size_t shared;
  cudaStream_t stream;
  void operator()(Params... args) const {
    void* pointers[] = {&args...};
    cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid), dim3(block),
                                pointers, shared, stream);
  }
};
#endif

#define SF_GRID_STRIDE(i, n)                                                \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// f32 -> bf16 as the host's to_bf16: round to nearest even, a NaN stays a (quiet) NaN.
__device__ inline uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ inline float from_bf16_bits(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Element i of a half-precision copy (`low`: bf16 or f16, the operands of half GEMMs), rounded
// from f32 as the host's reference kernels round.
__device__ inline void store_low(void* p, DType low, int64_t i, float v) {
  if (low == DType::f16)
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  else
    static_cast<bf16*>(p)[i].bits = bf16_bits(v);
}
__device__ inline float load_low(const void* p, DType low, int64_t i) {
  if (low == DType::f16) return __half2float(static_cast<const __half*>(p)[i]);
  return from_bf16_bits(static_cast<const bf16*>(p)[i].bits);
}

// a * b rounded on its own: nvcc fuses a * b + c into one FMA, which would make a product that a
// sum already saw rounded differ from its use beside that sum (LN's dy - mean(dy) must cancel).
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// The first pass of the two-pass column sums (layer and RMS norm parameters, DoRA, the
// activations' scales): blocks stride over (band of rows, column tile) pairs of `chunks` bands
// (layer_norm_partial_chunks), a thread per column; f(chunk, j, r0, r1) for column j < C and its
// band's rows [r0, r1).
template <class F>
__device__ inline void for_band_columns(int64_t rows, int64_t C, int64_t chunks, F&& f) {
  const int64_t tiles = (C + blockDim.x - 1) / blockDim.x;
  const int64_t band = (rows + chunks - 1) / chunks;
  for (int64_t t = blockIdx.x; t < chunks * tiles; t += gridDim.x) {
    const int64_t chunk = t / tiles, j = t % tiles * blockDim.x + threadIdx.x;
    if (j >= C) continue;
    f(chunk, j, chunk * band, chunk * band + band < rows ? chunk * band + band : rows);
  }
}

// The second pass: out(C) = (or, with `add`, +=) the bands' sums of partial (chunks, C), added
// in band order.
template <typename T>
__global__ void column_sums_final_kernel(T* out, const double* partial, int64_t C, int64_t chunks,
                                         bool add) {
  SF_GRID_STRIDE(j, C) {
    double sum = 0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * C + j];
    out[j] = add ? out[j] + static_cast<T>(sum) : static_cast<T>(sum);
  }
}

// An activation's input mapped per column (Backend's ColumnMap): x * scale[j] + bias[j], rounded
// in T as scale_columns rounds it; scale or bias null: left out.
template <typename T>
__device__ inline T column_mapped(T x, const T* scale, const T* bias, int64_t j) {
  if (scale) x = mul_rn(x, scale[j]);
  if (bias) x = x + bias[j];
  return x;
}

// Records a bad input found by a kernel (a token id, a target class out of range) as the CPU
// reports it (launch.hpp's kReport*): the launch's lowest index, by atomicMin, until the launch's
// resolve_bad_kernel, run after it, marks it resolved and adds its value, the op's bound and kind.
// A later launch's finds leave a resolved report as it is.
__device__ inline void report_bad(unsigned long long* report, int64_t index) {
  const unsigned long long r = report[kReportIndex];
  if (r == ~0ull || !(r & kResolvedReport))
    atomicMin(report + kReportIndex, static_cast<unsigned long long>(index));
}
template <typename I>
__global__ void resolve_bad_kernel(unsigned long long* report, const I* values, int64_t bound,
                                   uint64_t kind) {
  const unsigned long long r = report[kReportIndex];
  if (r == ~0ull || (r & kResolvedReport)) return;
  report[kReportValue] = static_cast<unsigned long long>(static_cast<int64_t>(values[r]));
  report[kReportBound] = static_cast<unsigned long long>(bound);
  report[kReportKind] = kind;
  report[kReportIndex] = r | kResolvedReport;
}

// The block's sums of a and b, returned to every thread.
__device__ inline double2 block_sum2(double a, double b) {
  __shared__ double2 partial[kThreads];
  __syncthreads();  // a previous call's readers are done
  partial[threadIdx.x] = make_double2(a, b);
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      partial[threadIdx.x].x += partial[threadIdx.x + half].x;
      partial[threadIdx.x].y += partial[threadIdx.x + half].y;
    }
    __syncthreads();
  }
  return partial[0];
}

// Deterministic sums over a grid: each block writes its sum to partials[blockIdx.x] (grids of at
// most kPartialBlocks blocks), block 0 the grid's size after them, and sum_partials_kernel adds
// them up in a fixed order, so that a run repeats bit for bit (atomics would add in whatever order
// the blocks finish). Every thread of a block calls block_partial once.
__device__ inline void block_partial(double* partials, double v) {
  const double total = block_sum2(v, 0).x;
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = total;
    if (blockIdx.x == 0) partials[kPartialBlocks] = gridDim.x;
  }
}
// *out = the sum of the partials (plus *out with `accumulate`); one block.
template <typename T = double>
__global__ void sum_partials_kernel(T* out, const T* partials, bool accumulate) {
  const unsigned count = static_cast<unsigned>(partials[kPartialBlocks]);
  T v = 0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) v += partials[i];
  const T total = block_sum2(v, 0).x;
  if (threadIdx.x == 0) *out = accumulate ? *out + total : total;
}
inline unsigned partial_blocks(int64_t n) {
  const unsigned b = blocks_for(n);
  return b < kPartialBlocks ? b : kPartialBlocks;
}

// Element access by dtype for conversions: load as double, store rounding once.
template <typename T>
struct Element;
template <>
struct Element<float> {
  __device__ static double load(const float* p) { return *p; }
  __device__ static void store(float* p, double v) { *p = static_cast<float>(v); }
};
template <>
struct Element<double> {
  __device__ static double load(const double* p) { return *p; }
  __device__ static void store(double* p, double v) { *p = v; }
};
template <>
struct Element<bf16> {
  __device__ static double load(const bf16* p) { return from_bf16_bits(p->bits); }
  // Through f32 first, as the host rounds f64 -> f32 -> bf16.
  __device__ static void store(bf16* p, double v) { p->bits = bf16_bits(static_cast<float>(v)); }
};
template <>
struct Element<__half> {
  __device__ static double load(const __half* p) { return __half2float(*p); }
  __device__ static void store(__half* p, double v) { *p = __float2half_rn(static_cast<float>(v)); }
};

// Calls fn.template operator()<T>() for f32 or f64.
template <typename Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn.template operator()<float>();
    case DType::f64:
      return fn.template operator()<double>();
    default:
      fail("cuda: unsupported dtype ", dtype_name(dtype), " (expected f32 or f64)");
  }
}

// For conversions: f32, f64, bf16 or f16.
template <typename Fn>
void dispatch_storage(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::bf16:
      return fn.template operator()<bf16>();
    case DType::f16:
      return fn.template operator()<__half>();
    default:
      return dispatch_float(dtype, fn);
  }
}

}  // namespace seqforge::cuda
