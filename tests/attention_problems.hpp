#pragma once
// Attention problems for the kernel tests (attention_test.cpp, attention_gpu_test.cpp): random
// inputs of a shape, one forward and backward on a backend, the sweeps' shapes, and the checks
// against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/ops.hpp"
#include "seqforge/core/rng.hpp"
#include "test_util.hpp"

namespace seqforge::test::attention {

struct Problem {
  AttentionShape shape;
  std::vector<int64_t> lengths;  // (B), or empty for no padding
  std::vector<double> qkv;       // (B, T, W) W = shape.qkv_width()
  std::vector<double> dout;      // (B, T, C)
};

struct Result {
  std::vector<double> out;   // (B, T, C)
  std::vector<double> lse;   // (B, heads, T)
  std::vector<double> dqkv;  // (B, T, W)
};

inline std::vector<double> values(Rng& rng, int64_t n, double lo, double hi) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<float>(rng.uniform(lo, hi));  // exact in f32
  return v;
}

inline Problem make_problem(AttentionShape s, std::vector<int64_t> lengths, uint64_t seed,
                            double range = 1.5) {
  Rng rng(seed);
  const int64_t C = s.heads * s.head_dim;
  if (s.scale == 0) s.scale = 1.0 / std::sqrt(double(s.head_dim));
  return {s, std::move(lengths), values(rng, s.batch * s.seq * s.qkv_width(), -range, range),
          values(rng, s.batch * s.seq * C, -1, 1)};
}

// Forward (from query row first_row), then backward with dout, on `be` in `dt`; outputs start as
// garbage (7) so that every element has to be written.
inline Result run(Backend& be, DType dt, const Problem& p, bool backward = true,
                  int64_t first_row = 0) {
  const AttentionShape& s = p.shape;
  const int64_t B = s.batch, T = s.seq, C = s.heads * s.head_dim, W = s.qkv_width();
  auto garbage = [](int64_t n) { return std::vector<double>(static_cast<size_t>(n), 7.0); };
  HostTensor qkv(be, dt, {B, T, W}, p.qkv), out(be, dt, {B, T, C}, garbage(B * T * C)),
      lse(be, dt, {B, s.heads, T}, garbage(B * s.heads * T)), dout(be, dt, {B, T, C}, p.dout),
      dqkv(be, dt, {B, T, W}, garbage(B * T * W)), lengths;
  if (!p.lengths.empty())
    lengths =
        HostTensor(be, DType::i64, {B}, std::vector<double>(p.lengths.begin(), p.lengths.end()));
  const void* len = p.lengths.empty() ? nullptr : lengths.t.data();
  be.attention_forward({.shape = s,
                        .qkv = qkv.t.data(),
                        .lengths = len,
                        .out = out.t.data(),
                        .lse = lse.t.data(),
                        .first_row = first_row},
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
inline double lse_error(std::vector<double> got, std::vector<double> want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i]) return INFINITY;
      got[i] = want[i] = 0;
    }
  return max_rel_error(got, want);
}

// What the op description promises about padding: a query row with no key (a batch row without
// keys, or a row whose window lies past them) has out 0, lse -inf and gradient 0, and keys (and
// values) no query sees get gradient 0.
inline void expect_padding_zeros(const Problem& p, const Result& r, const std::string& what) {
  const AttentionShape& s = p.shape;
  const int64_t T = s.seq, D = s.head_dim, C = s.heads * D, W = s.qkv_width();
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t n = p.lengths.empty() ? T : std::min(p.lengths[b], T);
    for (int64_t t = 0; t < T; ++t) {
      const size_t row = static_cast<size_t>(b * T + t);
      if (s.first_key(t) >= s.last_key(t, n)) {  // no key
        for (int64_t c = 0; c < C; ++c) {
          ASSERT_EQ(r.out[row * C + c], 0.0) << what << " out b" << b << " t" << t;
          ASSERT_EQ(r.dqkv[row * W + c], 0.0) << what << " dq b" << b << " t" << t;
        }
        for (int64_t h = 0; h < s.heads; ++h)
          ASSERT_EQ(r.lse[static_cast<size_t>((b * s.heads + h) * T + t)],
                    -std::numeric_limits<double>::infinity())
              << what << " lse b" << b << " h" << h << " t" << t;
      }
      if (t >= n) {
        for (int64_t c = C; c < W; ++c)
          ASSERT_EQ(r.dqkv[row * W + c], 0.0) << what << " dk/dv b" << b << " t" << t;
      }
    }
  }
}

inline std::string describe(const Problem& p) {
  const AttentionShape& s = p.shape;
  std::ostringstream d;
  d << "B" << s.batch << " T" << s.seq << " heads" << s.heads << " D" << s.head_dim
    << (s.causal ? " causal" : " full") << " scale " << s.scale;
  if (s.kv() != s.heads) d << " kv_heads " << s.kv();
  if (s.window) d << " window " << s.window;
  if (s.softcap) d << " softcap " << s.softcap;
  if (s.dropout != 0) d << " dropout " << s.dropout << " seed " << s.seed;
  if (!p.lengths.empty()) {
    d << " lengths";
    for (int64_t n : p.lengths) d << " " << n;
  }
  return d.str();
}

// The case idx of a sweep: 1-3 batch rows, 1-6 heads, every seventh case with scores four times
// as large (and their rounding), and with padding, lengths of 0, about half, T - 1 and T.
inline AttentionShape sweep_shape(int idx, int64_t T, int64_t D, bool causal, bool* peaked) {
  AttentionShape s{
      .batch = 1 + (idx / 2) % 3, .seq = T, .heads = 1 + idx % 6, .head_dim = D, .causal = causal};
  *peaked = idx % 7 == 3;
  if (*peaked) s.scale = 4.0 / std::sqrt(double(D));
  return s;
}
inline std::vector<int64_t> sweep_lengths(int idx, int64_t B, int64_t T) {
  const int64_t choices[] = {0, (T + 1) / 2, std::max<int64_t>(T - 1, 1), T};
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < B; ++b) lengths.push_back(choices[(idx + b) % 4]);
  return lengths;
}

struct Errors {
  double out = 0, lse = 0, dqkv = 0;
};

// bf16 products (AVX512-BF16, or a GPU's tensor cores), or fp16 products (a GPU's tensor cores):
// `be`'s kernel with q, k, v, dO, P and dS rounded to the 16-bit type `products` and f32 sums,
// against the reference in f64 on the unrounded inputs: its error at most 4x (+ 2e-3) the error of
// the same reference on inputs rounded to that type (measured: at most 0.84 of that bound, dqkv;
// out 0.62, lse 0.33), so rounding, not a wrong index, explains it. Returns whether the result
// differs from the f32 kernel's (so that it is the 16-bit kernel that ran).
inline bool expect_within_product_rounding(Backend& ref, Backend& be, Problem p, Errors& worst,
                                           DType products = DType::bf16) {
  const std::string what = describe(p) + " " + std::string(dtype_name(products)) + " products";
  const Result want = run(ref, DType::f64, p), f32 = run(be, DType::f32, p);
  (products == DType::f16 ? p.shape.fp16_products : p.shape.bf16_products) = true;
  const Result got = run(be, DType::f32, p);
  // The same reference on the inputs rounded: the error rounding alone brings.
  auto round = [&](double x) {
    const float f = float(x);
    return products == DType::f16 ? double(from_f16(to_f16(f))) : double(from_bf16(to_bf16(f)));
  };
  Problem rounded = p;
  for (double& x : rounded.qkv) x = round(x);
  for (double& x : rounded.dout) x = round(x);
  const Result r = run(ref, DType::f64, rounded);
  const Errors e{max_rel_error(got.out, want.out), lse_error(got.lse, want.lse),
                 max_rel_error(got.dqkv, want.dqkv)};
  const Errors bound{4 * max_rel_error(r.out, want.out) + 2e-3,
                     4 * lse_error(r.lse, want.lse) + 2e-3,
                     4 * max_rel_error(r.dqkv, want.dqkv) + 2e-3};
  EXPECT_LE(e.out, bound.out) << what;
  EXPECT_LE(e.lse, bound.lse) << what;
  EXPECT_LE(e.dqkv, bound.dqkv) << what;
  expect_padding_zeros(p, got, what);
  worst.out = std::max(worst.out, e.out);
  worst.lse = std::max(worst.lse, e.lse);
  worst.dqkv = std::max(worst.dqkv, e.dqkv);
  return got.out != f32.out || got.dqkv != f32.dqkv;
}

// Grouped-query attention, sliding windows and soft-capping: case idx's shape has 2-6 query heads
// in groups of 1-4 key/value heads, when causal a window of none, 1, 7, about T / 3 or 64 keys,
// and every other case capped scores.
inline AttentionShape grouped_shape(int idx, int64_t T, int64_t D, bool causal, bool* peaked) {
  AttentionShape s = sweep_shape(idx, T, D, causal, peaked);
  const int64_t heads[] = {2, 4, 6, 6, 4, 3}, kv[] = {1, 2, 2, 3, 1, 3};
  s.heads = heads[idx % 6];
  s.kv_heads = kv[idx % 6];
  const int64_t windows[] = {0, 1, 7, T / 3 + 1, 64};
  if (causal) s.window = windows[(idx / 2) % 5];
  const double caps[] = {0, 0.7, 0, 3.0};  // Gemma's soft-capping, well inside the scores' range
  s.softcap = caps[idx % 4];
  return s;
}

}  // namespace seqforge::test::attention
