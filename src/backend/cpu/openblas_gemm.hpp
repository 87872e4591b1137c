#pragma once
// f32 GEMMs through OpenBLAS's cblas_sgemm: Debian's OpenMP build (the runtime oneDNN and the
// kernels use, so no second pool competes for the cores), loaded on first use. Under
// SEQFORGE_MAX_ISA its kernels are capped through OPENBLAS_CORETYPE, read when it loads.
#include <string>

#include "seqforge/backend/ops.hpp"

namespace seqforge::cpu {

class OpenBlasGemm {
 public:
  // The loaded library, or nullptr when it cannot be (see openblas_status()).
  static const OpenBlasGemm* get();
  // Whether cblas_sgemm takes the shape (its sizes are 32-bit).
  static bool fits(const GemmShape& s);
  // C = alpha A B + beta C (+ bias broadcast over rows).
  void run(const GemmShape& s, const float* a, const float* b, float* c, const float* bias) const;
  std::string description() const;  // "OpenBLAS 0.3.21, Haswell kernels"

 private:
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
  Sgemm sgemm_ = nullptr;
  std::string description_;
  friend const OpenBlasGemm* load_openblas(std::string* why_not);
};

// "OpenBLAS 0.3.21, Haswell kernels", or why it is not used ("not found at ...").
std::string openblas_status();

}  // namespace seqforge::cpu
