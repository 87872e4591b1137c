#pragma once
// The CPU backend's GEMMs: a choice of provider per shape, like the recurrence schedules. For f32
// operands oneDNN, OpenBLAS and BLIS are timed on a shape's first use and the fastest is cached
// (the autotuning cache); which is fastest depends on the machine and the shape (OpenBLAS's and
// BLIS's AVX2 kernels beat oneDNN 2.6's on AVX2-only CPUs, BLIS most transformer shapes there;
// oneDNN's brgemm wins on AVX-512). A shape with a narrow side (a low-rank adapter's) also races
// the backend's own kernel for it, which streams the wide operand once, and so does a GEMM on a
// packed f32 B (the recurrent weights), on the own panels packed beside oneDNN's layout. bf16
// operands are oneDNN's, or the own narrow kernel's where it wins.
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "backend/cpu/onednn_gemm.hpp"
#include "seqforge/backend/backend.hpp"

namespace seqforge::cpu {

enum class GemmProvider { onednn, openblas, blis, own };
const char* provider_name(GemmProvider p);  // "onednn", "openblas", "blis", "seqforge"

// The backend's own kernel for one GEMM, writing C (alpha A B + beta C) at the given address.
using OwnGemm = std::function<void(float* c)>;

// The providers timed on one GEMM (C left as it was): the fastest of a few runs each, in rounds
// that run each in turn. OpenBLAS and BLIS run only f32 operands of the shapes they take (BLIS
// only outside a parallel region), the own kernel only where there is one; a provider that does
// not run has time infinity.
struct GemmRace {
  double onednn_ms = 0, openblas_ms = 0, blis_ms = 0, own_ms = 0;
  GemmProvider winner = GemmProvider::onednn;
};
GemmRace race_providers(OneDnnGemm& onednn, const GemmShape& s, DType operands, const void* a,
                        const void* b, const PackedB* packed, const float* c, const float* bias,
                        const OwnGemm* own = nullptr);

// oneDNN's f32 GEMM time over its bf16 one on a 512x1024x1024 product on one thread here: above
// 1, bf16 operands run faster. Timed on first use per machine and source tree, then cached.
double bf16_gemm_speedup();

// The own kernel's panel width in B packed by CpuGemm::pack, 0 where it holds no panels.
int64_t own_panel_width(const PackedB& packed);

class CpuGemm {
 public:
  void run(const GemmShape& s, DType operands, const void* a, const void* b, float* c,
           const float* bias, const OwnGemm* own = nullptr);
  // B packed for oneDNN's GEMMs and, f32 B of a plain A, for the own kernel (OpenBLAS or BLIS,
  // where one wins the shape, reads B as stored).
  void pack(const GemmShape& s, DType operands, const void* b, std::unique_ptr<PackedB>* packed);
  void run_packed(const GemmShape& s, DType operands, const void* a, const void* b,
                  const PackedB& packed, float* c, const float* bias);

 private:
  // The provider for `s` (timed on these operands on first use, C kept as it was); oneDNN
  // timed with `packed` B where the caller has it.
  GemmProvider provider(const GemmShape& s, DType operands, const void* a, const void* b,
                        const PackedB* packed, const float* c, const float* bias,
                        const OwnGemm* own);
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                         bool, bool, bool, int, DType, bool>;
  // provider()'s choice for a shape this thread has not just run, under mutex_: looked up,
  // read from the autotuning cache, or timed.
  GemmProvider choose(const Key& key, const GemmShape& s, DType operands, const void* a,
                      const void* b, const PackedB* packed, const float* c, const float* bias,
                      const OwnGemm* own);
  OneDnnGemm onednn_;
  std::mutex mutex_;
  std::map<Key, GemmProvider> chosen_;
};

}  // namespace seqforge::cpu
