// The attention kernels: the CPU backend's fused f32 kernel against the reference in f64 over
// many shapes (head sizes with and without vector tails, sequences across tile edges, 300 across
// the forward's key tiles of 256; causal or not, padded batch rows including empty ones), with
// and without dropout on the probabilities, with grouped key/value heads and sliding windows, and
// the reference's gradient against central finite differences of sum(out * w); the groups and the
// window checked against their definitions. The dropout mask itself is read out through the op
// (uniform probabilities, one-hot values) for its statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention_problems.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/ops.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/rng.hpp"
#include "test_util.hpp"

namespace seqforge::attention_test {
namespace {

using namespace test::attention;
using test::error_of;
using test::HostTensor;
using test::max_rel_error;
using test::sweep_case_runs;
using test::to_doubles;

// The fused kernel (CPU backend, f32) against the reference in f64 from the same inputs, within
// tol; the errors go into worst.
void expect_fused_matches_reference(Backend& ref, Backend& cpu, const Problem& p, double tol,
                                    Errors& worst) {
  const std::string what = describe(p);
  const Result want = run(ref, DType::f64, p), got = run(cpu, DType::f32, p);
  const Errors e{max_rel_error(got.out, want.out), lse_error(got.lse, want.lse),
                 max_rel_error(got.dqkv, want.dqkv)};
  EXPECT_LE(e.out, tol) << what;
  EXPECT_LE(e.lse, tol) << what;
  EXPECT_LE(e.dqkv, tol) << what;
  expect_padding_zeros(p, want, "reference " + what);
  expect_padding_zeros(p, got, "cpu " + what);
  worst.out = std::max(worst.out, e.out);
  worst.lse = std::max(worst.lse, e.lse);
  worst.dqkv = std::max(worst.dqkv, e.dqkv);
}

TEST(Attention, FusedMatchesReferenceOnManyShapes) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  Errors worst;
  int count = 0, index = 0;
  for (int64_t D : {1, 7, 16, 24, 64, 65})
    for (int64_t T : {1, 2, 17, 64, 130, 300})
      for (bool causal : {true, false})
        for (bool padded : {false, true}) {
          const int idx = index++;
          if (!sweep_case_runs(idx)) continue;
          ++count;
          bool peaked;
          const AttentionShape s = sweep_shape(idx, T, D, causal, &peaked);
          const Problem p = make_problem(
              s, padded ? sweep_lengths(idx, s.batch, T) : std::vector<int64_t>{}, 1000 + idx);
          expect_fused_matches_reference(*ref, *cpu, p, peaked ? 4e-5 : 2e-5, worst);
        }
  std::printf("%d shapes; largest relative errors: out %.2e, lse %.2e, dqkv %.2e\n", count,
              worst.out, worst.lse, worst.dqkv);
}

// The same with dropout: the kernels draw the same mask, and lse is the undropped one.
TEST(Attention, FusedMatchesReferenceWithDropout) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  for (double dropout : {0.1, 0.5}) {
    Errors worst;
    int count = 0, index = 0;
    for (int64_t D : {7, 16, 24, 65})
      for (int64_t T : {17, 64, 130, 300})
        for (bool causal : {true, false})
          for (bool padded : {false, true}) {
            const int idx = index++;
            if (!sweep_case_runs(idx)) continue;
            ++count;
            bool peaked;
            AttentionShape s = sweep_shape(idx, T, D, causal, &peaked);
            s.dropout = dropout;
            s.seed = 77 + idx;
            const Problem p = make_problem(
                s, padded ? sweep_lengths(idx, s.batch, T) : std::vector<int64_t>{}, 2000 + idx);
            expect_fused_matches_reference(*ref, *cpu, p, peaked ? 4e-5 : 2e-5, worst);
            Problem undropped = p;
            undropped.shape.dropout = 0;
            EXPECT_EQ(run(*ref, DType::f64, p, false).lse,
                      run(*ref, DType::f64, undropped, false).lse)
                << describe(p);
          }
    std::printf("dropout %.1f, %d shapes; largest relative errors: out %.2e, lse %.2e, dqkv %.2e\n",
                dropout, count, worst.out, worst.lse, worst.dqkv);
  }
}

TEST(Attention, Bf16ProductsMatchReferenceWithinBf16Rounding) {
  if (!cpu_features().avx512_bf16) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  Errors worst;
  int count = 0, index = 0, differs_from_f32 = 0;
  for (int64_t D : {1, 7, 16, 24, 64, 65})
    for (int64_t T : {1, 2, 17, 64, 130, 300})
      for (bool causal : {true, false})
        for (bool padded : {false, true}) {
          const int idx = index++;
          if (!sweep_case_runs(idx)) continue;
          ++count;
          bool peaked;
          AttentionShape s = sweep_shape(idx, T, D, causal, &peaked);
          if (idx % 3 == 1) {
            s.dropout = 0.2;
            s.seed = 5 + idx;
          }
          const Problem p = make_problem(
              s, padded ? sweep_lengths(idx, s.batch, T) : std::vector<int64_t>{}, 3000 + idx);
          differs_from_f32 += expect_within_product_rounding(*ref, *cpu, p, worst);
        }
  EXPECT_GT(differs_from_f32, count / 2) << "the bf16 kernel did not run";
  std::printf("bf16 products, %d shapes; largest relative errors: out %.2e, lse %.2e, dqkv %.2e\n",
              count, worst.out, worst.lse, worst.dqkv);
}

TEST(Attention, FusedMatchesReferenceWithGroupedHeadsAndWindows) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  Errors worst, worst_bf16;
  int count = 0, index = 0, differs_from_f32 = 0;
  for (int64_t D : {7, 16, 24, 65})
    for (int64_t T : {1, 17, 64, 130, 300})
      for (bool causal : {true, false})
        for (bool padded : {false, true}) {
          const int idx = index++;
          if (!sweep_case_runs(idx)) continue;
          ++count;
          bool peaked;
          AttentionShape s = grouped_shape(idx, T, D, causal, &peaked);
          if (idx % 3 == 2) {
            s.dropout = 0.2;
            s.seed = 31 + idx;
          }
          const Problem p = make_problem(
              s, padded ? sweep_lengths(idx, s.batch, T) : std::vector<int64_t>{}, 5000 + idx);
          expect_fused_matches_reference(*ref, *cpu, p, peaked ? 4e-5 : 2e-5, worst);
          if (cpu_features().avx512_bf16)
            differs_from_f32 += expect_within_product_rounding(*ref, *cpu, p, worst_bf16);
        }
  if (cpu_features().avx512_bf16) {
    EXPECT_GT(differs_from_f32, count / 2) << "the bf16 kernel did not run";
  }
  std::printf(
      "%d shapes; largest relative errors: out %.2e, lse %.2e, dqkv %.2e (bf16 products: "
      "%.2e, %.2e, %.2e)\n",
      count, worst.out, worst.lse, worst.dqkv, worst_bf16.out, worst_bf16.lse, worst_bf16.dqkv);
}

// A key/value head shared by a group is the same as each query head having its own copy: out,
// lse and dq equal the ungrouped op's on repeated keys and values (dropout included, as its mask
// is the query head's), and dk, dv the sums of the copies' gradients.
TEST(Attention, ReferenceGroupsAreRepeatedHeads) {
  auto ref = make_reference_backend();
  const Problem problems[] = {
      make_problem(
          {.batch = 2, .seq = 13, .heads = 6, .head_dim = 5, .causal = true, .kv_heads = 2},
          {13, 6}, 1),
      make_problem({.batch = 1,
                    .seq = 9,
                    .heads = 4,
                    .head_dim = 3,
                    .causal = false,
                    .kv_heads = 1,
                    .dropout = 0.3,
                    .seed = 4},
                   {}, 2),
      make_problem({.batch = 2,
                    .seq = 20,
                    .heads = 3,
                    .head_dim = 4,
                    .causal = true,
                    .kv_heads = 1,
                    .window = 5},
                   {20, 11}, 3),
  };
  for (const Problem& p : problems) {
    const AttentionShape& s = p.shape;
    const int64_t B = s.batch, T = s.seq, D = s.head_dim, H = s.heads, KV = s.kv();
    const int64_t W = s.qkv_width(), C = H * D;
    Problem copies = p;
    copies.shape.kv_heads = 0;
    copies.qkv.assign(static_cast<size_t>(B * T * 3 * C), 0.0);
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t g = h / s.group();
          auto at = [&](int64_t row_width, int64_t col) { return size_t(r * row_width + col); };
          copies.qkv[at(3 * C, h * D + d)] = p.qkv[at(W, h * D + d)];
          copies.qkv[at(3 * C, C + h * D + d)] = p.qkv[at(W, C + g * D + d)];
          copies.qkv[at(3 * C, 2 * C + h * D + d)] = p.qkv[at(W, C + KV * D + g * D + d)];
        }
    const Result got = run(*ref, DType::f64, p), want = run(*ref, DType::f64, copies);
    EXPECT_EQ(got.out, want.out) << describe(p);
    EXPECT_EQ(got.lse, want.lse) << describe(p);
    std::vector<double> summed(static_cast<size_t>(B * T * W), 0.0);
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t g = h / s.group();
          const size_t w = size_t(r * 3 * C);
          summed[size_t(r * W + h * D + d)] = want.dqkv[w + size_t(h * D + d)];
          summed[size_t(r * W + C + g * D + d)] += want.dqkv[w + size_t(C + h * D + d)];
          summed[size_t(r * W + C + KV * D + g * D + d)] +=
              want.dqkv[w + size_t(2 * C + h * D + d)];
        }
    EXPECT_LE(max_rel_error(got.dqkv, summed), 1e-13) << describe(p);
  }
}

// Hugging Face's sliding window: query row i sees keys i - window < j <= i, so its out and lse
// are those of the last row of the unwindowed causal op on rows (i - window, i] alone.
TEST(Attention, ReferenceWindowSeesTheLastWindowKeys) {
  auto ref = make_reference_backend();
  const int64_t T = 23, H = 4, KV = 2, D = 6;
  for (int64_t window : {1, 4, 9, 23, 40}) {
    const Problem p = make_problem({.batch = 1,
                                    .seq = T,
                                    .heads = H,
                                    .head_dim = D,
                                    .causal = true,
                                    .kv_heads = KV,
                                    .window = window},
                                   {}, 50 + window);
    const Result r = run(*ref, DType::f64, p, false);
    const int64_t W = p.shape.qkv_width(), C = H * D;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t first = std::max<int64_t>(0, i - window + 1), n = i + 1 - first;
      Problem part = p;
      part.shape.seq = n;
      part.shape.window = 0;
      part.qkv.assign(p.qkv.begin() + first * W, p.qkv.begin() + (i + 1) * W);
      part.dout.assign(p.dout.begin() + first * C, p.dout.begin() + (i + 1) * C);
      const Result want = run(*ref, DType::f64, part, false);
      for (int64_t c = 0; c < C; ++c)
        EXPECT_NEAR(r.out[size_t(i * C + c)], want.out[size_t((n - 1) * C + c)], 1e-14)
            << "window " << window << " row " << i;
      for (int64_t h = 0; h < H; ++h)
        EXPECT_NEAR(r.lse[size_t(h * T + i)], want.lse[size_t(h * n + n - 1)], 1e-13)
            << "window " << window << " row " << i;
    }
  }
}

TEST(Attention, GroupsThatDoNotDivideAndWindowsWithoutCausalAreErrors) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  for (Backend* be : {ref.get(), cpu.get()}) {
    Problem p =
        make_problem({.batch = 1, .seq = 3, .heads = 4, .head_dim = 2, .kv_heads = 3}, {}, 7);
    EXPECT_NE(error_of([&] {
                run(*be, DType::f32, p);
              }).find("4 query heads are not groups of 3 key/value heads"),
              std::string::npos)
        << be->name();
    p = make_problem(
        {.batch = 1, .seq = 3, .heads = 2, .head_dim = 2, .causal = false, .window = 2}, {}, 7);
    EXPECT_NE(error_of([&] {
                run(*be, DType::f32, p);
              }).find("a sliding window of 2 needs a causal mask"),
              std::string::npos)
        << be->name();
  }
}

// From a first query row (decoding against cached keys): the rows from it as the whole op computes
// them, the rows before it untouched, on every backend and in bf16 products too.
TEST(Attention, FirstRowComputesOnlyTheRowsFromIt) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  int count = 0, index = 0;
  for (int64_t D : {7, 64})
    for (int64_t T : {1, 17, 130, 300})
      for (bool causal : {true, false})
        for (bool padded : {false, true})
          for (bool grouped : {false, true}) {
            const int idx = index++;
            if (!sweep_case_runs(idx)) continue;
            ++count;
            bool peaked;
            AttentionShape s = grouped ? grouped_shape(idx, T, D, causal, &peaked)
                                       : sweep_shape(idx, T, D, causal, &peaked);
            if (idx % 3 == 1) {
              s.dropout = 0.2;
              s.seed = 11 + idx;
            }
            const Problem p = make_problem(
                s, padded ? sweep_lengths(idx, s.batch, T) : std::vector<int64_t>{}, 4000 + idx);
            struct Case {
              Backend* be;
              DType dt;
              bool bf16;
            };
            std::vector<Case> cases = {{ref.get(), DType::f64, false},
                                       {ref.get(), DType::f32, false},
                                       {cpu.get(), DType::f32, false}};
            if (cpu_features().avx512_bf16) cases.push_back({cpu.get(), DType::f32, true});
            for (const Case& c : cases) {
              Problem q = p;
              q.shape.bf16_products = c.bf16;
              const Result all = run(*c.be, c.dt, q, false);
              for (int64_t first : {T - 1, T / 2, T}) {
                const Result part = run(*c.be, c.dt, q, false, first);
                const std::string what = describe(q) + " first row " + std::to_string(first) +
                                         (c.be == ref.get() ? " reference " : " cpu ") +
                                         std::string(dtype_name(c.dt)) +
                                         (c.bf16 ? " bf16 products" : "");
                const int64_t C = s.heads * D;
                for (int64_t b = 0; b < s.batch; ++b) {
                  for (int64_t t = 0; t < T; ++t)
                    for (int64_t k = 0; k < C; ++k) {
                      const size_t i = static_cast<size_t>((b * T + t) * C + k);
                      ASSERT_EQ(part.out[i], t < first ? 7.0 : all.out[i]) << what << " out " << i;
                    }
                  for (int64_t h = 0; h < s.heads; ++h)
                    for (int64_t t = 0; t < T; ++t) {
                      const size_t i = static_cast<size_t>((b * s.heads + h) * T + t);
                      ASSERT_EQ(part.lse[i], t < first ? 7.0 : all.lse[i]) << what << " lse " << i;
                    }
                }
              }
            }
          }
  auto cpu_first = [&](int64_t first) {
    const Problem p = make_problem({.batch = 1, .seq = 5, .heads = 1, .head_dim = 4}, {}, 1);
    return error_of([&] { run(*cpu, DType::f32, p, false, first); });
  };
  EXPECT_NE(cpu_first(6).find("attention first row 6 of 5"), std::string::npos);
  EXPECT_NE(cpu_first(-1).find("attention first row -1 of 5"), std::string::npos);
}

// Every thread split of the pairs (and of backward's groups) gives the same bits: each is
// computed whole by one thread.
TEST(Attention, FusedDoesNotDependOnThreads) {
  auto cpu = make_cpu_backend();
  for (const AttentionShape& shape :
       {AttentionShape{.batch = 3, .seq = 100, .heads = 5, .head_dim = 40, .causal = true},
        AttentionShape{.batch = 3,
        .seq = 100,
        .heads = 6,
        .head_dim = 24,
        .causal = true,
        .kv_heads = 2,
        .window = 30}}) {
    const Problem p = make_problem(shape, {100, 37, 0}, 7);
    const Result all = run(*cpu, DType::f32, p);
    for (int64_t b = 0; b < 3; ++b) {  // batch row b alone
      const int64_t T = 100, C = shape.heads * shape.head_dim, W = shape.qkv_width();
      Problem one = p;
      one.shape.batch = 1;
      one.lengths = {p.lengths[b]};
      one.qkv.assign(p.qkv.begin() + b * T * W, p.qkv.begin() + (b + 1) * T * W);
      one.dout.assign(p.dout.begin() + b * T * C, p.dout.begin() + (b + 1) * T * C);
      const Result r = run(*cpu, DType::f32, one);
      EXPECT_TRUE(std::equal(r.out.begin(), r.out.end(), all.out.begin() + b * T * C));
      EXPECT_TRUE(std::equal(r.dqkv.begin(), r.dqkv.end(), all.dqkv.begin() + b * T * W));
    }
  }
}

// A NaN in q, k or v reaches every output, lse and gradient entry that it reaches in the
// reference: the softmax's exp must not turn it into a number.
TEST(Attention, NaNInputsStayNaN) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (bool causal : {true, false}) {
    const AttentionShape shape{.batch = 2, .seq = 40, .heads = 2, .head_dim = 24, .causal = causal};
    const int64_t T = shape.seq, D = shape.head_dim, C = shape.heads * D, W = shape.qkv_width();
    Problem p = make_problem(shape, {}, 11);
    p.qkv[static_cast<size_t>((0 * T + 10) * W + 1 * D + 3)] = nan;  // q: row 0, query 10, head 1
    p.qkv[static_cast<size_t>((1 * T + 20) * W + C + 0 * D + 5)] = nan;  // k: row 1, key 20, head 0
    p.qkv[static_cast<size_t>((1 * T + 30) * W + 2 * C + 1 * D + 7)] =
        nan;  // v: row 1, key 30, head 1
    const Result want = run(*ref, DType::f64, p), got = run(*cpu, DType::f32, p);
    for (const auto& [name, w, g] :
         {std::tuple{"out", &want.out, &got.out}, std::tuple{"lse", &want.lse, &got.lse},
          std::tuple{"dqkv", &want.dqkv, &got.dqkv}}) {
      const auto nans = std::count_if(w->begin(), w->end(), [](double x) { return std::isnan(x); });
      EXPECT_GT(nans, 0) << name;
      EXPECT_LT(nans, static_cast<std::ptrdiff_t>(w->size())) << name;
      for (size_t i = 0; i < w->size(); ++i)
        if (std::isnan((*w)[i])) {
          ASSERT_TRUE(std::isnan((*g)[i]))
              << name << "[" << i << "] = " << (*g)[i] << (causal ? ", causal" : "");
        }
    }
  }
}

// The reference's dqkv against central differences of L = sum(out * w), w = dout, in f64; with
// dropout too, whose mask depends only on the seed, so L stays a function of qkv.
TEST(Attention, ReferenceGradientMatchesFiniteDifferences) {
  auto ref = make_reference_backend();
  const Problem problems[] = {
      make_problem({.batch = 2, .seq = 5, .heads = 2, .head_dim = 3, .causal = true}, {3, 5}, 1),
      make_problem({.batch = 1, .seq = 4, .heads = 1, .head_dim = 2, .causal = false}, {}, 2),
      make_problem({.batch = 2, .seq = 6, .heads = 3, .head_dim = 2, .causal = false}, {0, 4}, 3),
      make_problem({.batch = 1, .seq = 7, .heads = 2, .head_dim = 4, .causal = true}, {}, 4, 3.0),
      make_problem({.batch = 2,
                    .seq = 6,
                    .heads = 4,
                    .head_dim = 2,
                    .causal = true,
                    .kv_heads = 2,
                    .window = 3},
                   {4, 6}, 5),
      make_problem(
          {.batch = 1, .seq = 7, .heads = 3, .head_dim = 3, .causal = false, .kv_heads = 1}, {}, 6),
      make_problem({.batch = 2,
                    .seq = 6,
                    .heads = 2,
                    .head_dim = 3,
                    .causal = true,
                    .kv_heads = 1,
                    .window = 4,
                    .softcap = 0.6},
                   {5, 6}, 7, 3.0),
      make_problem({.batch = 1, .seq = 5, .heads = 2, .head_dim = 4, .causal = false, .softcap = 2},
                   {}, 8, 3.0),
  };
  for (double dropout : {0.0, 0.3})
    for (Problem p : problems) {
      p.shape.dropout = dropout;
      p.shape.seed = 11;
      const std::string what = describe(p);
      const Result r = run(*ref, DType::f64, p);
      auto loss = [&](const std::vector<double>& qkv) {
        Problem q = p;
        q.qkv = qkv;
        const Result f = run(*ref, DType::f64, q, false);
        double l = 0;
        for (size_t i = 0; i < f.out.size(); ++i) l += f.out[i] * p.dout[i];
        return l;
      };
      std::vector<double> fd(p.qkv.size()), x = p.qkv;
      const double eps = 1e-5;
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = p.qkv[i] + eps;
        const double up = loss(x);
        x[i] = p.qkv[i] - eps;
        const double down = loss(x);
        x[i] = p.qkv[i];
        fd[i] = (up - down) / (2 * eps);
      }
      EXPECT_LE(max_rel_error(r.dqkv, fd), 1e-7) << what;
    }
}

// The keep-mask M (B, heads, T, T) that `be` draws, read out through the op: with q = 0 every key
// has probability 1 / T (full attention, no padding), and with head_dim = T and v_j = e_j,
// out_i = M_i / ((1 - p) T).
std::vector<char> dropout_mask(Backend& be, DType dt, int64_t B, int64_t H, int64_t T,
                               double dropout, uint64_t seed) {
  const int64_t C = H * T;
  Problem p{.shape = {.batch = B,
                      .seq = T,
                      .heads = H,
                      .head_dim = T,
                      .causal = false,
                      .scale = 1.0,
                      .dropout = dropout,
                      .seed = seed},
            .lengths = {},
            .qkv = std::vector<double>(static_cast<size_t>(B * T * 3 * C), 0.0),
            .dout = std::vector<double>(static_cast<size_t>(B * T * C), 0.0)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        p.qkv[static_cast<size_t>((b * T + t) * 3 * C + 2 * C + h * T + t)] = 1;
  const std::vector<double> out = run(be, dt, p, false).out;
  std::vector<char> mask(static_cast<size_t>(B * H * T * T));
  int64_t not_whole = 0;  // entries that are not 0 or 1
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) {
          const double m =
              out[static_cast<size_t>((b * T + i) * C + h * T + j)] * (1 - dropout) * T;
          not_whole += std::fabs(m - std::round(m)) > 1e-4;
          mask[static_cast<size_t>(((b * H + h) * T + i) * T + j)] = m > 0.5;
        }
  EXPECT_EQ(not_whole, 0) << be.name();
  return mask;
}

// The share of entries kept together with the entry `step` further on.
double both_kept(const std::vector<char>& m, size_t step) {
  size_t both = 0;
  for (size_t i = 0; i + step < m.size(); ++i) both += m[i] && m[i + step];
  return double(both) / double(m.size() - step);
}

// About 1 - p of the probabilities are kept, independently across keys, queries, heads and batch
// rows, and the fused kernel draws the reference's mask whatever its tiles and threads.
TEST(Attention, DropoutKeepsOneMinusPOfTheProbabilities) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  const int64_t B = 2, H = 2, T = 256;
  for (double p : {0.1, 0.5}) {
    const std::vector<char> m = dropout_mask(*cpu, DType::f32, B, H, T, p, 3);
    EXPECT_EQ(m, dropout_mask(*ref, DType::f64, B, H, T, p, 3)) << "dropout " << p;
    const double kept = double(std::count(m.begin(), m.end(), 1)) / double(m.size());
    EXPECT_NEAR(kept, 1 - p, 0.01) << "dropout " << p;
    const size_t T2 = static_cast<size_t>(T * T);
    // The next key, and the same key of the next query, head and batch row.
    for (size_t step : {size_t{1}, size_t(T), T2, size_t(H) * T2}) {
      const double both = both_kept(m, step);
      EXPECT_NEAR(both, (1 - p) * (1 - p), 0.01) << "dropout " << p << " step " << step;
    }
    std::printf("dropout %.1f: %.4f of %zu kept\n", p, kept, m.size());
  }
}

// The same seed gives the same bits, forward and backward; another seed another mask.
TEST(Attention, DropoutMaskIsAFunctionOfTheSeed) {
  auto cpu = make_cpu_backend();
  Problem p = make_problem(
      {.batch = 2, .seq = 70, .heads = 3, .head_dim = 24, .causal = true, .dropout = 0.2}, {70, 41},
      5);
  for (uint64_t seed : {0u, 9u}) {
    p.shape.seed = seed;
    const Result a = run(*cpu, DType::f32, p), b = run(*cpu, DType::f32, p);
    EXPECT_EQ(a.out, b.out) << seed;
    EXPECT_EQ(a.lse, b.lse) << seed;
    EXPECT_EQ(a.dqkv, b.dqkv) << seed;
  }
  const Result a = run(*cpu, DType::f32, p);
  p.shape.seed = 10;
  EXPECT_NE(a.out, run(*cpu, DType::f32, p).out);

  const double drop = 0.3;
  const std::vector<char> m1 = dropout_mask(*cpu, DType::f32, 1, 2, 128, drop, 1);
  const std::vector<char> m2 = dropout_mask(*cpu, DType::f32, 1, 2, 128, drop, 2);
  size_t differ = 0;
  for (size_t i = 0; i < m1.size(); ++i) differ += m1[i] != m2[i];
  EXPECT_NEAR(double(differ) / double(m1.size()), 2 * drop * (1 - drop), 0.02);
}

// Without dropout the seed changes nothing, in either kernel.
TEST(Attention, NoDropoutIgnoresTheSeed) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  Problem p = make_problem({.batch = 2, .seq = 40, .heads = 2, .head_dim = 20, .causal = true},
                           {40, 23}, 6);
  for (auto [be, dt] : {std::pair{ref.get(), DType::f64}, std::pair{cpu.get(), DType::f32}}) {
    p.shape.seed = 0;
    const Result a = run(*be, dt, p);
    p.shape.seed = 12345;
    const Result b = run(*be, dt, p);
    EXPECT_EQ(a.out, b.out) << be->name();
    EXPECT_EQ(a.lse, b.lse) << be->name();
    EXPECT_EQ(a.dqkv, b.dqkv) << be->name();
  }
}

TEST(Attention, DropoutOutsideZeroToOneIsAnError) {
  auto ref = make_reference_backend();
  for (double dropout : {1.0, -0.1}) {
    Problem p = make_problem({.batch = 1, .seq = 3, .heads = 1, .head_dim = 2}, {}, 7);
    p.shape.dropout = dropout;
    EXPECT_NE(test::error_of([&] { run(*ref, DType::f64, p); }).find("dropout"), std::string::npos)
        << dropout;
  }
}

}  // namespace
}  // namespace seqforge::attention_test
