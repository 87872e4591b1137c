// The host emulation's cuBLASLt (cublasLt.h): a shared library named libcublasLt.so.13, found by
// the CUDA backend's dlopen in the emulated tests. It computes cuBLASLt's column-major
// D = alpha op(A) op(B) + beta C (+ bias per row of D) on the host, in double, from f32, f64, bf16
// or f16 operands, and checks what the real one would refuse: layouts that do not match the
// operation, leading dimensions below the rows. SEQFORGE_EMULATED_CUBLASLT=no_epilogue offers no
// algorithm with a bias epilogue, `none` no algorithm at all (as the real one may for operands
// aligned to less than its kernels need).
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "cublasLt.h"
#include "device_open.h"
#include "seqforge/core/dtype.hpp"

struct cublasLtMatmulDescOpaque {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque {};

namespace {

double load(const void* p, cudaDataType_t type, size_t i) {
  if (type == CUDA_R_64F) return static_cast<const double*>(p)[i];
  if (type == CUDA_R_16BF) return seqforge::from_bf16(static_cast<const seqforge::bf16*>(p)[i]);
  if (type == CUDA_R_16F) return seqforge::from_f16(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

void store(void* p, cudaDataType_t type, size_t i, double v) {
  if (type == CUDA_R_64F)
    static_cast<double*>(p)[i] = v;
  else
    static_cast<float*>(p)[i] = static_cast<float>(v);
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(uintptr_t{1});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
size_t cublasLtGetVersion() { return 130000; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  *desc = new cublasLtMatmulDescOpaque{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attribute,
                                              const void* value, size_t bytes) {
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      std::memcpy(&desc->trans_a, value, bytes);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      std::memcpy(&desc->trans_b, value, bytes);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      std::memcpy(&desc->epilogue, value, bytes);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      std::memcpy(&desc->bias, value, bytes);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      std::memcpy(&desc->bias_type, value, bytes);
      break;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (ld < static_cast<int64_t>(rows)) return CUBLAS_STATUS_NOT_SUPPORTED;
  *layout = new cublasLtMatrixLayoutOpaque{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  *preference = new cublasLtMatmulPreferenceOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete preference;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned) {
  const char* offer = std::getenv("SEQFORGE_EMULATED_CUBLASLT");
  const std::string_view refuse = offer ? offer : "";
  if (refuse == "none" || (refuse == "no_epilogue" && desc->epilogue == CUBLASLT_EPILOGUE_BIAS)) {
    *returned = 0;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  *returned = requested > 0 ? 1 : 0;
  if (requested > 0) results[0] = {};
  return CUBLAS_STATUS_SUCCESS;
}
}  // extern "C"

// One matmul's operands and layouts, to run now or when a captured graph is launched.
struct Matmul {
  cublasLtMatmulDescOpaque desc;
  cublasLtMatrixLayoutOpaque la, lb, ld;
  const void *a, *b;
  void* d;
  double al, be;
  bool ta, tb;
  uint64_t m, n, k;
  void run() const {
    const DeviceOpen device;
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (uint64_t l = 0; l < k; ++l)
          acc += load(a, la.type, ta ? l + i * la.ld : i + l * la.ld) *
                 load(b, lb.type, tb ? j + l * lb.ld : l + j * lb.ld);
        const size_t at = i + j * ld.ld;
        double v = al * acc + (be != 0 ? be * load(d, ld.type, at) : 0.0);
        if (desc.epilogue == CUBLASLT_EPILOGUE_BIAS) v += load(desc.bias, desc.bias_type, i);
        store(d, ld.type, at, v);
      }
  }
};

extern "C" {

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t la, const void* b,
                              cublasLtMatrixLayout_t lb, const void* beta, const void* c,
                              cublasLtMatrixLayout_t lc, void* d, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t,
                              cudaStream_t stream) {
  if (!algo || c != d || lc->rows != ld->rows || lc->cols != ld->cols)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const uint64_t m = ld->rows, n = ld->cols, k = ta ? la->rows : la->cols;
  if ((ta ? la->cols : la->rows) != m || (tb ? lb->cols : lb->rows) != k ||
      (tb ? lb->rows : lb->cols) != n)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // The scalars are read now, the descriptors copied: a captured matmul replays as it was asked.
  const bool f64 = desc->scale == CUDA_R_64F;
  const double al = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double be = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  auto* work = new Matmul{*desc, *la, *lb, *ld, a, b, d, al, be, ta, tb, m, n, k};
  using Enqueue = void (*)(cudaStream_t, void*, void (*)(void*), void (*)(void*));
  static const Enqueue enqueue = reinterpret_cast<Enqueue>(dlsym(RTLD_DEFAULT, "sf_emu_enqueue"));
  auto run = [](void* w) { static_cast<Matmul*>(w)->run(); };
  auto drop = [](void* w) { delete static_cast<Matmul*>(w); };
  if (enqueue) {
    enqueue(stream, work, run, drop);
  } else {  // no emulated runtime in the process: at once
    run(work);
    drop(work);
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
