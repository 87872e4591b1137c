#pragma once
// SF_HOST_DEVICE marks small functions that both the host code and the CUDA kernels call.
#ifdef __CUDACC__
#define SF_HOST_DEVICE __host__ __device__
#else
#define SF_HOST_DEVICE
#endif
