#include "backend/cpu/blas_gemm.hpp"

#include <dlfcn.h>
#include <omp.h>
#include <sys/resource.h>

#include <climits>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string_view>

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

// The core types OpenBLAS falls back to on a CPU model it does not know: generic SSE kernels.
bool generic_openblas_core(std::string_view core) {
  for (std::string_view generic : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                   "Katmai", "Coppermine", "Northwood", "Banias"})
    if (core == generic) return true;
  return false;
}
// Why an address space or data segment limited below 4 GiB (ulimit -v, ulimit -d: both bound
// what mmap maps) keeps OpenBLAS out, or "": its allocator spins for good, waiting for buffers the
// limit never lets it map (a run of 27 MB hung under 600 MB), where oneDNN fails or copes.
std::string address_space_limited() {
  for (const auto& [resource, flag] : {std::pair{RLIMIT_AS, "-v"}, std::pair{RLIMIT_DATA, "-d"}}) {
    struct rlimit limit {};
    if (getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
        limit.rlim_cur >= (rlim_t{4} << 30))
      continue;
    return "not loaded: memory is limited to " + std::to_string(limit.rlim_cur >> 20) +
           " MB (ulimit " + flag +
           "), where its allocator waits for good for buffers it cannot map";
  }
  return "";
}
}  // namespace

const BlasGemm* load_openblas(std::string* why_not) {
#ifdef SEQFORGE_OPENBLAS_PATH
  const char* path = SEQFORGE_OPENBLAS_PATH;
  if (std::string limited = address_space_limited(); !limited.empty()) {
    *why_not = std::move(limited);
    return nullptr;
  }
  // Set before the library loads, and only where the user has not chosen a core type.
  const bool chosen = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  if (const std::optional<IsaTier> cap = isa_cap(); cap && !chosen)
    if (const char* core = openblas_core_type(std::min(*cap, machine_isa_tier())))
      setenv("OPENBLAS_CORETYPE", core, 0);
  using Name = char* (*)();
  using Parallel = int (*)();
  void* lib = nullptr;
  auto blas = std::make_unique<BlasGemm>();  // kept for the process's lifetime, as the library is
  Name config = nullptr, core = nullptr;
  Parallel parallel = nullptr;
  auto open = [&] {
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    blas->sgemm_ = reinterpret_cast<BlasGemm::Sgemm>(dlsym(lib, "cblas_sgemm"));
    config = reinterpret_cast<Name>(dlsym(lib, "openblas_get_config"));
    core = reinterpret_cast<Name>(dlsym(lib, "openblas_get_corename"));
    parallel = reinterpret_cast<Parallel>(dlsym(lib, "openblas_get_parallel"));
    return true;
  };
  if (!open()) {
    *why_not = std::string("not loaded: ") + dlerror();
    return nullptr;
  }
  if (!blas->sgemm_ || !config || !core || !parallel) {
    *why_not = std::string(path) + " lacks cblas_sgemm or OpenBLAS's own functions";
    return nullptr;
  }
  // A CPU model newer than the library (a Xeon of 2023 for 0.3.21) gets its generic SSE kernels,
  // several times slower than those the CPU runs: loaded again on the best of those, unless the
  // user chose a core type.
  const IsaTier tier = std::min(isa_tier(), IsaTier::avx512_bf16);
  if (!chosen && tier >= IsaTier::avx2 && generic_openblas_core(core())) {
    dlclose(lib);
    setenv("OPENBLAS_CORETYPE", openblas_core_type(tier), 0);
    if (!open() || !blas->sgemm_ || !config || !core || !parallel) {
      *why_not = std::string(path) +
                 " did not load again with OPENBLAS_CORETYPE=" + openblas_core_type(tier);
      return nullptr;
    }
  }
  if (parallel() != 2) {  // 1: its own pthreads pool, which would compete with OpenMP's
    *why_not = std::string(path) + " is not OpenBLAS's OpenMP build";
    return nullptr;
  }
  // Its config starts "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": keep the name and version.
  std::string version = config();
  version = version.substr(0, version.find(' ', version.find(' ') + 1));
  blas->description_ = version + " (OpenMP), " + core() + " kernels";
  return blas.release();
#else
  *why_not = "not built with OpenBLAS (Debian's libopenblas-openmp-dev was not found)";
  return nullptr;
#endif
}

#ifdef SEQFORGE_BLIS_PATH
namespace {
// The tier a BLIS configuration's kernels need ("zen3" -> avx2); none for one not known here.
std::optional<IsaTier> blis_config_tier(std::string_view config) {
  for (std::string_view c : {"skx", "knl", "knc"})
    if (config == c) return IsaTier::avx512;
  for (std::string_view c : {"haswell", "zen", "zen2", "zen3"})
    if (config == c) return IsaTier::avx2;
  for (std::string_view c :
       {"sandybridge", "penryn", "bulldozer", "piledriver", "steamroller", "excavator", "generic"})
    if (config == c) return IsaTier::baseline;
  return std::nullopt;
}
}  // namespace
#endif

const BlasGemm* load_blis(std::string* why_not) {
#ifdef SEQFORGE_BLIS_PATH
  const char* path = SEQFORGE_BLIS_PATH;
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    *why_not = std::string("not loaded: ") + dlerror();
    return nullptr;
  }
  auto blas = std::make_unique<BlasGemm>();  // kept for the process's lifetime, as the library is
  blas->sgemm_ = reinterpret_cast<BlasGemm::Sgemm>(dlsym(lib, "cblas_sgemm"));
  blas->set_threads_ =
      reinterpret_cast<BlasGemm::SetThreads>(dlsym(lib, "bli_thread_set_num_threads"));
  using Version = const char* (*)();
  const auto version = reinterpret_cast<Version>(dlsym(lib, "bli_info_get_version_str"));
  using Flag = long (*)();
  const auto openmp = reinterpret_cast<Flag>(dlsym(lib, "bli_info_get_enable_openmp"));
  using ArchId = int (*)();
  const auto arch_id = reinterpret_cast<ArchId>(dlsym(lib, "bli_arch_query_id"));
  using ArchName = const char* (*)(int);
  const auto arch_name = reinterpret_cast<ArchName>(dlsym(lib, "bli_arch_string"));
  if (!blas->sgemm_ || !blas->set_threads_ || !version || !openmp || !arch_id || !arch_name) {
    *why_not = std::string(path) + " lacks cblas_sgemm or BLIS's own functions";
    return nullptr;
  }
  if (!openmp()) {  // its own pthreads, or none: would compete with OpenMP's pool, or idle
    *why_not = std::string(path) + " is not BLIS's OpenMP build";
    return nullptr;
  }
  const std::string config = arch_name(arch_id());
  if (const std::optional<IsaTier> cap = isa_cap(); cap && *cap < machine_isa_tier()) {
    const std::optional<IsaTier> needs = blis_config_tier(config);
    if (!needs || *needs > *cap) {
      *why_not = "not used under SEQFORGE_MAX_ISA=" + std::string(isa_tier_name(*cap)) + ": its " +
                 config + " kernels" +
                 (needs ? std::string(" need ") + isa_tier_name(*needs) : " are not known here");
      return nullptr;
    }
  }
  blas->description_ = std::string("BLIS ") + version() + " (OpenMP), " + config + " kernels";
  return blas.release();
#elif defined(SEQFORGE_BLIS_LEFT_OUT)
  *why_not = "left out of the sanitizer build (LeakSanitizer faults on its threads' storage)";
  return nullptr;
#else
  *why_not = "not built with BLIS (Debian's libblis4-openmp was not found)";
  return nullptr;
#endif
}

const char* blas_name(BlasLibrary library) {
  return library == BlasLibrary::blis ? "BLIS" : "OpenBLAS";
}

namespace {
struct Loaded {
  const BlasGemm* blas = nullptr;
  std::string why_not;
};
const Loaded& loaded(BlasLibrary library) {
  static const Loaded openblas = [] {
    Loaded out;
    out.blas = load_openblas(&out.why_not);
    return out;
  }();
  static const Loaded blis = [] {
    Loaded out;
    out.blas = load_blis(&out.why_not);
    return out;
  }();
  return library == BlasLibrary::blis ? blis : openblas;
}
}  // namespace

const BlasGemm* BlasGemm::get(BlasLibrary library) { return loaded(library).blas; }

std::string blas_status(BlasLibrary library) {
  const Loaded& l = loaded(library);
  return l.blas ? l.blas->description() : l.why_not;
}

bool BlasGemm::fits(const GemmShape& s) {
  for (int64_t v : {s.m, s.n, s.k, s.lda, s.ldb, s.ldc})
    if (v > INT_MAX) return false;
  return s.m > 0 && s.n > 0 && s.k > 0;
}

bool BlasGemm::runs_here() const { return !set_threads_ || !omp_in_parallel(); }

void BlasGemm::run(const GemmShape& s, const float* a, const float* b, float* c,
                   const float* bias) const {
  if (set_threads_) {
    // Set where OpenMP's count has changed since (by the run's thread configuration).
    const int threads = omp_get_max_threads();
    if (threads_set_.exchange(threads) != threads) set_threads_(threads);
  }
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

std::string BlasGemm::description() const { return description_; }

}  // namespace seqforge::cpu
