#pragma once
// cuBLASLt, loaded at run time (dlopen) so that a binary built with the CUDA backend starts on a
// machine without the CUDA libraries. GEMMs of the backend's row-major convention map onto its
// column-major API here.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "seqforge/backend/ops.hpp"
#include "seqforge/core/dtype.hpp"

namespace seqforge::cuda {

// The row-major GEMM C(m, n) = op(A) op(B) as cuBLASLt's column-major C^T(n, m) = op(B)^T op(A)^T:
// B's memory is the first operand and A's the second, each transposed when the row-major one
// is, with (rows, cols) its column-major view of the stored matrix.
struct ColumnMajorGemm {
  cublasOperation_t trans_first, trans_second;
  uint64_t m, n, k;  // of C^T: n, m and k of the row-major GEMM
  uint64_t first_rows, first_cols, second_rows, second_cols;
  int64_t ld_first, ld_second, ld_c;
};
ColumnMajorGemm column_major(const GemmShape& s);

// A library's version from its get-version function (cuBLASLt: 130001 is 13.0.1, per_major
// 10000, per_minor 100), loaded and unloaded here, or "not found (FILE)".
std::string library_version(const std::string& file, const char* symbol, size_t per_major,
                            size_t per_minor);

class CublasLt {
 public:
  // Loads the library and makes a handle; throws a one-line error naming what is missing.
  CublasLt();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  // C = alpha op(A) op(B) + beta C (+ bias(n) per row), row-major as GemmShape. dtype: f32, f64,
  // or bf16 operands with f32 C and bias. `tf32`: f32 products on tensor cores (PyTorch's
  // matmul precision "high"). False, with nothing enqueued, where cuBLASLt offers no algorithm
  // for the call (operands aligned to less than its kernels need, an epilogue it lacks).
  // `workspace`: workspace_bytes() of device memory for it, where the stream is not the only
  // one that runs GEMMs (else the handle's own).
  bool gemm(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
            const void* bias, bool tf32, cudaStream_t stream, void* workspace = nullptr);
  size_t workspace_bytes() const { return workspace_bytes_; }
  std::string version() const;

 private:
  // What the choice of algorithm depends on.
  // The shape, transposes, leading dimensions, dtype, TF32, beta != 0 and the alignments of A,
  // B, C and the bias (0: none).
  using AlgoKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                             bool, bool, uint32_t, uint32_t, uint32_t, uint32_t>;
  struct Api;
  Api* api_ = nullptr;
  std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> algos_;  // none: no algorithm
  void* library_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace seqforge::cuda
