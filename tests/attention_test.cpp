// The attention kernels: the CPU backend's fused f32 kernel against the reference in f64 over
// many shapes (head sizes with and without vector tails, sequences across tile edges, causal or
// not, padded batch rows including empty ones), and the reference's gradient against central
// finite differences of sum(out * w).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/ops.hpp"
#include "seqforge/core/rng.hpp"
#include "test_util.hpp"

namespace seqforge {
namespace {

using test::HostTensor;
using test::max_rel_error;
using test::to_doubles;

struct Problem {
  AttentionShape shape;
  std::vector<int64_t> lengths;  // (B), or empty for no padding
  std::vector<double> qkv;       // (B, T, 3C)
  std::vector<double> dout;      // (B, T, C)
};

struct Result {
  std::vector<double> out;   // (B, T, C)
  std::vector<double> lse;   // (B, heads, T)
  std::vector<double> dqkv;  // (B, T, 3C)
};

std::vector<double> values(Rng& rng, int64_t n, double lo, double hi) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<float>(rng.uniform(lo, hi));  // exact in f32
  return v;
}

Problem make_problem(AttentionShape s, std::vector<int64_t> lengths, uint64_t seed,
                     double range = 1.5) {
  Rng rng(seed);
  const int64_t C = s.heads * s.head_dim;
  if (s.scale == 0) s.scale = 1.0 / std::sqrt(double(s.head_dim));
  return {s, std::move(lengths), values(rng, s.batch * s.seq * 3 * C, -range, range),
          values(rng, s.batch * s.seq * C, -1, 1)};
}

// Forward, then backward with dout, on `be` in `dt`; outputs start as garbage (7) so that every
// element has to be written.
Result run(Backend& be, DType dt, const Problem& p, bool backward = true) {
  const AttentionShape& s = p.shape;
  const int64_t B = s.batch, T = s.seq, C = s.heads * s.head_dim;
  auto garbage = [](int64_t n) { return std::vector<double>(static_cast<size_t>(n), 7.0); };
  HostTensor qkv(be, dt, {B, T, 3 * C}, p.qkv), out(be, dt, {B, T, C}, garbage(B * T * C)),
      lse(be, dt, {B, s.heads, T}, garbage(B * s.heads * T)), dout(be, dt, {B, T, C}, p.dout),
      dqkv(be, dt, {B, T, 3 * C}, garbage(B * T * 3 * C)), lengths;
  if (!p.lengths.empty())
    lengths =
        HostTensor(be, DType::i64, {B}, std::vector<double>(p.lengths.begin(), p.lengths.end()));
  const void* len = p.lengths.empty() ? nullptr : lengths.t.data();
  be.attention_forward(
      {.shape = s, .qkv = qkv.t.data(), .lengths = len, .out = out.t.data(), .lse = lse.t.data()},
      dt);
  Result r{to_doubles(be, out.t), to_doubles(be, lse.t), {}};
  if (!backward) return r;
  be.attention_backward({.shape = s,
                         .qkv = qkv.t.data(),
                         .lengths = len,
                         .out = out.t.data(),
                         .lse = lse.t.data(),
                         .dout = dout.t.data(),
                         .dqkv = dqkv.t.data()},
                        dt);
  r.dqkv = to_doubles(be, dqkv.t);
  return r;
}

// max_rel_error over the finite entries, and whether -inf stands at the same places.
double lse_error(std::vector<double> got, std::vector<double> want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i]) return INFINITY;
      got[i] = want[i] = 0;
    }
  return max_rel_error(got, want);
}

// What the op description promises about padding: a batch row with no keys has out 0 and lse
// -inf, and keys (and values) no query sees, and queries with no key, get gradient 0.
void expect_padding_zeros(const Problem& p, const Result& r, const std::string& what) {
  const AttentionShape& s = p.shape;
  const int64_t T = s.seq, D = s.head_dim, C = s.heads * D;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t n = p.lengths.empty() ? T : std::min(p.lengths[b], T);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const size_t row = static_cast<size_t>(b * T + t);
        if (n == 0) {
          ASSERT_EQ(r.out[row * C + c], 0.0) << what << " out b" << b << " t" << t;
          ASSERT_EQ(r.dqkv[row * 3 * C + c], 0.0) << what << " dq b" << b << " t" << t;
        }
        if (t >= n) {
          ASSERT_EQ(r.dqkv[row * 3 * C + C + c], 0.0) << what << " dk b" << b << " t" << t;
          ASSERT_EQ(r.dqkv[row * 3 * C + 2 * C + c], 0.0) << what << " dv b" << b << " t" << t;
        }
      }
    if (n == 0) {
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < T; ++t)
          ASSERT_EQ(r.lse[static_cast<size_t>((b * s.heads + h) * T + t)],
                    -std::numeric_limits<double>::infinity())
              << what;
    }
  }
}

std::string describe(const Problem& p) {
  const AttentionShape& s = p.shape;
  std::ostringstream d;
  d << "B" << s.batch << " T" << s.seq << " heads" << s.heads << " D" << s.head_dim
    << (s.causal ? " causal" : " full") << " scale " << s.scale;
  if (!p.lengths.empty()) {
    d << " lengths";
    for (int64_t n : p.lengths) d << " " << n;
  }
  return d.str();
}

// The fused kernel (CPU backend, f32) against the reference in f64 from the same inputs.
TEST(Attention, FusedMatchesReferenceOnManyShapes) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  double worst_out = 0, worst_lse = 0, worst_dqkv = 0;
  int count = 0;
  for (int64_t D : {1, 7, 16, 24, 64, 65})
    for (int64_t T : {1, 2, 17, 64, 130})
      for (bool causal : {true, false})
        for (bool padded : {false, true}) {
          const int idx = count++;
          AttentionShape s{.batch = 1 + (idx / 2) % 3,
                           .seq = T,
                           .heads = 1 + idx % 6,
                           .head_dim = D,
                           .causal = causal};
          const bool peaked = idx % 7 == 3;  // scores four times as large, and their rounding
          if (peaked) s.scale = 4.0 / std::sqrt(double(D));
          std::vector<int64_t> lengths;
          if (padded) {
            const int64_t choices[] = {0, (T + 1) / 2, std::max<int64_t>(T - 1, 1), T};
            for (int64_t b = 0; b < s.batch; ++b) lengths.push_back(choices[(idx + b) % 4]);
          }
          const Problem p = make_problem(s, lengths, 1000 + idx);
          const std::string what = describe(p);
          const Result want = run(*ref, DType::f64, p), got = run(*cpu, DType::f32, p);
          const double e_out = max_rel_error(got.out, want.out);
          const double e_lse = lse_error(got.lse, want.lse);
          const double e_dqkv = max_rel_error(got.dqkv, want.dqkv);
          const double tol = peaked ? 4e-5 : 2e-5;
          EXPECT_LE(e_out, tol) << what;
          EXPECT_LE(e_lse, tol) << what;
          EXPECT_LE(e_dqkv, tol) << what;
          expect_padding_zeros(p, want, "reference " + what);
          expect_padding_zeros(p, got, "cpu " + what);
          worst_out = std::max(worst_out, e_out);
          worst_lse = std::max(worst_lse, e_lse);
          worst_dqkv = std::max(worst_dqkv, e_dqkv);
        }
  std::printf("%d shapes; largest relative errors: out %.2e, lse %.2e, dqkv %.2e\n", count,
              worst_out, worst_lse, worst_dqkv);
}

// Every thread split of the pairs gives the same bits: each pair is computed whole by one thread.
TEST(Attention, FusedDoesNotDependOnThreads) {
  auto cpu = make_cpu_backend();
  const Problem p = make_problem(
      {.batch = 3, .seq = 100, .heads = 5, .head_dim = 40, .causal = true}, {100, 37, 0}, 7);
  const Result all = run(*cpu, DType::f32, p);
  for (int64_t b = 0; b < 3; ++b) {  // batch row b alone
    const int64_t T = 100, C = 200;
    Problem one = p;
    one.shape.batch = 1;
    one.lengths = {p.lengths[b]};
    one.qkv.assign(p.qkv.begin() + b * T * 3 * C, p.qkv.begin() + (b + 1) * T * 3 * C);
    one.dout.assign(p.dout.begin() + b * T * C, p.dout.begin() + (b + 1) * T * C);
    const Result r = run(*cpu, DType::f32, one);
    EXPECT_TRUE(std::equal(r.out.begin(), r.out.end(), all.out.begin() + b * T * C));
    EXPECT_TRUE(std::equal(r.dqkv.begin(), r.dqkv.end(), all.dqkv.begin() + b * T * 3 * C));
  }
}

// The reference's dqkv against central differences of L = sum(out * w), w = dout, in f64.
TEST(Attention, ReferenceGradientMatchesFiniteDifferences) {
  auto ref = make_reference_backend();
  const Problem problems[] = {
      make_problem({.batch = 2, .seq = 5, .heads = 2, .head_dim = 3, .causal = true}, {3, 5}, 1),
      make_problem({.batch = 1, .seq = 4, .heads = 1, .head_dim = 2, .causal = false}, {}, 2),
      make_problem({.batch = 2, .seq = 6, .heads = 3, .head_dim = 2, .causal = false}, {0, 4}, 3),
      make_problem({.batch = 1, .seq = 7, .heads = 2, .head_dim = 4, .causal = true}, {}, 4, 3.0),
  };
  for (const Problem& p : problems) {
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

}  // namespace
}  // namespace seqforge
