#pragma once
// f32 GEMMs through the cblas_sgemm of a BLAS library loaded on first use: OpenBLAS and BLIS,
// Debian's OpenMP builds (the runtime oneDNN and the kernels use, so no second pool competes for
// the cores). Under SEQFORGE_MAX_ISA OpenBLAS's kernels are capped through OPENBLAS_CORETYPE,
// read when it loads; BLIS has no such switch, so it is left out where its kernels exceed the cap.
#include <atomic>
#include <string>

#include "seqforge/backend/ops.hpp"

namespace seqforge::cpu {

enum class BlasLibrary { openblas, blis };

class BlasGemm {
 public:
  // The loaded library, or nullptr when it cannot be (see blas_status()).
  static const BlasGemm* get(BlasLibrary library);
  // Whether cblas_sgemm takes the shape (its sizes are 32-bit).
  static bool fits(const GemmShape& s);
  // Whether it may run on this thread now. BLIS's thread count is one global setting, so it runs
  // only outside a parallel region, with all of OpenMP's threads; OpenBLAS runs anywhere (one
  // thread inside a parallel region).
  bool runs_here() const;
  // C = alpha A B + beta C (+ bias broadcast over rows).
  void run(const GemmShape& s, const float* a, const float* b, float* c, const float* bias) const;
  std::string description() const;  // "OpenBLAS 0.3.21 (OpenMP), Zen kernels"

 private:
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
  using SetThreads = void (*)(long);
  Sgemm sgemm_ = nullptr;
  SetThreads set_threads_ = nullptr;  // BLIS's bli_thread_set_num_threads
  mutable std::atomic<int> threads_set_{0};
  std::string description_;
  friend const BlasGemm* load_openblas(std::string* why_not);
  friend const BlasGemm* load_blis(std::string* why_not);
};

const char* blas_name(BlasLibrary library);  // "OpenBLAS", "BLIS"
// "OpenBLAS 0.3.21 (OpenMP), Zen kernels", or why it is not used ("not loaded: ...").
std::string blas_status(BlasLibrary library);

}  // namespace seqforge::cpu
