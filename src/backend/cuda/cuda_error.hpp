#pragma once
// A CUDA runtime call's error as the backend reports it: one line naming what failed.
#include <cuda_runtime_api.h>

#include <string>

#include "seqforge/core/error.hpp"

namespace seqforge::cuda {

inline void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    fail("cuda: ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

}  // namespace seqforge::cuda
