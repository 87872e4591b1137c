#pragma once
// What the launchers share: choosing a kernel's element or output type at run time, and
// asking for more than the default shared memory.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace seqforge::cuda {

// Calls fn.template operator()<E>() with an element type of `bytes` bytes (a plain copy).
template <typename Fn>
void dispatch_bytes(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 2:
      return fn.template operator()<uint16_t>();
    case 4:
      return fn.template operator()<uint32_t>();
    case 8:
      return fn.template operator()<uint64_t>();
    default:
      fail("cuda: no copy kernel for ", bytes, "-byte elements");
  }
}

// Calls fn.template operator()<Y>() with Y the storage of an output computed in T: T itself, or
// bf16 or f16 from f32 (a half GEMM's operand, written directly).
template <typename T, typename Fn>
void dispatch_output(DType y_type, const char* op, Fn&& fn) {
  if (y_type == dtype_of<T>()) return fn.template operator()<T>();
  if (std::is_same_v<T, float> && y_type == DType::bf16) return fn.template operator()<bf16>();
  if (std::is_same_v<T, float> && y_type == DType::f16) return fn.template operator()<__half>();
  fail("cuda: ", op, " into ", dtype_name(y_type), " from ", dtype_name(dtype_of<T>()));
}

// A kernel whose shared memory (its static arrays and `bytes` more) passes the default 48 KB
// asks for it; past what the GPU offers a block, the launch would fail: one line instead. The
// limit is only ever raised: a launch planned earlier (one in a captured graph) keeps its room.
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* what,
                  const char* narrower = "model.hidden") {
  cudaFuncAttributes attributes{};
  cudaFuncGetAttributes(&attributes, kernel);
  if (attributes.sharedSizeBytes + bytes <= (size_t{48} << 10)) return;
  if (bytes <= static_cast<size_t>(attributes.maxDynamicSharedSizeBytes)) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess) {
    cudaGetLastError();
    fail("cuda: ", what, " needs ", (attributes.sharedSizeBytes + bytes) >> 10,
         " KB of shared memory per block, more than this GPU offers; use a narrower ", narrower,
         " or train.device: cpu");
  }
}

}  // namespace seqforge::cuda
