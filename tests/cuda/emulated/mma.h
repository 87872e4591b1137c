#pragma once
// The host emulation's warp matrix functions (nvcuda::wmma) for 16x16x16 tiles of bf16 or fp16
// operands and f32 accumulators. On a GPU a fragment is spread over a warp's 32 threads in a layout
// the program may not rely on; here every thread holds the whole tile and does the whole operation
// (an emulated block is at most one warp), and only the warp's first thread stores, so that a
// load, multiply-add and store of an accumulator in shared memory happens once, as the warp's one
// collective operation does. The GPU's requirements are checked, so that code which breaks them
// fails here: pointers 32-byte aligned, leading dimensions a multiple of 8 elements (bf16, fp16)
// or 4 (f32).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16x16x16 tiles only");
  static constexpr int num_elements = 256;
  T x[256];  // element (r, c) at x[r * 16 + c]
};

namespace detail {
inline void check(const void* p, unsigned ldm, unsigned multiple, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || ldm % multiple != 0) {
    std::fprintf(stderr,
                 "emulated wmma: %s at %p with ldm %u: needs 32-byte alignment and ldm a "
                 "multiple of %u\n",
                 what, p, ldm, multiple);
    std::abort();
  }
}
inline float value(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float value(__half v) { return __half2float(v); }
inline float value(float v) { return v; }
}  // namespace detail

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T v) {
  for (T& e : f.x) e = v;
}
template <typename T>
void fill_fragment(fragment<accumulator, 16, 16, 16, T>& f, T v) {
  for (T& e : f.x) e = v;
}

// Operands: element (r, c) of the tile at p[r * ldm + c] (row_major) or p[c * ldm + r].
template <typename Use, typename T>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, row_major>& f, const T* p, unsigned ldm) {
  static_assert(sizeof(T) == 2, "operands are bf16 or fp16");
  detail::check(p, ldm, 8, "load_matrix_sync");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = p[r * ldm + c];
}
template <typename Use, typename T>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, col_major>& f, const T* p, unsigned ldm) {
  static_assert(sizeof(T) == 2, "operands are bf16 or fp16");
  detail::check(p, ldm, 8, "load_matrix_sync");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = p[c * ldm + r];
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  detail::check(p, ldm, 4, "load_matrix_sync");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  detail::check(p, ldm, 4, "store_matrix_sync");
  if (threadIdx.x % 32 != 0) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}

// d = a b + c, products of the bf16 or fp16 operands summed in f32.
template <typename T, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float acc = c.x[r * 16 + n];
      for (int k = 0; k < 16; ++k)
        acc += detail::value(a.x[r * 16 + k]) * detail::value(b.x[k * 16 + n]);
      out[r * 16 + n] = acc;
    }
  for (int i = 0; i < 256; ++i) d.x[i] = out[i];
}

}  // namespace nvcuda::wmma
