// The CPU backend's instruction-set cap and its f32 GEMM providers: SEQFORGE_MAX_ISA is parsed
// strictly and every library dispatches within it; OpenBLAS, the second provider, matches the
// reference on every GEMM form the engine uses, and racing the providers leaves C untouched.
#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/blas_gemm.hpp"
#include "backend/cpu/cpu_gemm.hpp"
#include "kernels/cpu/pointwise_simd.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/onednn_info.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/rng.hpp"
#include "test_util.hpp"
#include "train/run.hpp"

namespace seqforge::gemm_providers_test {
namespace {

using test::error_of;
using test::max_rel_error;

// SEQFORGE_MAX_ISA set to `value` for the scope, then restored.
struct ScopedMaxIsa {
  std::string before;
  bool was_set;
  explicit ScopedMaxIsa(const char* value) {
    const char* v = std::getenv("SEQFORGE_MAX_ISA");
    was_set = v != nullptr;
    if (v) before = v;
    setenv("SEQFORGE_MAX_ISA", value, 1);
  }
  ~ScopedMaxIsa() {
    if (was_set)
      setenv("SEQFORGE_MAX_ISA", before.c_str(), 1);
    else
      unsetenv("SEQFORGE_MAX_ISA");
  }
};

TEST(IsaTiers, TheCapIsOneOfTheTierNames) {
  {
    ScopedMaxIsa cap("avx3");
    const std::string e = error_of([] { isa_cap(); });
    EXPECT_NE(e.find("SEQFORGE_MAX_ISA: unknown value 'avx3' (expected baseline, avx2, avx512, "
                     "avx512_bf16 or amx)"),
              std::string::npos)
        << e;
  }
  for (const char* name : {"baseline", "avx2", "avx512", "avx512_bf16", "amx"}) {
    ScopedMaxIsa cap(name);
    ASSERT_TRUE(isa_cap().has_value()) << name;
    EXPECT_STREQ(isa_tier_name(*isa_cap()), name);
    EXPECT_LE(isa_tier(), *isa_cap()) << name;
    EXPECT_LE(isa_tier(), machine_isa_tier()) << name;
  }
}

// What the kernels may use follows the tier this process dispatches to (the @tier copies of the
// op tests run this under each cap).
TEST(Ops, DispatchStaysWithinTheIsaTier) {
  const IsaTier tier = isa_tier();
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(f.avx512f, tier >= IsaTier::avx512 && machine_cpu_features().avx512f);
  EXPECT_EQ(f.avx512_bf16 || f.amx_bf16, tier >= IsaTier::avx512_bf16);
  EXPECT_EQ(make_cpu_backend()->supports(Op::gemm, DType::bf16), tier >= IsaTier::avx512_bf16);
  const std::string onednn = onednn_info().isa, backend = make_cpu_backend()->description();
  if (tier == IsaTier::avx2) {
    EXPECT_EQ(onednn, "avx2");
    EXPECT_NE(backend.find("AVX2 kernels"), std::string::npos) << backend;
  }
  if (tier == IsaTier::avx512) {
    EXPECT_EQ(onednn.rfind("avx512_core", 0), 0u) << onednn;
  }
  if (tier >= IsaTier::avx512) {
    EXPECT_NE(backend.find("AVX-512 kernels"), std::string::npos) << backend;
  }
  if (tier == IsaTier::avx512_bf16) {
    EXPECT_EQ(onednn, "avx512_core_bf16");
  }
}

// Under a cap below the CPU's own vectors, the CPU backend has Highway's capped target chosen
// before any kernel runs: left unchosen, a parallel region's first calls each detect the CPU
// again, and the detection publishes the uncapped targets as the choice for a moment, so that a
// thread dispatching then ran the uncapped kernel (two runs of an attention seldom agreed).
TEST(Ops, TheCappedKernelsAreChosenBeforeAnyRuns) {
  const std::optional<IsaTier> cap = isa_cap();
  if (!cap || *cap > IsaTier::avx2 || *cap >= machine_isa_tier())
    GTEST_SKIP() << "no cap to SSE4 or AVX2 below this CPU's tier (the @baseline and @avx2 copies "
                    "check it)";
  const auto cpu = make_cpu_backend();
  EXPECT_TRUE(hwy::GetChosenTarget().IsInitialized());
  const std::string want = *cap == IsaTier::avx2 ? "AVX2" : "SSE4";
  std::vector<std::string> names(8);
#pragma omp parallel num_threads(8)
  names[omp_get_thread_num()] = simd::target_name();
  for (const std::string& name : names) EXPECT_EQ(name, want);
}

// A bf16 GEMM where the CPU has no bf16 dot products is one line naming the op, the dtype, the
// shape and the ISA, not oneDNN's own message alone.
TEST(Ops, Bf16GemmWithoutBf16InstructionsNamesTheShapeAndIsa) {
  if (test::cpu_runs_bf16())
    GTEST_SKIP() << "this CPU runs bf16 GEMMs (the @avx2 and @avx512 copies check the message)";
  auto cpu = make_cpu_backend();
  const GemmShape s{.m = 20, .n = 39, .k = 24, .lda = 24, .ldb = 39, .ldc = 39};
  std::vector<bf16> a(20 * 24), b(24 * 39);
  std::vector<float> c(20 * 39);
  const std::string e = error_of([&] { cpu->gemm(s, DType::bf16, a.data(), b.data(), c.data()); });
  EXPECT_NE(e.find("GEMM 20x39x24 with bf16 operands: this CPU has no bf16 dot products "
                   "(AVX512-BF16 or AMX-BF16); dispatch reaches "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find(isa_tier_name(isa_tier())), std::string::npos) << e;
}

// train.precision auto on a CPU takes bf16 GEMMs only where they run at least 1.2x as fast as
// f32 ones here (an Intel core's AVX512-BF16 without AMX does not), timed once and cached; on a
// CPU without bf16 instructions it is fp32 without a word.
TEST(Precision, AutoTakesBf16OnlyWhereItPaysOff) {
  std::string why, notice;
  const bool pays = bf16_gemms_pay_off(&why);
  const DType gemm = backend_precision("auto", *make_cpu_backend(), &notice);
  if (!test::cpu_runs_bf16()) {
    EXPECT_FALSE(pays);
    EXPECT_EQ(why, no_bf16_reason());
    const bool capped = machine_cpu_features().avx512_bf16 || machine_cpu_features().amx_bf16;
    EXPECT_NE(why.find(capped ? "SEQFORGE_MAX_ISA" : "neither AVX512-BF16 nor AMX-BF16"),
              std::string::npos)
        << why;
    EXPECT_EQ(gemm, DType::f32);
    EXPECT_TRUE(notice.empty()) << notice;
    return;
  }
  const double speedup = cpu::bf16_gemm_speedup();
  ASSERT_TRUE(std::isfinite(speedup) && speedup > 0) << speedup;
  EXPECT_EQ(cpu::bf16_gemm_speedup(), speedup) << "timed once, then cached";
  EXPECT_EQ(pays, speedup >= 1.2) << why;
  EXPECT_EQ(gemm, pays ? DType::bf16 : DType::f32);
  EXPECT_EQ(notice.empty(), pays) << notice;
  if (!pays) {
    EXPECT_EQ(notice.rfind("train.precision auto: bf16 GEMMs run 0.", 0), 0u) << notice;
  }
  EXPECT_EQ(backend_precision("bf16", *make_cpu_backend(), &notice), DType::bf16);
}

// OpenBLAS on a CPU model it does not know (an Emerald Rapids Xeon for 0.3.21) would run generic
// SSE kernels: it is loaded on the kernels of the CPU's tier instead.
TEST(Ops, OpenBlasRunsKernelsOfTheCpusTier) {
  // (Read before the library loads, which may set it.)
  const bool chosen = std::getenv("OPENBLAS_CORETYPE") && !std::getenv("SEQFORGE_MAX_ISA");
  const std::string status = openblas_status();
  if (!cpu::BlasGemm::get(cpu::BlasLibrary::openblas)) GTEST_SKIP() << status;
  if (chosen) GTEST_SKIP() << "OPENBLAS_CORETYPE is set: the user's choice stands";
  if (isa_tier() < IsaTier::avx2) GTEST_SKIP() << "a baseline CPU runs OpenBLAS's SSE kernels";
  for (const char* generic : {"Prescott", "Core2", "Penryn", "Nehalem", "Atom"})
    EXPECT_EQ(status.find(std::string(generic) + " kernels"), std::string::npos) << status;
}

// A BLAS library's sgemm against the reference on the forms the engine runs: both transposes,
// padded leading dimensions, alpha, beta and the bias epilogue, and sizes that leave partial tiles
// (and, for the sizes of a step, more than one thread's share).
void expect_blas_matches_the_reference(cpu::BlasLibrary library) {
  const cpu::BlasGemm* blas = cpu::BlasGemm::get(library);
  if (!blas) GTEST_SKIP() << "no " << cpu::blas_name(library) << ": " << cpu::blas_status(library);
  ASSERT_TRUE(blas->runs_here());
  auto ref = make_reference_backend();
  Rng rng(5);
  int checked = 0;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                                    {7, 13, 5},
                                    {64, 512, 128},
                                    {33, 65, 300},
                                    {515, 387, 129}})
        for (const bool bias : {false, true}) {
          const int64_t pad = 3;
          GemmShape s{.trans_a = ta,
                      .trans_b = tb,
                      .m = m,
                      .n = n,
                      .k = k,
                      .lda = (ta ? m : k) + pad,
                      .ldb = (tb ? k : n) + pad,
                      .ldc = n + pad,
                      .alpha = bias ? 1.0 : 0.75,
                      .beta = bias ? 0.0 : 0.5,
                      .bias = bias};
          std::vector<float> a((ta ? k : m) * s.lda), b((tb ? n : k) * s.ldb), c0(m * s.ldc), bv(n);
          for (std::vector<float>* v : {&a, &b, &c0, &bv})
            for (float& x : *v) x = static_cast<float>(rng.uniform(-1, 1));
          std::vector<float> got = c0, want = c0;
          blas->run(s, a.data(), b.data(), got.data(), bias ? bv.data() : nullptr);
          ref->gemm(s, DType::f32, a.data(), b.data(), want.data(), bias ? bv.data() : nullptr);
          EXPECT_LE(max_rel_error(std::vector<double>(got.begin(), got.end()),
                                  std::vector<double>(want.begin(), want.end())),
                    1e-5)
              << cpu::blas_name(library) << " " << m << "x" << n << "x" << k << " ta " << ta
              << " tb " << tb << " bias " << bias;
          ++checked;
        }
  EXPECT_EQ(checked, 40);
}

TEST(Ops, OpenBlasGemmMatchesTheReference) {
  expect_blas_matches_the_reference(cpu::BlasLibrary::openblas);
}

TEST(Ops, BlisGemmMatchesTheReference) {
  expect_blas_matches_the_reference(cpu::BlasLibrary::blis);
}

// SEQFORGE_GEMM_PROVIDER set to `value` for the scope, then unset.
struct ScopedProvider {
  explicit ScopedProvider(const char* value) { setenv("SEQFORGE_GEMM_PROVIDER", value, 1); }
  ~ScopedProvider() { unsetenv("SEQFORGE_GEMM_PROVIDER"); }
};

// The CPU backend's own kernels for a narrow side (A^T B with A of few columns, A B^T and A B with
// B of few columns), forced instead of the race, against the reference: f32 and bf16 operands,
// padded rows, alpha and beta, odd sizes and edges of the vector and row blocks, enough rows for
// threads; and the libraries forced on the same shapes (f32 on OpenBLAS and BLIS).
TEST(Ops, OwnNarrowGemmsMatchTheReference) {
  auto cpu = make_cpu_backend();
  auto ref = make_reference_backend();
  Rng rng(11);
  struct Case {
    bool ta, tb;
    int64_t m, n, k;
  };
  const Case cases[] = {
      {true, false, 8, 384, 4096}, {true, false, 1, 1, 1},      {true, false, 16, 37, 301},
      {false, true, 4096, 8, 384}, {false, true, 33, 13, 37},   {false, true, 1, 16, 1},
      {false, false, 41, 6, 1030}, {false, false, 300, 16, 17}, {false, false, 3, 1, 0}};
  int checked = 0;
  for (const char* provider : {"seqforge", "onednn", "openblas", "blis"}) {
    ScopedProvider forced(provider);
    for (const DType dt : {DType::f32, DType::bf16}) {
      if (dt == DType::bf16 && !test::cpu_runs_bf16()) continue;
      for (const Case& c : cases) {
        const int64_t pad = 2;
        const GemmShape s{.trans_a = c.ta,
                          .trans_b = c.tb,
                          .m = c.m,
                          .n = c.n,
                          .k = c.k,
                          .lda = (c.ta ? c.m : c.k) + pad,
                          .ldb = (c.tb ? c.k : c.n) + pad,
                          .ldc = c.n + pad,
                          .alpha = 0.75,
                          .beta = 0.5};
        const int64_t na = (c.ta ? c.k : c.m) * s.lda, nb = (c.tb ? c.n : c.k) * s.ldb;
        std::vector<float> a(na), b(nb), c0(c.m * s.ldc);
        for (std::vector<float>* v : {&a, &b, &c0})
          for (float& x : *v) x = static_cast<float>(rng.uniform(-1, 1));
        std::vector<bf16> a16(na), b16(nb);
        for (int64_t i = 0; i < na; ++i) a16[i] = to_bf16(a[i]);
        for (int64_t i = 0; i < nb; ++i) b16[i] = to_bf16(b[i]);
        const void* pa = dt == DType::bf16 ? static_cast<const void*>(a16.data()) : a.data();
        const void* pb = dt == DType::bf16 ? static_cast<const void*>(b16.data()) : b.data();
        std::vector<float> got = c0, want = c0;
        cpu->gemm(s, dt, pa, pb, got.data());
        ref->gemm(s, dt, pa, pb, want.data());
        EXPECT_LE(max_rel_error(std::vector<double>(got.begin(), got.end()),
                                std::vector<double>(want.begin(), want.end())),
                  2e-5)
            << provider << " " << dtype_name(dt) << " " << c.m << "x" << c.n << "x" << c.k << " ta "
            << c.ta << " tb " << c.tb;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 36);
  ScopedProvider unknown("mkl");
  const GemmShape s{.m = 2, .n = 2, .k = 2, .lda = 2, .ldb = 2, .ldc = 2};
  std::vector<float> x(4, 1.0f), y(4);
  EXPECT_EQ(error_of([&] { cpu->gemm(s, DType::f32, x.data(), x.data(), y.data()); }),
            "SEQFORGE_GEMM_PROVIDER: unknown value 'mkl' (expected onednn, openblas, blis or "
            "seqforge)");
}

// The own kernel on packed f32 B (the recurrent weights' GEMMs), forced instead of the race,
// against the reference: B plain and transposed, padded rows, alpha and beta or a bias, sizes off
// the panel width, the micro-kernel's rows, its k blocks and its row blocks, called on the
// calling thread (its panels over the threads) and inside a concurrent chain (alone); B packed
// again in place for a second B; and panels left unread by a GEMM of another shape.
TEST(Ops, OwnPackedGemmMatchesTheReference) {
  auto cpu = make_cpu_backend();
  auto ref = make_reference_backend();
  Rng rng(12);
  struct Case {
    bool tb;
    int64_t m, n, k;
    bool bias;
  };
  const Case cases[] = {{true, 64, 2048, 512, false}, {false, 64, 512, 2048, false},
                        {true, 13, 37, 300, true},    {false, 7, 33, 1030, false},
                        {true, 250, 70, 65, true},    {false, 1, 1, 1, false},
                        {true, 5, 16, 0, true},       {false, 200, 17, 257, true}};
  ScopedProvider forced("seqforge");
  int checked = 0;
  for (const Case& c : cases) {
    const int64_t pad = 3;
    const GemmShape s{.trans_b = c.tb,
                      .m = c.m,
                      .n = c.n,
                      .k = c.k,
                      .lda = c.k + pad,
                      .ldb = (c.tb ? c.k : c.n) + pad,
                      .ldc = c.n + pad,
                      .alpha = c.bias ? 1.0 : 0.75,
                      .beta = c.bias ? 0.0 : 0.5,
                      .bias = c.bias};
    std::vector<float> a(c.m * s.lda), b((c.tb ? c.n : c.k) * s.ldb), bias(c.n), c0(c.m * s.ldc);
    for (std::vector<float>* v : {&a, &bias, &c0})
      for (float& x : *v) x = static_cast<float>(rng.uniform(-1, 1));
    const float* bias_or_null = c.bias ? bias.data() : nullptr;
    std::unique_ptr<PackedB> packed;
    for (int round = 0; round < 2; ++round) {
      for (float& x : b) x = static_cast<float>(rng.uniform(-1, 1));
      cpu->pack_b(s, DType::f32, b.data(), &packed);
      if (c.k == 0) {
        EXPECT_FALSE(packed) << "an empty product packs nothing";
      } else {
        ASSERT_TRUE(packed);
        EXPECT_GT(cpu::own_panel_width(*packed), 0) << "f32 B of a plain A is packed into panels";
      }
      std::vector<float> want = c0, main_thread = c0, in_chain = c0;
      ref->gemm(s, DType::f32, a.data(), b.data(), want.data(), bias_or_null);
      cpu->gemm(s, DType::f32, a.data(), b.data(), packed.get(), main_thread.data(), bias_or_null);
      cpu->run_concurrently(std::min(2, cpu->concurrency()), [&](int i) {
        if (i == 0)
          cpu->gemm(s, DType::f32, a.data(), b.data(), packed.get(), in_chain.data(), bias_or_null);
      });
      for (const auto* got : {&main_thread, &in_chain}) {
        EXPECT_LE(max_rel_error(std::vector<double>(got->begin(), got->end()),
                                std::vector<double>(want.begin(), want.end())),
                  2e-5)
            << c.m << "x" << c.n << "x" << c.k << " tb " << c.tb << " round " << round;
        for (int64_t i = 0; i < c.m; ++i)  // the padding between C's rows is left alone
          for (int64_t j = c.n; j < s.ldc && i * s.ldc + j < int64_t(got->size()); ++j)
            ASSERT_EQ((*got)[i * s.ldc + j], c0[i * s.ldc + j]) << "row " << i << " col " << j;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16);

  // B packed for one shape and used with another (the first 8 of its 16 rows of op(B)): the
  // panels are not read, the GEMM reads B as stored.
  const GemmShape packed_shape{
      .trans_b = true, .m = 8, .n = 32, .k = 16, .lda = 16, .ldb = 16, .ldc = 32};
  GemmShape shorter = packed_shape;
  shorter.k = 8;
  std::vector<float> a(8 * 16), b(32 * 16);
  for (std::vector<float>* v : {&a, &b})
    for (float& x : *v) x = static_cast<float>(rng.uniform(-1, 1));
  std::unique_ptr<PackedB> packed;
  cpu->pack_b(packed_shape, DType::f32, b.data(), &packed);
  ASSERT_TRUE(packed);
  std::vector<float> got(8 * 32), want(8 * 32);
  cpu->gemm(shorter, DType::f32, a.data(), b.data(), packed.get(), got.data());
  ref->gemm(shorter, DType::f32, a.data(), b.data(), want.data());
  EXPECT_LE(max_rel_error(std::vector<double>(got.begin(), got.end()),
                          std::vector<double>(want.begin(), want.end())),
            2e-5);
}

// Racing the providers times each that is there and leaves C as it was; the fastest wins; the CPU
// backend then computes C once.
TEST(Ops, RacingTheGemmProvidersLeavesCUntouched) {
  const cpu::BlasGemm* openblas = cpu::BlasGemm::get(cpu::BlasLibrary::openblas);
  const cpu::BlasGemm* blis = cpu::BlasGemm::get(cpu::BlasLibrary::blis);
  if (!openblas && !blis)
    GTEST_SKIP() << "no OpenBLAS (" << cpu::blas_status(cpu::BlasLibrary::openblas)
                 << ") and no BLIS (" << cpu::blas_status(cpu::BlasLibrary::blis) << ")";
  const GemmShape s{.m = 48, .n = 40, .k = 32, .lda = 32, .ldb = 40, .ldc = 40, .beta = 1.0};
  std::vector<float> a(48 * 32, 0.5f), b(32 * 40, 0.25f), c(48 * 40, 2.0f);
  cpu::OneDnnGemm onednn;
  const cpu::GemmRace race =
      cpu::race_providers(onednn, s, DType::f32, a.data(), b.data(), nullptr, c.data(), nullptr);
  EXPECT_GT(race.onednn_ms, 0);
  EXPECT_EQ(std::isfinite(race.openblas_ms), openblas != nullptr);
  EXPECT_EQ(std::isfinite(race.blis_ms), blis != nullptr);
  EXPECT_TRUE(std::isinf(race.own_ms));
  const double fastest = std::min({race.onednn_ms, race.openblas_ms, race.blis_ms});
  const double winner_ms = race.winner == cpu::GemmProvider::onednn     ? race.onednn_ms
                           : race.winner == cpu::GemmProvider::openblas ? race.openblas_ms
                           : race.winner == cpu::GemmProvider::blis     ? race.blis_ms
                                                                        : -1;
  EXPECT_EQ(winner_ms, fastest) << cpu::provider_name(race.winner);
  for (float v : c) ASSERT_EQ(v, 2.0f);
  auto be = make_cpu_backend();
  be->gemm(s, DType::f32, a.data(), b.data(), c.data());
  for (float v : c) ASSERT_FLOAT_EQ(v, 2.0f + 32 * 0.125f);  // beta C + A B, once
}

// BLIS's thread count is global, so it runs outside parallel regions only: forced, a GEMM called
// from inside one runs elsewhere, and every thread's result is right.
TEST(Ops, BlisStaysOutOfParallelRegions) {
  const cpu::BlasGemm* blis = cpu::BlasGemm::get(cpu::BlasLibrary::blis);
  if (!blis) GTEST_SKIP() << "no BLIS: " << cpu::blas_status(cpu::BlasLibrary::blis);
  ScopedProvider forced("blis");
  auto be = make_cpu_backend();
  const GemmShape s{.m = 96, .n = 80, .k = 64, .lda = 64, .ldb = 80, .ldc = 80};
  std::vector<float> a(96 * 64, 0.5f), b(64 * 80, 0.25f);
  std::vector<std::vector<float>> c(2, std::vector<float>(96 * 80, -1.0f));
  int kept_out = 0, team = 1;
#pragma omp parallel num_threads(2) reduction(+ : kept_out)
  {
#pragma omp single
    team = omp_get_num_threads();
    kept_out += blis->runs_here() ? 0 : 1;
    be->gemm(s, DType::f32, a.data(), b.data(), c[omp_get_thread_num()].data());
  }
  EXPECT_EQ(kept_out, team > 1 ? team : 0);
  for (const std::vector<float>& ci : c)
    for (float v : ci) ASSERT_FLOAT_EQ(v, 64 * 0.125f);
  EXPECT_TRUE(blis->runs_here());
  std::vector<float> outside(96 * 80);
  be->gemm(s, DType::f32, a.data(), b.data(), outside.data());
  for (float v : outside) ASSERT_FLOAT_EQ(v, 64 * 0.125f);
}

}  // namespace
}  // namespace seqforge::gemm_providers_test
