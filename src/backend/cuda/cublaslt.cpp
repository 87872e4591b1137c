#include "backend/cuda/cublaslt.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>

#include "seqforge/core/error.hpp"

namespace seqforge::cuda {

ColumnMajorGemm column_major(const GemmShape& s) {
  ColumnMajorGemm g;
  g.m = static_cast<uint64_t>(s.n);
  g.n = static_cast<uint64_t>(s.m);
  g.k = static_cast<uint64_t>(s.k);
  // B stored (k, n) row-major is (n, k) column-major: op(B)^T as it is; stored (n, k) when
  // transposed, viewed (k, n): transposed back.
  g.trans_first = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.first_rows = s.trans_b ? g.k : g.m;
  g.first_cols = s.trans_b ? g.m : g.k;
  g.ld_first = s.ldb;
  // A stored (m, k) row-major is (k, m) column-major: op(A)^T as it is.
  g.trans_second = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.second_rows = s.trans_a ? g.n : g.k;
  g.second_cols = s.trans_a ? g.k : g.n;
  g.ld_second = s.lda;
  g.ld_c = s.ldc;
  return g;
}

// The entry points used, resolved from the loaded library.
struct CublasLt::Api {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetVersion) get_version;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
};

namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuda: cuBLASLt ", what, " failed (cublasStatus_t ", static_cast<int>(status), ")");
}

}  // namespace

CublasLt::CublasLt() {
  // The major version the header describes, and no other: its structures may differ.
  const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  library_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library_)
    fail("cuda: cannot load cuBLASLt (", name, "): ", dlerror(),
         "; install the CUDA toolkit's cuBLAS or add its directory to LD_LIBRARY_PATH");
  api_ = new Api;
  auto resolve = [&](auto* slot, const char* symbol) {
    void* p = dlsym(library_, symbol);
    if (!p) fail("cuda: cuBLASLt has no ", symbol);
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(p);
  };
  resolve(&api_->create, "cublasLtCreate");
  resolve(&api_->destroy, "cublasLtDestroy");
  resolve(&api_->get_version, "cublasLtGetVersion");
  resolve(&api_->desc_create, "cublasLtMatmulDescCreate");
  resolve(&api_->desc_destroy, "cublasLtMatmulDescDestroy");
  resolve(&api_->desc_set, "cublasLtMatmulDescSetAttribute");
  resolve(&api_->layout_create, "cublasLtMatrixLayoutCreate");
  resolve(&api_->layout_destroy, "cublasLtMatrixLayoutDestroy");
  resolve(&api_->matmul, "cublasLtMatmul");
  resolve(&api_->preference_create, "cublasLtMatmulPreferenceCreate");
  resolve(&api_->preference_destroy, "cublasLtMatmulPreferenceDestroy");
  resolve(&api_->preference_set, "cublasLtMatmulPreferenceSetAttribute");
  resolve(&api_->heuristic, "cublasLtMatmulAlgoGetHeuristic");
  if (api_->get_version() / 10000 != CUBLAS_VER_MAJOR)
    fail("cuda: ", name, " is cuBLASLt ", api_->get_version(), ", not version ", CUBLAS_VER_MAJOR,
         ".x");
  check(api_->create(&handle_), "create");
  workspace_bytes_ = size_t{32} << 20;
  if (cudaMalloc(&workspace_, workspace_bytes_) != cudaSuccess)
    fail("cuda: out of device memory for cuBLASLt's ", workspace_bytes_ >> 20, " MB workspace");
}

CublasLt::~CublasLt() {
  if (workspace_) cudaFree(workspace_);
  if (handle_) api_->destroy(handle_);
  delete api_;
  if (library_) dlclose(library_);
}

std::string library_version(const std::string& file, const char* symbol, size_t per_major,
                            size_t per_minor) {
  void* library = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) return "not found (" + file + ")";
  std::string out = "in " + file + ", no " + symbol;
  if (void* p = dlsym(library, symbol)) {
    const size_t v = reinterpret_cast<size_t (*)()>(p)();
    out = std::to_string(v / per_major) + "." + std::to_string(v / per_minor % 100) + "." +
          std::to_string(v % per_minor);
  }
  dlclose(library);
  return out;
}

std::string CublasLt::version() const {
  const size_t v = api_->get_version();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

bool CublasLt::gemm(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
                    const void* bias, bool tf32, cudaStream_t stream, void* workspace) {
  if (s.m == 0 || s.n == 0) return true;
  const ColumnMajorGemm g = column_major(s);
  cudaDataType_t operand = CUDA_R_32F, out = CUDA_R_32F, scale = CUDA_R_32F;
  cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (dtype == DType::f64) {
    operand = out = scale = CUDA_R_64F;
    compute = CUBLAS_COMPUTE_64F;
  } else if (dtype == DType::bf16 || dtype == DType::f16) {
    operand = dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
    compute = CUBLAS_COMPUTE_32F;
  } else if (dtype != DType::f32) {
    fail("cuda: no GEMM in ", dtype_name(dtype));
  }
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, result = nullptr;
  check(api_->desc_create(&desc, compute, scale), "matmul descriptor");
  auto set = [&](cublasLtMatmulDescAttributes_t attribute, const void* value, size_t bytes) {
    check(api_->desc_set(desc, attribute, value, bytes), "matmul attribute");
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &g.trans_first, sizeof g.trans_first);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &g.trans_second, sizeof g.trans_second);
  if (bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &out, sizeof out);
  }
  check(api_->layout_create(&first, operand, g.first_rows, g.first_cols, g.ld_first), "layout");
  check(api_->layout_create(&second, operand, g.second_rows, g.second_cols, g.ld_second), "layout");
  check(api_->layout_create(&result, out, g.m, g.n, g.ld_c), "layout");
  const float alpha32 = static_cast<float>(s.alpha), beta32 = static_cast<float>(s.beta);
  const void* alpha = dtype == DType::f64 ? static_cast<const void*>(&s.alpha) : &alpha32;
  const void* beta = dtype == DType::f64 ? static_cast<const void*>(&s.beta) : &beta32;
  // The algorithm for this shape and these operands' and bias's alignments (an operand that
  // starts inside a row, one direction of a (T, B, 2H) output say, may be only 4 bytes aligned),
  // chosen once.
  auto alignment = [](const void* p) {
    const uintptr_t u = reinterpret_cast<uintptr_t>(p);
    return static_cast<uint32_t>(std::min<uintptr_t>(256, u & (~u + 1)));
  };
  const AlgoKey key{s.trans_a,    s.trans_b,    s.m,
                    s.n,          s.k,          s.lda,
                    s.ldb,        s.ldc,        static_cast<int>(dtype),
                    tf32,         s.beta != 0,  alignment(a),
                    alignment(b), alignment(c), bias ? alignment(bias) : 0u};
  auto found = algos_.find(key);
  if (found == algos_.end()) {
    cublasLtMatmulPreference_t preference = nullptr;
    check(api_->preference_create(&preference), "matmul preference");
    auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const void* value,
                      size_t bytes) {
      check(api_->preference_set(preference, attribute, value, bytes), "matmul preference");
    };
    const uint64_t workspace = workspace_bytes_;
    prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
    const uint32_t align_a = alignment(b), align_b = alignment(a), align_c = alignment(c);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c);
    cublasLtMatmulHeuristicResult_t best{};
    int returned = 0;
    const cublasStatus_t found_status = api_->heuristic(handle_, desc, first, second, result,
                                                        result, preference, 1, &best, &returned);
    api_->preference_destroy(preference);
    if (found_status != CUBLAS_STATUS_SUCCESS && found_status != CUBLAS_STATUS_NOT_SUPPORTED) {
      api_->layout_destroy(result);
      api_->layout_destroy(second);
      api_->layout_destroy(first);
      api_->desc_destroy(desc);
      fail("cuda: gemm (", s.m, " x ", s.n, " x ", s.k, ", ", dtype_name(dtype),
           "): cuBLASLt's algorithm search failed (cublasStatus_t ", static_cast<int>(found_status),
           ")");
    }
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (found_status == CUBLAS_STATUS_SUCCESS && returned > 0) algo = best.algo;
    found = algos_.emplace(key, algo).first;
  }
  const cublasStatus_t status =
      found->second ? api_->matmul(handle_, desc, alpha, b, first, a, second, beta, c, result, c,
                                   result, &*found->second, workspace ? workspace : workspace_,
                                   workspace_bytes_, stream)
                    : CUBLAS_STATUS_SUCCESS;
  api_->layout_destroy(result);
  api_->layout_destroy(second);
  api_->layout_destroy(first);
  api_->desc_destroy(desc);
  if (!found->second) return false;
  if (status == CUBLAS_STATUS_NOT_SUPPORTED && bias) {  // the caller adds the bias after
    found->second.reset();
    return false;
  }
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuda: gemm (", s.m, " x ", s.n, " x ", s.k, ", ", dtype_name(dtype),
         s.trans_a ? ", A transposed" : "", s.trans_b ? ", B transposed" : "", bias ? ", bias" : "",
         ") failed in cuBLASLt (cublasStatus_t ", static_cast<int>(status), ")");
  return true;
}

}  // namespace seqforge::cuda
