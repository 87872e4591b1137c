#include "backend/cpu/isa_cap.hpp"

#include <hwy/targets.h>

#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>

#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::cpu {

namespace {

dnnl::cpu_isa onednn_isa(IsaTier tier) {
  switch (tier) {
    case IsaTier::baseline:
      return dnnl::cpu_isa::sse41;
    case IsaTier::avx2:
      return dnnl::cpu_isa::avx2;
    case IsaTier::avx512:
      return dnnl::cpu_isa::avx512_core;
    case IsaTier::avx512_bf16:
      return dnnl::cpu_isa::avx512_core_bf16;
    case IsaTier::amx:
      break;
  }
  return dnnl::cpu_isa::all;
}

// Highway's best allowed target for a tier; better targets have lower bits.
int64_t best_highway_target(IsaTier tier) {
  if (tier == IsaTier::baseline) return HWY_SSE4;
  if (tier == IsaTier::avx2) return HWY_AVX2;
  return 0;  // no limit: its AVX-512 targets need nothing above the avx512 tier
}

}  // namespace

void cap_library_dispatch() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::optional<IsaTier> cap = isa_cap();
    if (!cap) return;
    if (dnnl::set_max_cpu_isa(onednn_isa(*cap)) != dnnl::status::success)
      fail("SEQFORGE_MAX_ISA=", isa_tier_name(*cap),
           ": oneDNN was used before the cap could be set");
    if (const int64_t best = best_highway_target(*cap)) {
      hwy::DisableTargets(best - 1);
      // Choose the capped target now, on this thread. Left unchosen, the next dispatches (a
      // kernel's first call on every thread of a parallel region) each re-detect the CPU, and
      // Highway's detection publishes the uncapped targets as the choice until it applies the
      // cap: a thread dispatching in that moment ran the uncapped kernel (one run in thousands).
      hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    }
  });
}

}  // namespace seqforge::cpu
