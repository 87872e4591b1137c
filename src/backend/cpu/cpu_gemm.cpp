#include "backend/cpu/cpu_gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <vector>

#include "backend/cpu/blas_gemm.hpp"
#include "io/file_util.hpp"
#include "kernels/cpu/gemm_packed.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::cpu {

const char* provider_name(GemmProvider p) {
  switch (p) {
    case GemmProvider::openblas:
      return "openblas";
    case GemmProvider::blis:
      return "blis";
    case GemmProvider::own:
      return "seqforge";
    case GemmProvider::onednn:
      break;
  }
  return "onednn";
}

namespace {

// The fastest of a few runs of each contestant, ms, after one untimed run each (oneDNN builds its
// kernel then): up to five rounds, each running every contestant once in turn, so that a burst of
// load on a shared machine slows one round of all rather than all runs of one; fewer rounds where
// they take long. A contestant that is null has time infinity.
std::vector<double> best_ms(const std::vector<std::function<void()>>& runs) {
  using clock = std::chrono::steady_clock;
  std::vector<double> best(runs.size(), std::numeric_limits<double>::infinity());
  for (const auto& run : runs)
    if (run) run();
  double total = 0;
  for (int round = 0; round < 5 && (round < 2 || total < 100); ++round)
    for (size_t i = 0; i < runs.size(); ++i) {
      if (!runs[i]) continue;
      const auto t0 = clock::now();
      runs[i]();
      const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
      best[i] = std::min(best[i], ms);
      total += ms;
    }
  return best;
}

// The BLAS library behind a provider, where it is one and runs this GEMM here; else nullptr.
const BlasGemm* blas_for(GemmProvider p, const GemmShape& s, DType operands) {
  if (p != GemmProvider::openblas && p != GemmProvider::blis) return nullptr;
  const BlasGemm* blas =
      BlasGemm::get(p == GemmProvider::blis ? BlasLibrary::blis : BlasLibrary::openblas);
  if (operands != DType::f32 || !blas || !BlasGemm::fits(s) || !blas->runs_here()) return nullptr;
  return blas;
}

// Whether provider p can run this GEMM here (the own kernel: where the caller has one).
bool runs(GemmProvider p, const GemmShape& s, DType operands, const OwnGemm* own) {
  if (p == GemmProvider::onednn) return true;
  if (p == GemmProvider::own) return own != nullptr;
  return blas_for(p, s, operands) != nullptr;
}

// SEQFORGE_GEMM_PROVIDER (onednn, openblas, blis or seqforge): that provider wherever it runs the
// shape, instead of the race (to compare them, or to test one).
std::optional<GemmProvider> forced_provider() {
  const char* v = std::getenv("SEQFORGE_GEMM_PROVIDER");
  if (!v || !*v) return std::nullopt;
  for (GemmProvider p :
       {GemmProvider::onednn, GemmProvider::openblas, GemmProvider::blis, GemmProvider::own})
    if (std::string_view(v) == provider_name(p)) return p;
  fail("SEQFORGE_GEMM_PROVIDER: unknown value '", v,
       "' (expected onednn, openblas, blis or seqforge)");
}

std::string shape_key(const GemmShape& s, DType operands) {
  char key[160];
  std::snprintf(
      key, sizeof key, "gemm_%s|%c%c_m%lld_n%lld_k%lld_ld%lld,%lld,%lld%s%s%s",
      std::string(dtype_name(operands)).c_str(), s.trans_a ? 't' : 'n', s.trans_b ? 't' : 'n',
      static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
      static_cast<long long>(s.lda), static_cast<long long>(s.ldb), static_cast<long long>(s.ldc),
      s.alpha != 1.0 ? "_alpha" : "", s.beta != 0.0 ? "_beta" : "", s.bias ? "_bias" : "");
  return key;
}

// B packed twice: for oneDNN's primitive (its "any" layout) and, f32 B of a plain A, into the own
// kernel's panels (simd::gemm_panels).
struct CpuPackedB final : PackedB {
  std::unique_ptr<PackedB> onednn;
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> panels;
  int64_t floats = 0, width = 0;  // panels' capacity and width; width 0: none packed
  int64_t k = 0, n = 0;           // op(B)'s shape in the panels
  bool trans_b = false;
  // Whether the panels hold op(B) of a GEMM of shape s (else the GEMM reads B as stored).
  bool panels_for(const GemmShape& g) const {
    return width != 0 && g.k == k && g.n == n && g.trans_b == trans_b && simd::gemm_panels_fit(g);
  }
};

// The own kernel on packed panels: the panels split over the threads, or on this thread alone
// inside a parallel region.
void run_panels(const GemmShape& s, const float* a, const CpuPackedB& p, float* c,
                const float* bias) {
  SF_CHECK(p.width == simd::gemm_panel_width(), "GEMM panels packed ", p.width,
           " wide for a kernel that reads ", simd::gemm_panel_width());
  const int64_t panels = (s.n + p.width - 1) / p.width;
  const int threads =
      omp_in_parallel() ? 1 : static_cast<int>(std::min<int64_t>(omp_get_max_threads(), panels));
  if (threads <= 1) return simd::gemm_panels(s, a, p.panels.get(), 0, panels, c, bias);
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    simd::gemm_panels(s, a, p.panels.get(), panels * t / nt, panels * (t + 1) / nt, c, bias);
  }
}

}  // namespace

double bf16_gemm_speedup() {
  // The shape of a transformer block's MLP at a batch of 512 tokens: large enough that the
  // instructions' rates, not the call's overhead, decide.
  const GemmShape s{.m = 512, .n = 1024, .k = 1024, .lda = 1024, .ldb = 1024, .ldc = 1024};
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const std::string key = autotune::machine_prefix(threads) + "bf16_gemm_speedup_512x1024x1024";
  if (const auto cached = autotune::lookup(key)) {
    if (const auto v = io::parse_double(*cached); v && *v > 0) return *v;
  }
  autotune::announce_first_use("bf16 against f32 GEMMs (train.precision auto)");
  std::vector<float> a(static_cast<size_t>(s.m * s.k), 0.5f),
      b(static_cast<size_t>(s.k * s.n), 0.25f), c(static_cast<size_t>(s.m * s.n));
  // bf16 0.5 and 0.25: the upper halves of the floats.
  std::vector<uint16_t> a16(a.size(), 0x3F00), b16(b.size(), 0x3E80);
  OneDnnGemm onednn;
  // On one thread: the ratio is the core's, and one thread needs only one quiet core, where
  // two would be slowed by any other process on either (a shared host, a second run).
  struct OneThread {
    const int before = omp_get_max_threads();
    OneThread() { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(before); }
  };
  std::vector<double> ms;
  const autotune::Timing timing;
  {
    const OneThread one;
    ms = best_ms({[&] { onednn.run(s, DType::f32, a.data(), b.data(), c.data(), nullptr); },
                  [&] { onednn.run(s, DType::bf16, a16.data(), b16.data(), c.data(), nullptr); }});
  }
  const double speedup = ms[0] / ms[1];
  char text[32];
  *std::to_chars(text, text + sizeof text - 1, speedup, std::chars_format::fixed, 3).ptr = '\0';
  autotune::store(key, text, timing);
  if (autotune::verbose())
    std::fprintf(stderr, "seqforge: autotune %s: f32 %.3f ms, bf16 %.3f ms (%s)\n", key.c_str(),
                 ms[0], ms[1], autotune::where_kept(key).c_str());
  return speedup;
}

GemmRace race_providers(OneDnnGemm& onednn, const GemmShape& s, DType operands, const void* a,
                        const void* b, const PackedB* packed, const float* c, const float* bias,
                        const OwnGemm* own) {
  // Each writes a copy of C, so that the caller's C is computed once, by the winner.
  const size_t c_size = static_cast<size_t>((s.m - 1) * s.ldc + s.n);
  std::vector<float> scratch(c, c + c_size);
  const auto blas_run = [&](GemmProvider p) -> std::function<void()> {
    const BlasGemm* blas = blas_for(p, s, operands);
    if (!blas) return nullptr;
    return [&, blas] {
      std::copy(c, c + c_size, scratch.begin());
      blas->run(s, static_cast<const float*>(a), static_cast<const float*>(b), scratch.data(),
                bias);
    };
  };
  std::function<void()> own_run;
  if (own)
    own_run = [&] {
      std::copy(c, c + c_size, scratch.begin());
      (*own)(scratch.data());
    };
  const std::function<void()> onednn_run = [&] {
    std::copy(c, c + c_size, scratch.begin());
    if (packed) return onednn.run_packed(s, operands, a, b, *packed, scratch.data(), bias);
    onednn.run(s, operands, a, b, scratch.data(), bias);
  };
  const std::vector<double> times = best_ms(
      {onednn_run, blas_run(GemmProvider::openblas), blas_run(GemmProvider::blis), own_run});
  GemmRace race;
  race.onednn_ms = times[0];
  race.openblas_ms = times[1];
  race.blis_ms = times[2];
  race.own_ms = times[3];
  // Ties go to the earlier in this order.
  double best = race.onednn_ms;
  for (const auto& [ms, p] :
       {std::pair{race.openblas_ms, GemmProvider::openblas},
        std::pair{race.blis_ms, GemmProvider::blis}, std::pair{race.own_ms, GemmProvider::own}})
    if (ms < best) best = ms, race.winner = p;
  return race;
}

GemmProvider CpuGemm::provider(const GemmShape& s, DType operands, const void* a, const void* b,
                               const PackedB* packed, const float* c, const float* bias,
                               const OwnGemm* own) {
  if (const std::optional<GemmProvider> forced = forced_provider())
    if (runs(*forced, s, operands, own)) return *forced;
  const bool contest = runs(GemmProvider::openblas, s, operands, own) ||
                       runs(GemmProvider::blis, s, operands, own) || own;
  if (!contest || !autotune::enabled()) return GemmProvider::onednn;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const Key key{s.trans_a,     s.trans_b, s.m,
                s.n,           s.k,       s.lda,
                s.ldb,         s.ldc,     s.alpha != 1.0,
                s.beta != 0.0, s.bias,    packed != nullptr,
                threads,       operands,  own != nullptr};
  // The step loop runs one shape over and over: its choice is remembered per thread, so those
  // calls take no lock. (A choice is by shape, the same for every CpuGemm: cached on disk.)
  thread_local std::optional<std::pair<Key, GemmProvider>> last;
  if (last && last->first == key) return last->second;
  std::lock_guard lock(mutex_);
  const GemmProvider p = choose(key, s, operands, a, b, packed, c, bias, own);
  last.emplace(key, p);
  return p;
}

GemmProvider CpuGemm::choose(const Key& key, const GemmShape& s, DType operands, const void* a,
                             const void* b, const PackedB* packed, const float* c,
                             const float* bias, const OwnGemm* own) {
  const int threads = std::get<12>(key);
  if (auto it = chosen_.find(key); it != chosen_.end()) return it->second;
  // The contestants are part of the key: a library installed later gets its race.
  std::string cache_key = autotune::machine_prefix(threads) + shape_key(s, operands) +
                          (packed ? "_packed" : "") + (own ? "_own" : "");
  for (GemmProvider p : {GemmProvider::openblas, GemmProvider::blis})
    if (runs(p, s, operands, own)) cache_key += std::string("_") + provider_name(p);
  if (const auto cached = autotune::lookup(cache_key)) {
    GemmProvider p = GemmProvider::onednn;
    for (GemmProvider q : {GemmProvider::openblas, GemmProvider::blis, GemmProvider::own})
      if (*cached == provider_name(q) && runs(q, s, operands, own)) p = q;
    return chosen_.emplace(key, p).first->second;
  }
  autotune::announce_first_use("the GEMM providers and recurrence schedules");
  const autotune::Timing timing;
  const GemmRace race = race_providers(onednn_, s, operands, a, b, packed, c, bias, own);
  const GemmProvider best = race.winner;
  autotune::store(cache_key, provider_name(best), timing);
  if (autotune::verbose())
    std::fprintf(
        stderr,
        "seqforge: autotune %s: onednn %.3f ms, openblas %.3f ms, blis %.3f ms, seqforge %.3f ms "
        "-> %s (%s)\n",
        cache_key.c_str(), race.onednn_ms, race.openblas_ms, race.blis_ms, race.own_ms,
        provider_name(best), autotune::where_kept(cache_key).c_str());
  return chosen_.emplace(key, best).first->second;
}

void CpuGemm::run(const GemmShape& s, DType operands, const void* a, const void* b, float* c,
                  const float* bias, const OwnGemm* own) {
  const GemmProvider p = provider(s, operands, a, b, nullptr, c, bias, own);
  // (A BLAS library chosen outside a parallel region may not run inside one: oneDNN does.)
  if (const BlasGemm* blas = blas_for(p, s, operands))
    return blas->run(s, static_cast<const float*>(a), static_cast<const float*>(b), c, bias);
  if (p == GemmProvider::own) return (*own)(c);
  onednn_.run(s, operands, a, b, c, bias);
}

int64_t own_panel_width(const PackedB& packed) {
  const auto* p = dynamic_cast<const CpuPackedB*>(&packed);
  return p ? p->width : 0;
}

void CpuGemm::pack(const GemmShape& s, DType operands, const void* b,
                   std::unique_ptr<PackedB>* packed) {
  auto* p = dynamic_cast<CpuPackedB*>(packed->get());
  if (!p) {
    auto fresh = std::make_unique<CpuPackedB>();
    p = fresh.get();
    *packed = std::move(fresh);
  }
  onednn_.pack(s, operands, b, &p->onednn);
  if (!p->onednn) return packed->reset();  // an empty GEMM: nothing to pack
  p->width = 0;
  if (operands != DType::f32 || !simd::gemm_panels_fit(s)) return;
  const int64_t width = simd::gemm_panel_width(), floats = simd::gemm_panels_floats(s, width);
  if (floats > p->floats) {
    const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
    p->panels.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    SF_CHECK(p->panels != nullptr, "GEMM panels of ", floats, " floats");
    p->floats = floats;
  }
  simd::pack_gemm_panels(s, static_cast<const float*>(b), width, p->panels.get());
  p->width = width;
  p->k = s.k;
  p->n = s.n;
  p->trans_b = s.trans_b;
}

void CpuGemm::run_packed(const GemmShape& s, DType operands, const void* a, const void* b,
                         const PackedB& packed, float* c, const float* bias) {
  const auto& p = static_cast<const CpuPackedB&>(packed);
  SF_CHECK(p.onednn != nullptr, "GEMM ", s.m, "x", s.n, "x", s.k, " on an empty packed B");
  // One pointer captured, so that the per-step call's std::function allocates nothing.
  const auto run_own = [&](float* out) {
    run_panels(s, static_cast<const float*>(a), p, out, bias);
  };
  OwnGemm own;
  if (p.panels_for(s)) own = [run = &run_own](float* out) { (*run)(out); };
  const GemmProvider provider =
      this->provider(s, operands, a, b, p.onednn.get(), c, bias, own ? &own : nullptr);
  if (provider == GemmProvider::own) return own(c);
  if (const BlasGemm* blas = blas_for(provider, s, operands))
    return blas->run(s, static_cast<const float*>(a), static_cast<const float*>(b), c, bias);
  onednn_.run_packed(s, operands, a, b, *p.onednn, c, bias);
}

}  // namespace seqforge::cpu
