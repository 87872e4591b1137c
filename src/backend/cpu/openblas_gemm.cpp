#include "backend/cpu/openblas_gemm.hpp"

#include <dlfcn.h>
#include <omp.h>

#include <climits>
#include <cstdlib>
#include <mutex>

#include "seqforge/core/cpu.hpp"

namespace seqforge::cpu {

namespace {
// CBLAS's enumerations (cblas.h).
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// OpenBLAS's name for the best core type of a tier, for OPENBLAS_CORETYPE.
const char* openblas_core_type(IsaTier tier) {
  switch (tier) {
    case IsaTier::baseline:
      return "Nehalem";
    case IsaTier::avx2:
      return "Haswell";
    case IsaTier::avx512:
    case IsaTier::avx512_bf16:
      return "SkylakeX";
    case IsaTier::amx:
      break;
  }
  return nullptr;
}
}  // namespace

const OpenBlasGemm* load_openblas(std::string* why_not) {
#ifdef SEQFORGE_OPENBLAS_PATH
  const char* path = SEQFORGE_OPENBLAS_PATH;
  // Set before the library loads, and only where the user has not chosen a core type.
  if (const std::optional<IsaTier> cap = isa_cap(); cap && !std::getenv("OPENBLAS_CORETYPE"))
    if (const char* core = openblas_core_type(std::min(*cap, machine_isa_tier())))
      setenv("OPENBLAS_CORETYPE", core, 0);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    *why_not = std::string("not loaded: ") + dlerror();
    return nullptr;
  }
  auto* blas = new OpenBlasGemm;  // kept for the process's lifetime, as the library is
  blas->sgemm_ = reinterpret_cast<OpenBlasGemm::Sgemm>(dlsym(lib, "cblas_sgemm"));
  using Name = char* (*)();
  const auto config = reinterpret_cast<Name>(dlsym(lib, "openblas_get_config"));
  const auto core = reinterpret_cast<Name>(dlsym(lib, "openblas_get_corename"));
  using Parallel = int (*)();
  const auto parallel = reinterpret_cast<Parallel>(dlsym(lib, "openblas_get_parallel"));
  if (!blas->sgemm_ || !config || !core || !parallel) {
    *why_not = std::string(path) + " lacks cblas_sgemm or OpenBLAS's own functions";
    return nullptr;
  }
  if (parallel() != 2) {  // 1: its own pthreads pool, which would compete with OpenMP's
    *why_not = std::string(path) + " is not OpenBLAS's OpenMP build";
    return nullptr;
  }
  // Its config starts "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": keep the name and version.
  std::string version = config();
  version = version.substr(0, version.find(' ', version.find(' ') + 1));
  blas->description_ = version + " (OpenMP), " + core() + " kernels";
  return blas;
#else
  *why_not = "not built with OpenBLAS (Debian's libopenblas-openmp-dev was not found)";
  return nullptr;
#endif
}

namespace {
struct Loaded {
  const OpenBlasGemm* blas = nullptr;
  std::string why_not;
};
const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded out;
    out.blas = load_openblas(&out.why_not);
    return out;
  }();
  return l;
}
}  // namespace

const OpenBlasGemm* OpenBlasGemm::get() { return loaded().blas; }

std::string openblas_status() {
  return loaded().blas ? loaded().blas->description() : loaded().why_not;
}

bool OpenBlasGemm::fits(const GemmShape& s) {
  for (int64_t v : {s.m, s.n, s.k, s.lda, s.ldb, s.ldc})
    if (v > INT_MAX) return false;
  return s.m > 0 && s.n > 0 && s.k > 0;
}

void OpenBlasGemm::run(const GemmShape& s, const float* a, const float* b, float* c,
                       const float* bias) const {
  sgemm_(kRowMajor, s.trans_a ? kTrans : kNoTrans, s.trans_b ? kTrans : kNoTrans,
         static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k),
         static_cast<float>(s.alpha), a, static_cast<int>(s.lda), b, static_cast<int>(s.ldb),
         static_cast<float>(s.beta), c, static_cast<int>(s.ldc));
  if (!bias) return;
  const int threads = omp_in_parallel() || s.m * s.n < 65536 ? 1 : omp_get_max_threads();
#pragma omp parallel for num_threads(threads)
  for (int64_t i = 0; i < s.m; ++i) {
    float* row = c + i * s.ldc;
#pragma omp simd
    for (int64_t j = 0; j < s.n; ++j) row[j] += bias[j];
  }
}

std::string OpenBlasGemm::description() const { return description_; }

}  // namespace seqforge::cpu
