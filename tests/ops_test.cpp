// One driver for every backend op: each op runs on the backend under test (f32) and on the
// reference backend in f64 from the same inputs; the outputs must agree to f32 rounding.
// GEMMs are allowed the rounding of a K-term f32 sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>

#include "kernels/counter_hash.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/rng.hpp"
#include "test_util.hpp"

namespace seqforge::ops_test {
namespace {

using test::HostTensor;
using test::max_rel_error;
using test::to_doubles;

// An op case: builds its inputs from `rng` on `be` in `dt`, runs the op, returns named outputs.
using OpCase =
    std::function<std::map<std::string, std::vector<double>>(Backend& be, DType dt, Rng& rng)>;

std::vector<double> values(Rng& rng, int64_t n, double lo = -1, double hi = 1) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<float>(rng.uniform(lo, hi));  // exact in f32
  return v;
}

OpCase gemm_case(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t pad, float alpha,
                 float beta, bool bias = false) {
  return [=](Backend& be, DType dt, Rng& rng) {
    GemmShape s{.trans_a = ta,
                .trans_b = tb,
                .m = m,
                .n = n,
                .k = k,
                .lda = (ta ? m : k) + pad,
                .ldb = (tb ? k : n) + pad,
                .ldc = n + pad,
                .alpha = alpha,
                .beta = beta};
    HostTensor a(be, dt, {(ta ? k : m) * s.lda}, values(rng, (ta ? k : m) * s.lda));
    HostTensor b(be, dt, {(tb ? n : k) * s.ldb}, values(rng, (tb ? n : k) * s.ldb));
    HostTensor c(be, dt, {m * s.ldc}, values(rng, m * s.ldc));
    s.bias = bias;
    HostTensor bias_t(be, dt, {n}, values(rng, n));
    be.gemm(s, dt, a.t.data(), b.t.data(), c.t.data(), bias ? bias_t.t.data() : nullptr);
    return std::map<std::string, std::vector<double>>{{"c", to_doubles(be, c.t)}};
  };
}

// B packed once (backends without a packed layout leave it empty and run plain GEMMs), then used
// from the calling thread and from inside concurrent chains, with strided A and a bias.
OpCase packed_gemm_case(bool tb, int64_t m, int64_t n, int64_t k, int64_t pad, bool bias) {
  return [=](Backend& be, DType dt, Rng& rng) {
    const GemmShape s{.trans_b = tb,
                      .m = m,
                      .n = n,
                      .k = k,
                      .lda = k + pad,
                      .ldb = tb ? k : n,
                      .ldc = n,
                      .bias = bias};
    HostTensor a(be, dt, {m * s.lda}, values(rng, m * s.lda));
    HostTensor b(be, dt, {k * n}, values(rng, k * n)), bias_t(be, dt, {n}, values(rng, n));
    HostTensor c(be, dt, {m * n}, std::vector<double>(m * n));
    HostTensor c_chain(be, dt, {m * n}, std::vector<double>(m * n));
    const void* bias_p = bias ? bias_t.t.data() : nullptr;
    std::unique_ptr<PackedB> packed;
    be.pack_b(s, dt, b.t.data(), &packed);
    be.gemm(s, dt, a.t.data(), b.t.data(), packed.get(), c.t.data(), bias_p);
    be.run_concurrently(std::min(2, be.concurrency()), [&](int i) {
      if (i == 0) be.gemm(s, dt, a.t.data(), b.t.data(), packed.get(), c_chain.t.data(), bias_p);
    });
    return std::map<std::string, std::vector<double>>{{"c", to_doubles(be, c.t)},
                                                      {"c_in_chain", to_doubles(be, c_chain.t)}};
  };
}

// bf16 operands, f32 C: the CPU backend against the reference on identical bf16 inputs.
void check_bf16_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t pad, float beta) {
  auto cpu = make_cpu_backend();
  auto ref = make_reference_backend();
  Rng rng(9);
  GemmShape s{.trans_a = ta,
              .trans_b = tb,
              .m = m,
              .n = n,
              .k = k,
              .lda = (ta ? m : k) + pad,
              .ldb = (tb ? k : n) + pad,
              .ldc = n + pad,
              .beta = beta};
  const int64_t na = (ta ? k : m) * s.lda, nb = (tb ? n : k) * s.ldb, nc = m * s.ldc;
  std::vector<bf16> a(na), b(nb);
  for (auto& v : a) v = to_bf16(static_cast<float>(rng.uniform(-1, 1)));
  for (auto& v : b) v = to_bf16(static_cast<float>(rng.uniform(-1, 1)));
  std::vector<float> c0(nc);
  for (auto& v : c0) v = static_cast<float>(rng.uniform(-1, 1));
  std::vector<float> c_cpu = c0, c_ref = c0;
  cpu->gemm(s, DType::bf16, a.data(), b.data(), c_cpu.data());
  ref->gemm(s, DType::bf16, a.data(), b.data(), c_ref.data());
  EXPECT_LE(max_rel_error(std::vector<double>(c_cpu.begin(), c_cpu.end()),
                          std::vector<double>(c_ref.begin(), c_ref.end())),
            2e-5)
      << m << "x" << n << "x" << k << " ta " << ta << " tb " << tb;
}

// copy_transposed moves every element of a strided block to its transposed place and touches
// nothing else, for 2-, 4- and 8-byte elements: edges of the SIMD blocks, and enough rows for
// threads.
TEST(Ops, CopyTransposedMovesEveryElement) {
  struct Case {
    int64_t rows, cols, ld_src, ld_dst;
  };
  const Case cases[] = {{1, 1, 1, 1},
                        {8, 8, 8, 8},
                        {7, 9, 11, 10},
                        {37, 29, 40, 41},
                        {256, 512, 512, 38400 / 8},
                        {300, 130, 131, 333}};
  std::unique_ptr<Backend> backends[] = {make_cpu_backend(), make_reference_backend()};
  for (auto& be : backends)
    for (size_t e : {2, 4, 8})
      for (const Case& c : cases) {
        const DType dt = e == 2 ? DType::bf16 : e == 4 ? DType::f32 : DType::f64;
        std::vector<char> s(c.rows * c.ld_src * e), d(c.cols * c.ld_dst * e, 0);
        for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 131 + i / 7);
        std::vector<char> expect = d;
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t k = 0; k < c.cols; ++k)
            std::memcpy(&expect[(k * c.ld_dst + r) * e], &s[(r * c.ld_src + k) * e], e);
        be->copy_transposed(d.data(), c.ld_dst, s.data(), c.ld_src, c.rows, c.cols, dt);
        EXPECT_EQ(d, expect) << be->name() << " " << e << "-byte " << c.rows << "x" << c.cols;
      }
}

// Packed B: the same results as plain B, in f32 and bf16, with strided A, with and without a
// bias, from the main thread and from inside concurrent chains, and again after B changes and is
// repacked.
TEST(Ops, PackedGemmMatchesPlainGemm) {
  auto cpu = make_cpu_backend();
  Rng rng(5);
  struct Case {
    bool tb;
    int64_t m, n, k, lda;
    bool bias;
  };
  for (const Case& cs :
       {Case{true, 64, 512, 128, 256, false}, Case{false, 64, 128, 512, 512, false},
        Case{true, 7, 40, 10, 10, false}, Case{false, 33, 17, 68, 70, false},
        Case{true, 64, 512, 128, 128, true}, Case{true, 5, 24, 9, 9, true}})
    for (DType dt : {DType::f32, DType::bf16}) {
      if (dt == DType::bf16 && !test::cpu_runs_bf16()) continue;  // no bf16 GEMMs on this CPU
      const GemmShape s{.trans_b = cs.tb,
                        .m = cs.m,
                        .n = cs.n,
                        .k = cs.k,
                        .lda = cs.lda,
                        .ldb = cs.tb ? cs.k : cs.n,
                        .ldc = cs.n,
                        .bias = cs.bias};
      std::vector<float> bias(cs.n);
      for (float& v : bias) v = static_cast<float>(rng.uniform(-1, 1));
      const float* bias_or_null = cs.bias ? bias.data() : nullptr;
      const size_t esize = dtype_size(dt);
      std::vector<char> a(cs.m * cs.lda * esize), b(cs.k * cs.n * esize);
      auto fill = [&](std::vector<char>& v) {
        for (size_t i = 0; i < v.size() / esize; ++i) {
          const double x = rng.uniform(-1, 1);
          convert(&x, DType::f64, v.data() + i * esize, dt, 1);
        }
      };
      fill(a);
      std::unique_ptr<PackedB> packed;
      for (int round = 0; round < 2; ++round) {
        fill(b);
        cpu->pack_b(s, dt, b.data(), &packed);
        ASSERT_TRUE(packed) << "the CPU backend packs f32 and bf16";
        std::vector<float> plain(cs.m * cs.n), main_thread(cs.m * cs.n), in_chain(cs.m * cs.n);
        cpu->gemm(s, dt, a.data(), b.data(), plain.data(), bias_or_null);
        cpu->gemm(s, dt, a.data(), b.data(), packed.get(), main_thread.data(), bias_or_null);
        cpu->run_concurrently(std::min(2, cpu->concurrency()), [&](int i) {
          if (i == 0)
            cpu->gemm(s, dt, a.data(), b.data(), packed.get(), in_chain.data(), bias_or_null);
        });
        for (const auto* got : {&main_thread, &in_chain})
          EXPECT_LE(max_rel_error(std::vector<double>(got->begin(), got->end()),
                                  std::vector<double>(plain.begin(), plain.end())),
                    1e-5)
              << cs.m << "x" << cs.n << "x" << cs.k << " " << dtype_name(dt) << " round " << round;
      }
    }
}

// The SIMD cell's activations against the reference's std::tanh over pre-activations far into
// saturation, and a NaN stays a NaN.
TEST(Ops, LstmCellActivationsAreAccurateEverywhere) {
  auto cpu = make_cpu_backend();
  auto ref = make_reference_backend();
  const int64_t B = 3, H = 4000;
  std::vector<float> gates(B * 4 * H), c_prev(B * H);
  for (size_t i = 0; i < gates.size(); ++i)
    gates[i] = -40.0f + 80.0f * static_cast<float>(i % 4001) / 4000.0f;
  for (size_t i = 0; i < c_prev.size(); ++i) c_prev[i] = std::sin(0.37f * static_cast<float>(i));
  gates[5] = NAN;  // input gate of unit 5, row 0
  auto run = [&](Backend& be, std::vector<float>* g, std::vector<float>* h) {
    *g = gates;
    std::vector<float> c(B * H), tanh_c(B * H);
    h->assign(B * H, 0.0f);
    CellForward cell;
    cell.batch = B;
    cell.hidden = H;
    cell.gates = g->data();
    cell.c_prev = c_prev.data();
    cell.c = c.data();
    cell.saved = tanh_c.data();
    cell.h = h->data();
    cell.ldh = H;
    be.cell_forward(CellKind::lstm, cell, DType::f32);
  };
  std::vector<float> g_cpu, h_cpu, g_ref, h_ref;
  run(*cpu, &g_cpu, &h_cpu);
  run(*ref, &g_ref, &h_ref);
  EXPECT_TRUE(std::isnan(h_cpu[5]));
  double worst = 0;
  for (size_t i = 0; i < g_cpu.size(); ++i)
    if (i != 5) worst = std::max(worst, std::fabs(double(g_cpu[i]) - g_ref[i]));
  for (size_t i = 0; i < h_cpu.size(); ++i)
    if (i != 5) worst = std::max(worst, std::fabs(double(h_cpu[i]) - h_ref[i]));
  EXPECT_LT(worst, 1e-6);
}

// GELU in f32 on every backend against erfc in double, element by element over
// [-14, 14] (far into both tails): forward to a few ulp relative, where the value is a normal
// float; backward's derivative Phi(x) + x phi(x) to a few ulp of its terms' size (it crosses zero
// near x = -0.75); infinity and NaN as PyTorch gives them.
TEST(Ops, GeluIsAccurateElementByElement) {
  const int64_t n = 28001;
  std::vector<double> xs(n), ones(n, 1.0);
  for (int64_t i = 0; i < n; ++i)
    xs[i] = static_cast<float>(-14.0 + 28.0 * static_cast<double>(i) / (n - 1));
  int ran = 0;
  for (const BackendEntry& entry : registered_backends()) {
    if (!entry.usable()) continue;
    auto be = entry.make();
    if (!be->supports(Op::memory, DType::f32)) continue;
    HostTensor x(*be, DType::f32, {n}, xs), dy(*be, DType::f32, {n}, ones);
    HostTensor y(*be, DType::f32, {n}, std::vector<double>(n)),
        dx(*be, DType::f32, {n}, std::vector<double>(n));
    be->gelu_forward(y.t, x.t);
    be->gelu_backward(dx.t, dy.t, x.t);
    const std::vector<double> got_y = to_doubles(*be, y.t), got_d = to_doubles(*be, dx.t);
    double worst_y = 0, worst_d = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = xs[i], phi_cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
      const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
      const double want_y = v * phi_cdf, want_d = phi_cdf + v * pdf;
      if (phi_cdf < 1e-36) continue;  // below, flushed to zero or subnormal
      const double ey = want_y == 0 ? std::fabs(got_y[i]) : std::fabs(got_y[i] / want_y - 1);
      const double ed = std::fabs(got_d[i] - want_d) / (phi_cdf + std::fabs(v * pdf));
      worst_y = std::max(worst_y, ey);
      worst_d = std::max(worst_d, ed);
    }
    EXPECT_LT(worst_y, 2e-6) << entry.name;
    EXPECT_LT(worst_d, 2e-6) << entry.name;
    // GELU(inf) = inf and a NaN stays a NaN, as in PyTorch.
    HostTensor odd(*be, DType::f32, {2}, {INFINITY, NAN}), odd_y(*be, DType::f32, {2}, {0, 0});
    be->gelu_forward(odd_y.t, odd.t);
    const std::vector<double> got_odd = to_doubles(*be, odd_y.t);
    EXPECT_EQ(got_odd[0], INFINITY) << entry.name;
    EXPECT_TRUE(std::isnan(got_odd[1])) << entry.name;
    ++ran;
  }
  EXPECT_GE(ran, 2);
}

// Without an f32 dgates output the backward cell writes the same bf16 dgates and bias gradient
// as with one, on both backends.
TEST(Ops, LstmCellBackwardKeepsOnlyBf16Dgates) {
  const int64_t B = 300, H = 40;  // enough rows for the CPU backend to split them over threads
  Rng rng(3);
  auto fill = [&](int64_t n, double lo, double hi) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(rng.uniform(lo, hi));
    return v;
  };
  const auto gates = fill(B * 4 * H, 0.01, 0.99), c_prev = fill(B * H, -2, 2),
             tanh_c = fill(B * H, -0.9, 0.9), dh_out = fill(B * H, -1, 1), dc = fill(B * H, -1, 1),
             dbias0 = fill(4 * H, -1, 1);
  for (auto make : {make_cpu_backend, make_reference_backend}) {
    auto be = make();
    std::vector<bf16> low[2];
    std::vector<float> dbias[2], dc_out[2], dgates(B * 4 * H);
    for (int with_f32 = 0; with_f32 < 2; ++with_f32) {
      low[with_f32].resize(B * 4 * H);
      dbias[with_f32] = dbias0;
      dc_out[with_f32] = dc;
      be->cell_backward(CellKind::lstm,
                        {.batch = B,
                         .hidden = H,
                         .gates = gates.data(),
                         .c_prev = c_prev.data(),
                         .saved = tanh_c.data(),
                         .dh_out = dh_out.data(),
                         .ld_dh_out = H,
                         .dc = dc_out[with_f32].data(),
                         .dgates = with_f32 ? dgates.data() : nullptr,
                         .dgates_low = low[with_f32].data(),
                         .dbias = dbias[with_f32].data()},
                        DType::f32);
    }
    for (int64_t i = 0; i < B * 4 * H; ++i) {
      ASSERT_EQ(low[0][i].bits, low[1][i].bits) << be->name() << " element " << i;
      ASSERT_EQ(low[1][i].bits, to_bf16(dgates[i]).bits) << be->name() << " element " << i;
    }
    EXPECT_EQ(dbias[0], dbias[1]) << be->name();
    EXPECT_NE(dbias[0], dbias0) << be->name();
    EXPECT_EQ(dc_out[0], dc_out[1]) << be->name();
  }
}

// Activations kept in bf16: forward writes the bf16 of the activations it would keep in f32 (and
// the same c and h); backward from them equals backward from their f32 values, also when dG
// overwrites them in place.
TEST(Ops, LstmCellKeepsActivationsInBf16) {
  const int64_t B = 300, H = 37, I = 5;  // a vector tail, and rows split over threads
  Rng rng(8);
  auto fill = [&](int64_t n, double lo, double hi) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(rng.uniform(lo, hi));
    return v;
  };
  const auto pre = fill(B * 4 * H, -4, 4), rec = fill(B * 4 * H, -1, 1),
             c_prev = fill(B * H, -2, 2), x = fill(B * I, -1, 1), w_ih_t = fill(I * 4 * H, -1, 1),
             bias = fill(4 * H, -1, 1), dh_out = fill(B * H, -1, 1), dc0 = fill(B * H, -1, 1);
  for (auto make : {make_cpu_backend, make_reference_backend}) {
    auto be = make();
    for (bool narrow : {false, true}) {
      std::vector<float> gates = pre, scratch = pre, c[2], tanh_c[2], h[2];
      std::vector<bf16> low(B * 4 * H);
      for (int kept_low = 0; kept_low < 2; ++kept_low) {
        c[kept_low].resize(B * H);
        tanh_c[kept_low].resize(B * H);
        h[kept_low].resize(B * H);
        CellForward f{.batch = B,
                      .hidden = H,
                      .gates = kept_low ? (narrow ? nullptr : scratch.data()) : gates.data(),
                      .gates_low = kept_low ? low.data() : nullptr,
                      .gates_rec = rec.data(),
                      .c_prev = c_prev.data(),
                      .c = c[kept_low].data(),
                      .saved = tanh_c[kept_low].data(),
                      .h = h[kept_low].data(),
                      .ldh = H};
        if (narrow) {
          f.x = x.data();
          f.input = I;
          f.ldx = I;
          f.w_ih_t = w_ih_t.data();
          f.bias = bias.data();
        }
        be->cell_forward(CellKind::lstm, f, DType::f32);
      }
      for (int64_t i = 0; i < B * 4 * H; ++i)
        ASSERT_EQ(low[i].bits, to_bf16(gates[i]).bits) << be->name() << " element " << i;
      EXPECT_EQ(c[0], c[1]) << be->name();
      EXPECT_EQ(h[0], h[1]) << be->name();
      // Backward: from f32 activations equal to the bf16 ones, then from bf16 in place.
      std::vector<float> rounded(B * 4 * H), dgates(B * 4 * H), dc_f32 = dc0, dc_low = dc0;
      for (int64_t i = 0; i < B * 4 * H; ++i) rounded[i] = from_bf16(low[i]);
      std::vector<bf16> dg_low(B * 4 * H);
      be->cell_backward(CellKind::lstm,
                        {.batch = B,
                         .hidden = H,
                         .gates = rounded.data(),
                         .c_prev = c_prev.data(),
                         .saved = tanh_c[0].data(),
                         .dh_out = dh_out.data(),
                         .ld_dh_out = H,
                         .dc = dc_f32.data(),
                         .dgates = dgates.data(),
                         .dgates_low = dg_low.data()},
                        DType::f32);
      be->cell_backward(CellKind::lstm,
                        {.batch = B,
                         .hidden = H,
                         .gates_low = low.data(),
                         .c_prev = c_prev.data(),
                         .saved = tanh_c[0].data(),
                         .dh_out = dh_out.data(),
                         .ld_dh_out = H,
                         .dc = dc_low.data(),
                         .dgates_low = low.data()},
                        DType::f32);
      for (int64_t i = 0; i < B * 4 * H; ++i)
        ASSERT_EQ(low[i].bits, dg_low[i].bits) << be->name() << " element " << i;
      EXPECT_EQ(dc_f32, dc_low) << be->name();
    }
  }
}

TEST(Ops, Bf16GemmMatchesReference) {
  SF_SKIP_WITHOUT_BF16();
  check_bf16_gemm(false, true, 256, 512, 8, 0, 1.0f);
  check_bf16_gemm(false, true, 37, 96, 24, 0, 1.0f);
  check_bf16_gemm(false, true, 6, 96, 24, 24, 1.0f);
  check_bf16_gemm(false, false, 50, 24, 96, 0, 0.0f);
  check_bf16_gemm(true, false, 96, 24, 54, 24, 1.0f);
  check_bf16_gemm(false, false, 54, 5, 96, 0, 1.0f);
  check_bf16_gemm(true, false, 512, 4, 5003, 0, 1.0f);  // narrow: A streamed once
  check_bf16_gemm(true, false, 33, 16, 130, 2, 0.0f);
  check_bf16_gemm(true, false, 8, 384, 1000, 0, 1.0f);  // narrow A
  check_bf16_gemm(false, true, 300, 8, 385, 0, 0.0f);   // narrow B^T
  check_bf16_gemm(false, false, 61, 11, 200, 3, 1.0f);  // narrow B, transposed first
}

// input > 0: the cell projects an input of that width itself; no_dh_out: no output gradient.
OpCase lstm_cell_case(int64_t batch, int64_t hidden, int64_t ldh_pad, int64_t input = 0,
                      bool no_dh_out = false) {
  return [=](Backend& be, DType dt, Rng& rng) {
    const int64_t ldh = hidden + ldh_pad, ldx = input + 3;
    HostTensor gates(be, dt, {batch, 4 * hidden}, values(rng, batch * 4 * hidden, -4, 4));
    HostTensor x(be, dt, {batch * ldx + 1}, values(rng, batch * ldx + 1, -2, 2));
    HostTensor w_ih_t(be, dt, {input * 4 * hidden + 1}, values(rng, input * 4 * hidden + 1));
    HostTensor bias(be, dt, {4 * hidden}, values(rng, 4 * hidden));
    HostTensor c_prev(be, dt, {batch, hidden}, values(rng, batch * hidden, -2, 2));
    HostTensor c(be, dt, {batch, hidden}, std::vector<double>(batch * hidden));
    HostTensor tanh_c(be, dt, {batch, hidden}, std::vector<double>(batch * hidden));
    HostTensor h(be, dt, {batch, ldh}, std::vector<double>(batch * ldh));
    HostTensor rec(be, dt, {batch, 4 * hidden}, values(rng, batch * 4 * hidden, -1, 1));
    be.cell_forward(CellKind::lstm,
                    {.batch = batch,
                     .hidden = hidden,
                     .gates = gates.t.data(),
                     .gates_rec = rec.t.data(),
                     .c_prev = c_prev.t.data(),
                     .c = c.t.data(),
                     .saved = tanh_c.t.data(),
                     .h = h.t.data(),
                     .ldh = ldh,
                     .x = input ? x.t.data() : nullptr,
                     .input = input,
                     .ldx = ldx,
                     .w_ih_t = w_ih_t.t.data(),
                     .bias = bias.t.data()},
                    dt);
    HostTensor dh_out(be, dt, {batch, ldh}, values(rng, batch * ldh));
    HostTensor dh_rec(be, dt, {batch, hidden}, values(rng, batch * hidden));
    HostTensor dc(be, dt, {batch, hidden}, values(rng, batch * hidden));
    HostTensor dgates(be, dt, {batch, 4 * hidden}, std::vector<double>(batch * 4 * hidden));
    HostTensor dbias(be, dt, {4 * hidden}, values(rng, 4 * hidden));
    be.cell_backward(CellKind::lstm,
                     {.batch = batch,
                      .hidden = hidden,
                      .gates = gates.t.data(),
                      .c_prev = c_prev.t.data(),
                      .saved = tanh_c.t.data(),
                      .dh_out = no_dh_out ? nullptr : dh_out.t.data(),
                      .ld_dh_out = ldh,
                      .dh_rec = dh_rec.t.data(),
                      .dc = dc.t.data(),
                      .dgates = dgates.t.data(),
                      .dbias = dbias.t.data()},
                     dt);
    return std::map<std::string, std::vector<double>>{
        {"gates", to_doubles(be, gates.t)}, {"c", to_doubles(be, c.t)},
        {"h", to_doubles(be, h.t)},         {"dgates", to_doubles(be, dgates.t)},
        {"dc", to_doubles(be, dc.t)},       {"dbias", to_doubles(be, dbias.t)}};
  };
}

// A GRU step forward and backward. h_prev rows ld apart (the layer output), input > 0: the cell
// projects an input of that width itself; bias gradient of 6H columns (dG's, then dR's).
OpCase gru_cell_case(int64_t batch, int64_t hidden, int64_t ld_pad, int64_t input = 0,
                     bool no_dh_out = false) {
  return [=](Backend& be, DType dt, Rng& rng) {
    const int64_t H = hidden, ld = H + ld_pad, ldx = input + 3;
    HostTensor gates(be, dt, {batch, 3 * H}, values(rng, batch * 3 * H, -4, 4));
    HostTensor x(be, dt, {batch * ldx + 1}, values(rng, batch * ldx + 1, -2, 2));
    HostTensor w_ih_t(be, dt, {input * 3 * H + 1}, values(rng, input * 3 * H + 1));
    HostTensor bias(be, dt, {3 * H}, values(rng, 3 * H));
    HostTensor b_hn(be, dt, {H}, values(rng, H));
    HostTensor h_prev(be, dt, {batch, ld}, values(rng, batch * ld, -1, 1));
    HostTensor saved(be, dt, {batch, H}, std::vector<double>(batch * H));
    HostTensor h(be, dt, {batch, ld}, std::vector<double>(batch * ld));
    HostTensor rec(be, dt, {batch, 3 * H}, values(rng, batch * 3 * H, -2, 2));
    be.cell_forward(CellKind::gru,
                    {.batch = batch,
                     .hidden = H,
                     .gates = gates.t.data(),
                     .gates_rec = rec.t.data(),
                     .bias_rec = b_hn.t.data(),
                     .h_prev = h_prev.t.data(),
                     .ld_h_prev = ld,
                     .saved = saved.t.data(),
                     .h = h.t.data(),
                     .ldh = ld,
                     .x = input ? x.t.data() : nullptr,
                     .input = input,
                     .ldx = ldx,
                     .w_ih_t = w_ih_t.t.data(),
                     .bias = bias.t.data()},
                    dt);
    HostTensor dh_out(be, dt, {batch, ld}, values(rng, batch * ld));
    HostTensor dh(be, dt, {batch, H}, values(rng, batch * H));
    HostTensor dgates(be, dt, {batch, 3 * H}, std::vector<double>(batch * 3 * H));
    HostTensor dgates_rec(be, dt, {batch, 3 * H}, std::vector<double>(batch * 3 * H));
    HostTensor dbias(be, dt, {6 * H}, values(rng, 6 * H));
    be.cell_backward(CellKind::gru,
                     {.batch = batch,
                      .hidden = H,
                      .gates = gates.t.data(),
                      .saved = saved.t.data(),
                      .h_prev = h_prev.t.data(),
                      .ld_h_prev = ld,
                      .dh_out = no_dh_out ? nullptr : dh_out.t.data(),
                      .ld_dh_out = ld,
                      .dh_rec = dh.t.data(),
                      .dgates = gates.t.data(),  // in place, as the engine does
                      .dgates_rec = dgates_rec.t.data(),
                      .dh_direct = dh.t.data(),  // in place
                      .dbias = dbias.t.data()},
                     dt);
    return std::map<std::string, std::vector<double>>{
        {"h", to_doubles(be, h.t)},          {"saved", to_doubles(be, saved.t)},
        {"dgates", to_doubles(be, gates.t)}, {"dgates_rec", to_doubles(be, dgates_rec.t)},
        {"dh_direct", to_doubles(be, dh.t)}, {"dbias", to_doubles(be, dbias.t)}};
  };
}

// A layer-normalised LSTM step forward and backward (its own parameters: gains and the cell
// norm's bias; a bias gradient of 18H columns).
OpCase lnlstm_cell_case(int64_t batch, int64_t hidden, int64_t ldh_pad, bool no_dh_out = false) {
  return [=](Backend& be, DType dt, Rng& rng) {
    const int64_t H = hidden, N = 4 * H, ldh = H + ldh_pad, W = 10 * H + 3;
    HostTensor gates(be, dt, {batch, N}, values(rng, batch * N, -3, 3));
    HostTensor rec(be, dt, {batch, N}, values(rng, batch * N, -2, 2));
    HostTensor bias(be, dt, {N}, values(rng, N));
    HostTensor own(be, dt, {10 * H}, values(rng, 10 * H, 0.5, 1.5));
    HostTensor c_prev(be, dt, {batch, H}, values(rng, batch * H, -2, 2));
    HostTensor c(be, dt, {batch, H}, std::vector<double>(batch * H));
    HostTensor saved(be, dt, {batch, W}, std::vector<double>(batch * W));
    HostTensor h(be, dt, {batch, ldh}, std::vector<double>(batch * ldh));
    be.cell_forward(CellKind::lnlstm,
                    {.batch = batch,
                     .hidden = H,
                     .gates = gates.t.data(),
                     .gates_rec = rec.t.data(),
                     .c_prev = c_prev.t.data(),
                     .c = c.t.data(),
                     .saved = saved.t.data(),
                     .params = own.t.data(),
                     .h = h.t.data(),
                     .ldh = ldh,
                     .bias = bias.t.data()},
                    dt);
    HostTensor dh_out(be, dt, {batch, ldh}, values(rng, batch * ldh));
    HostTensor dh_rec(be, dt, {batch, H}, values(rng, batch * H));
    HostTensor dc(be, dt, {batch, H}, values(rng, batch * H));
    HostTensor dgates_rec(be, dt, {batch, N}, std::vector<double>(batch * N));
    HostTensor dbias(be, dt, {18 * H}, values(rng, 18 * H));
    be.cell_backward(CellKind::lnlstm,
                     {.batch = batch,
                      .hidden = H,
                      .gates = gates.t.data(),
                      .c_prev = c_prev.t.data(),
                      .saved = saved.t.data(),
                      .params = own.t.data(),
                      .dh_out = no_dh_out ? nullptr : dh_out.t.data(),
                      .ld_dh_out = ldh,
                      .dh_rec = dh_rec.t.data(),
                      .dc = dc.t.data(),
                      .dgates = gates.t.data(),  // in place, as the engine does
                      .dgates_rec = dgates_rec.t.data(),
                      .dbias = dbias.t.data()},
                     dt);
    return std::map<std::string, std::vector<double>>{
        {"c", to_doubles(be, c.t)},         {"h", to_doubles(be, h.t)},
        {"saved", to_doubles(be, saved.t)}, {"dgates", to_doubles(be, gates.t)},
        {"dc", to_doubles(be, dc.t)},       {"dgates_rec", to_doubles(be, dgates_rec.t)},
        {"dbias", to_doubles(be, dbias.t)}};
  };
}

OpCase adam_case(bool decoupled, int64_t step, int64_t n) {
  return [=](Backend& be, DType dt, Rng& rng) {
    HostTensor p(be, dt, {n}, values(rng, n)), g(be, dt, {n}, values(rng, n, -1e-3, 1e-3)),
        m(be, dt, {n}, values(rng, n, -1e-3, 1e-3)), v(be, dt, {n}, values(rng, n, 0, 1e-6));
    be.adam_step(
        p.t, g.t, m.t, v.t,
        {.lr = 1e-2, .weight_decay = 0.1, .decoupled = decoupled, .step = step, .grad_scale = 0.5});
    return std::map<std::string, std::vector<double>>{
        {"p", to_doubles(be, p.t)}, {"m", to_doubles(be, m.t)}, {"v", to_doubles(be, v.t)}};
  };
}

OpCase sgd_case(bool nesterov, bool first, int64_t n) {
  return [=](Backend& be, DType dt, Rng& rng) {
    HostTensor p(be, dt, {n}, values(rng, n)), g(be, dt, {n}, values(rng, n)),
        buf(be, dt, {n}, values(rng, n));
    be.sgd_step(p.t, g.t, buf.t,
                {.lr = 0.1,
                 .momentum = 0.9,
                 .dampening = nesterov ? 0.0 : 0.2,
                 .weight_decay = 1e-2,
                 .nesterov = nesterov,
                 .first_step = first});
    return std::map<std::string, std::vector<double>>{{"p", to_doubles(be, p.t)},
                                                      {"buf", to_doubles(be, buf.t)}};
  };
}

// The whole update over arenas in segments: weight decay on some, one frozen, update counts that
// differ, values laid out apart from the gradients, padding between segments (left as it is),
// segments across the CUDA kernel's tiles; clipping from a sum of squares in backend memory, or an
// overflowed step that only zeroes the gradients and counts nothing. Two steps, the second from
// the counts the first left.
OpCase optimizer_case(OptimizerKind kind, bool overflow) {
  return [=](Backend& be, DType dt, Rng& rng) {
    using S = OptimizerSegment;
    const std::vector<OptimizerSegment> segments = {{0, 0, 30, S::kDecays},
                                                    {40, 32, 17, 0},
                                                    {60, 50, 40, S::kFrozen | S::kDecays},
                                                    {120, 96, 9000, S::kDecays},
                                                    {9130, 9100, 1, 0}};
    const int64_t nv = 9140, ng = 9104;
    HostTensor p(be, dt, {nv}, values(rng, nv)), g(be, dt, {ng}, values(rng, ng, -1e-2, 1e-2)),
        m(be, dt, {ng}, values(rng, ng, -1e-3, 1e-3)), v(be, dt, {ng}, values(rng, ng, 0, 1e-5));
    std::vector<double> table;
    for (const OptimizerSegment& seg : segments)
      table.insert(table.end(), {double(seg.value_offset), double(seg.grad_offset),
                                 double(seg.numel), double(seg.flags)});
    const auto count = static_cast<int64_t>(segments.size());
    HostTensor seg_t(be, DType::i64, {count, 4}, table);
    HostTensor steps(be, DType::i64, {count}, {4, 0, 2, 9, 0});
    HostTensor lr(be, DType::f64, {1}, {kind == OptimizerKind::sgd ? 0.1 : 1e-2});
    HostTensor sum_squares(be, DType::f64, {1}, {overflow ? INFINITY : 3.0});
    OptimizerStep a;
    a.kind = kind;
    a.momentum = 0.9;
    a.dampening = 0.1;
    a.weight_decay = 0.1;
    a.grad_scale = 0.5;
    a.clip = {.sum_squares = static_cast<const double*>(sum_squares.t.data()),
              .loss_scale = 2.0,
              .max_norm = 0.5,
              .skip_nonfinite = true};
    a.zero_grads = true;
    a.params = p.t.data();
    a.grads = g.t.data();
    a.m = m.t.data();
    a.v = kind == OptimizerKind::sgd ? nullptr : v.t.data();
    a.grad_elements = ng;
    a.segments = static_cast<const OptimizerSegment*>(seg_t.t.data());
    a.segment_count = count;
    a.steps = static_cast<int64_t*>(steps.t.data());
    a.lr = static_cast<const double*>(lr.t.data());
    for (int k = 0; k < 2; ++k) be.optimizer_step(a, dt);
    return std::map<std::string, std::vector<double>>{{"p", to_doubles(be, p.t)},
                                                      {"grads", to_doubles(be, g.t)},
                                                      {"m", to_doubles(be, m.t)},
                                                      {"v", to_doubles(be, v.t)},
                                                      {"steps", to_doubles(be, steps.t)}};
  };
}

OpCase small_ops_case() {
  return [](Backend& be, DType dt, Rng& rng) {
    std::map<std::string, std::vector<double>> out;
    HostTensor y(be, dt, {37, 19}, values(rng, 37 * 19));
    HostTensor dy(be, dt, {37, 19}, values(rng, 37 * 19)), db(be, dt, {19}, values(rng, 19));
    be.sum_rows_acc(db.t, dy.t);
    out["sum_rows_acc"] = to_doubles(be, db.t);
    be.add(y.t, dy.t);
    out["add"] = to_doubles(be, y.t);
    HostTensor src(be, dt, {5, 7, 3}, values(rng, 105)), dst(be, dt, {7, 5, 3}, values(rng, 105));
    be.transpose01(dst.t, src.t);
    out["transpose01"] = to_doubles(be, dst.t);
    HostTensor mat(be, dt, {70, 45, 1}, values(rng, 70 * 45)),
        mat_t(be, dt, {45, 70, 1}, values(rng, 70 * 45));
    be.transpose01(mat_t.t, mat.t);  // a matrix: one element per row, in tiles
    out["transpose01_matrix"] = to_doubles(be, mat_t.t);
    HostTensor wide(be, dt, {300, 200, 3}, values(rng, 180000)),
        wide_t(be, dt, {200, 300, 3}, values(rng, 180000));
    be.transpose01(wide_t.t, wide.t);  // enough rows for threads
    out["transpose01_threads"] = to_doubles(be, wide_t.t);
    // Rows 0..36, columns 0..39 of a (37, 41) matrix, transposed into a (40, 45) one.
    HostTensor ct_src(be, dt, {37, 41}, values(rng, 37 * 41)),
        ct_dst(be, dt, {40, 45}, values(rng, 40 * 45));
    be.copy_transposed(ct_dst.t.data(), 45, ct_src.t.data(), 41, 37, 40, dt);
    out["copy_transposed"] = to_doubles(be, ct_dst.t);
    HostTensor mask(be, dt, {1000}, std::vector<double>(1000));
    be.dropout_mask(mask.t, 0.25, 1234);
    out["dropout_mask"] = to_doubles(be, mask.t);
    HostTensor pred(be, dt, {12, 3}, values(rng, 36)), target(be, dt, {12, 3}, values(rng, 36)),
        rows(be, dt, {12}, {1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1}),
        dpred(be, dt, {12, 3}, std::vector<double>(36));
    out["mse_loss"] = {be.mse_loss(pred.t, target.t, rows.t, dpred.t)};
    out["mse_grad"] = to_doubles(be, dpred.t);
    HostTensor logits(be, dt, {9, 65}, values(rng, 9 * 65, -5, 5)),
        dlogits(be, dt, {9, 65}, std::vector<double>(9 * 65)),
        w(be, dt, {65}, values(rng, 65, 0.5, 2));
    HostTensor targets(be, DType::i32, {9}, {0, 64, 3, -1, 7, 7, 12, 40, 1});
    out["ce_loss"] = {be.cross_entropy_loss(logits.t, targets.t, w.t, -1, dlogits.t)};
    out["ce_grad"] = to_doubles(be, dlogits.t);
    HostTensor table(be, dt, {11, 6}, values(rng, 66)),
        emb(be, dt, {8, 6}, std::vector<double>(48));
    HostTensor ids(be, DType::i64, {8}, {10, 0, 3, 3, 5, 9, 0, 1});
    const Tensor ids_t = ids.t;
    be.embedding_forward(emb.t, table.t, ids_t);
    out["embedding_forward"] = to_doubles(be, emb.t);
    be.embedding_backward(table.t, emb.t, ids_t);
    out["embedding_backward"] = to_doubles(be, table.t);
    out["sum_squares"] = {be.sum_squares(table.t)};
    be.scale(table.t, -0.5);
    out["scale"] = to_doubles(be, table.t);
    // The adapters' column scaling (with and without a bias) and DoRA's row norms.
    HostTensor sc_x(be, dt, {40, 13}, values(rng, 520)), sc_s(be, dt, {13}, values(rng, 13)),
        sc_b(be, dt, {13}, values(rng, 13)), sc_y(be, dt, {40, 13}, std::vector<double>(520));
    be.scale_columns(sc_y.t, sc_x.t, sc_s.t, sc_b.t);
    out["scale_columns_bias"] = to_doubles(be, sc_y.t);
    // Into columns 5..17 of rows 30 wide: written, then added to in place, then written as the
    // sum with columns 2..14 of another such block; the other columns untouched.
    HostTensor sc_wide(be, dt, {40, 30}, values(rng, 1200)),
        sc_other(be, dt, {40, 30}, values(rng, 1200));
    const auto at_column = [&](const HostTensor& h, int64_t c) {
      return Tensor(static_cast<std::byte*>(h.t.data()) + c * dtype_size(dt), dt, {40, 13});
    };
    be.scale_columns(at_column(sc_wide, 5), sc_x.t, sc_s.t, sc_b.t, 30);
    out["scale_columns_strided"] = to_doubles(be, sc_wide.t);
    be.scale_columns(at_column(sc_wide, 5), sc_x.t, sc_s.t, {}, 30, at_column(sc_wide, 5).data());
    out["scale_columns_strided_added"] = to_doubles(be, sc_wide.t);
    be.scale_columns(at_column(sc_wide, 5), sc_x.t, sc_s.t, sc_b.t, 30,
                     at_column(sc_other, 2).data());
    out["scale_columns_strided_addend"] = to_doubles(be, sc_wide.t);
    be.scale_columns(sc_x.t, sc_x.t, sc_s.t, {});
    out["scale_columns_in_place"] = to_doubles(be, sc_x.t);
    HostTensor dn_v(be, dt, {9, 31}, values(rng, 279)), dn_m(be, dt, {9}, values(rng, 9, 0.5, 2)),
        dn_scale(be, dt, {9}, std::vector<double>(9)), dn_inv(be, dt, {9}, std::vector<double>(9));
    be.dora_norm(dn_scale.t, dn_inv.t, dn_v.t, dn_m.t);
    out["dora_norm_scale"] = to_doubles(be, dn_scale.t);
    out["dora_norm_inv"] = to_doubles(be, dn_inv.t);
    // DoRA's backward through the column scaling: rows enough for both threads, dm accumulating.
    HostTensor db_dy(be, dt, {300, 21}, values(rng, 6300)),
        db_pre(be, dt, {300, 21}, values(rng, 6300)), db_scale(be, dt, {21}, values(rng, 21)),
        db_inv(be, dt, {21}, values(rng, 21, 0.5, 2)), db_dm(be, dt, {21}, values(rng, 21)),
        db_dpre(be, dt, {300, 21}, std::vector<double>(6300));
    be.dora_backward(db_dpre.t, db_dm.t, db_dy.t, db_pre.t, db_scale.t, db_inv.t);
    out["dora_backward_dpre"] = to_doubles(be, db_dpre.t);
    out["dora_backward_dm"] = to_doubles(be, db_dm.t);
    // ... with dy the columns 3..23 of rows 29 wide.
    HostTensor db_wide(be, dt, {300, 29}, values(rng, 300 * 29));
    be.dora_backward(
        db_dpre.t, db_dm.t,
        Tensor(static_cast<std::byte*>(db_wide.t.data()) + 3 * dtype_size(dt), dt, {300, 21}),
        db_pre.t, db_scale.t, db_inv.t, 29);
    out["dora_backward_strided_dpre"] = to_doubles(be, db_dpre.t);
    out["dora_backward_strided_dm"] = to_doubles(be, db_dm.t);
    // Layer norm (rows wide enough for several SIMD blocks and a tail, and threads) and GELU.
    HostTensor ln_x(be, dt, {70, 37}, values(rng, 70 * 37, -3, 3)),
        ln_w(be, dt, {37}, values(rng, 37, 0.5, 1.5)), ln_b(be, dt, {37}, values(rng, 37)),
        ln_y(be, dt, {70, 37}, std::vector<double>(70 * 37)),
        ln_saved(be, dt, {70, 2}, std::vector<double>(140)),
        ln_dy(be, dt, {70, 37}, values(rng, 70 * 37)),
        ln_dx(be, dt, {70, 37}, std::vector<double>(70 * 37)), ln_dw(be, dt, {37}, values(rng, 37)),
        ln_db(be, dt, {37}, values(rng, 37));
    be.layer_norm_forward(ln_y.t, ln_saved.t, ln_x.t, ln_w.t, ln_b.t, 1e-5);
    out["layer_norm_forward"] = to_doubles(be, ln_y.t);
    be.layer_norm_backward(ln_dx.t, ln_dw.t, ln_db.t, ln_dy.t, ln_x.t, ln_w.t, ln_saved.t);
    out["layer_norm_dx"] = to_doubles(be, ln_dx.t);
    out["layer_norm_dw"] = to_doubles(be, ln_dw.t);
    out["layer_norm_db"] = to_doubles(be, ln_db.t);
    // dx joined by a residual stream's gradient in the same pass.
    HostTensor ln_res(be, dt, {70, 37}, values(rng, 70 * 37));
    be.layer_norm_backward(ln_dx.t, ln_dw.t, ln_db.t, ln_dy.t, ln_x.t, ln_w.t, ln_saved.t,
                           ln_res.t);
    out["layer_norm_dx_residual"] = to_doubles(be, ln_dx.t);
    // Rows wider than the parameter gradients' column chunk (512 per thread), with a tail.
    HostTensor wide_x(be, dt, {45, 1100}, values(rng, 45 * 1100, -3, 3)),
        wide_w(be, dt, {1100}, values(rng, 1100, 0.5, 1.5)),
        wide_b(be, dt, {1100}, values(rng, 1100)),
        wide_y(be, dt, {45, 1100}, std::vector<double>(45 * 1100)),
        wide_saved(be, dt, {45, 2}, std::vector<double>(90)),
        wide_dy(be, dt, {45, 1100}, values(rng, 45 * 1100)),
        wide_dx(be, dt, {45, 1100}, std::vector<double>(45 * 1100)),
        wide_dw(be, dt, {1100}, values(rng, 1100)), wide_db(be, dt, {1100}, values(rng, 1100));
    be.layer_norm_forward(wide_y.t, wide_saved.t, wide_x.t, wide_w.t, wide_b.t, 1e-5);
    be.layer_norm_backward(wide_dx.t, wide_dw.t, wide_db.t, wide_dy.t, wide_x.t, wide_w.t,
                           wide_saved.t);
    out["layer_norm_wide_dx"] = to_doubles(be, wide_dx.t);
    out["layer_norm_wide_dw"] = to_doubles(be, wide_dw.t);
    out["layer_norm_wide_db"] = to_doubles(be, wide_db.t);
    HostTensor g_x(be, dt, {1000}, values(rng, 1000, -6, 6)),
        g_y(be, dt, {1000}, std::vector<double>(1000)), g_dy(be, dt, {1000}, values(rng, 1000)),
        g_dx(be, dt, {1000}, std::vector<double>(1000));
    be.gelu_forward(g_y.t, g_x.t);
    out["gelu_forward"] = to_doubles(be, g_y.t);
    be.gelu_backward(g_dx.t, g_dy.t, g_x.t);
    out["gelu_backward"] = to_doubles(be, g_dx.t);
    // Mapped per column (DoRA's scaling fused) on rows of 45 with threads: scale and bias, the
    // scale's gradient, the backward in place; then a scale alone.
    const int64_t GR = 70, GC = 45;
    HostTensor m_x(be, dt, {GR, GC}, values(rng, GR * GC, -3, 3)),
        m_y(be, dt, {GR, GC}, std::vector<double>(GR * GC)),
        m_d(be, dt, {GR, GC}, values(rng, GR * GC)), m_s(be, dt, {GC}, values(rng, GC, -2, 2)),
        m_b(be, dt, {GC}, values(rng, GC)), m_ds(be, dt, {GC}, values(rng, GC));
    be.gelu_forward(m_y.t, m_x.t, {.scale = m_s.t, .bias = m_b.t});
    out["gelu_forward_mapped"] = to_doubles(be, m_y.t);
    be.gelu_backward(m_d.t, m_d.t, m_x.t, {.scale = m_s.t, .bias = m_b.t, .dscale = m_ds.t});
    out["gelu_backward_mapped"] = to_doubles(be, m_d.t);
    out["gelu_dscale"] = to_doubles(be, m_ds.t);
    be.gelu_forward(m_y.t, m_x.t, {.scale = m_s.t});
    out["gelu_forward_scaled"] = to_doubles(be, m_y.t);
    // Elementwise product, fill, copy, strided row copies and dtype conversions.
    const std::vector<double> av = values(rng, 257), bv = values(rng, 257);
    HostTensor a(be, dt, {257}, av), b(be, dt, {257}, bv),
        product(be, dt, {257}, std::vector<double>(257));
    be.mul(product.t, a.t, b.t);
    out["mul"] = to_doubles(be, product.t);
    HostTensor filled(be, dt, {33}, std::vector<double>(33));
    be.fill(filled.t, -1.25);
    out["fill"] = to_doubles(be, filled.t);
    HostTensor copied(be, dt, {257}, std::vector<double>(257));
    be.copy(copied.t, a.t);
    out["copy"] = to_doubles(be, copied.t);
    HostTensor strided(be, dt, {60}, values(rng, 60)),
        packed(be, dt, {30}, std::vector<double>(30));
    be.copy_rows(packed.t.data(), 5, strided.t.data(), 10, 6, 4, dt);  // 4 of every 10, 5 apart
    out["copy_rows"] = to_doubles(be, packed.t);
    std::vector<double> sixty_fourths(257);  // exact in bf16's 8 bits: the same on every path
    for (size_t i = 0; i < sixty_fourths.size(); ++i)
      sixty_fourths[i] = std::round(av[i] * 64) / 64;
    HostTensor exact(be, dt, {257}, sixty_fourths),
        wide64(be, DType::f64, {257}, std::vector<double>(257)),
        narrow(be, DType::bf16, {257}, std::vector<double>(257)),
        back(be, dt, {257}, std::vector<double>(257));
    be.convert(wide64.t, a.t);
    out["convert_to_f64"] = to_doubles(be, wide64.t);
    be.convert(narrow.t, exact.t);
    be.convert(back.t, narrow.t);
    out["convert_bf16_round_trip"] = to_doubles(be, back.t);
    return out;
  };
}

// Attention forward then backward over packed qkv; optional padding lengths (B). lse is compared
// with -inf (rows with no key) replaced by 0, and where it is -inf as an output of its own.
// Attention forward and backward; with first_row, forward only over rows [first_row, T) (a
// decoding step), the earlier rows' outputs left as they were.
// kv_heads and window: grouped-query attention and a sliding window.
struct AttentionOptions {
  std::vector<int64_t> lengths{};
  double dropout = 0.0;
  int64_t first_row = 0;
  int64_t kv_heads = 0, window = 0;
  double softcap = 0;
};

// The decoders' ops: RMS norm (Llama's w and Gemma's 1 + w, rows wide enough for the column
// chunks), rotary embeddings on heads inside wider rows, both gated activations and
// soft-capping.
OpCase decoder_ops_case() {
  return [](Backend& be, DType dt, Rng& rng) {
    std::map<std::string, std::vector<double>> out;
    for (const double offset : {0.0, 1.0}) {
      const std::string tag = offset == 0 ? "" : "_offset1";
      const int64_t N = 70, C = 1100;
      HostTensor x(be, dt, {N, C}, values(rng, N * C, -3, 3)),
          w(be, dt, {C}, values(rng, C, 0.5, 1.5)), y(be, dt, {N, C}, std::vector<double>(N * C)),
          saved(be, dt, {N}, std::vector<double>(N)), dy(be, dt, {N, C}, values(rng, N * C)),
          dx(be, dt, {N, C}, std::vector<double>(N * C)), dw(be, dt, {C}, values(rng, C));
      be.rms_norm_forward(y.t, saved.t, x.t, w.t, offset, 1e-6);
      out["rms_norm_forward" + tag] = to_doubles(be, y.t);
      be.rms_norm_backward(dx.t, dw.t, dy.t, x.t, w.t, offset, saved.t);
      out["rms_norm_dx" + tag] = to_doubles(be, dx.t);
      out["rms_norm_dw" + tag] = to_doubles(be, dw.t);
      HostTensor res(be, dt, {N, C}, values(rng, N * C));
      be.rms_norm_backward(dx.t, dw.t, dy.t, x.t, w.t, offset, saved.t, res.t);
      out["rms_norm_dx_residual" + tag] = to_doubles(be, dx.t);
    }
    // Two rows of 9 positions; 3 heads of 10 starting at column 5 of rows 40 wide.
    const int64_t B = 2, T = 9, H = 3, D = 10, ld = 40, positions = 12;
    std::vector<double> cos(positions * D / 2), sin(positions * D / 2);
    for (int64_t p = 0; p < positions; ++p)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double angle = double(p) / std::pow(10000.0, 2.0 * double(i) / double(D));
        cos[size_t(p * D / 2 + i)] = std::cos(angle);
        sin[size_t(p * D / 2 + i)] = std::sin(angle);
      }
    HostTensor rx(be, dt, {B * T, ld}, values(rng, B * T * ld)),
        rcos(be, dt, {positions, D / 2}, cos), rsin(be, dt, {positions, D / 2}, sin);
    Rotary rot{.x = static_cast<std::byte*>(rx.t.data()) + 5 * dtype_size(dt),
               .ld = ld,
               .rows = B * T,
               .seq = T,
               .first_pos = 2,
               .heads = H,
               .head_dim = D,
               .cos = rcos.t.data(),
               .sin = rsin.t.data()};
    be.rotary(rot, dt);
    out["rotary"] = to_doubles(be, rx.t);
    rot.inverse = true;
    be.rotary(rot, dt);
    out["rotary_inverse"] = to_doubles(be, rx.t);
    for (const GluKind kind : {GluKind::silu, GluKind::gelu_tanh}) {
      const std::string tag = kind == GluKind::silu ? "silu" : "gelu_tanh";
      HostTensor g(be, dt, {1000}, values(rng, 1000, -6, 6)), u(be, dt, {1000}, values(rng, 1000)),
          y(be, dt, {1000}, std::vector<double>(1000)), dy(be, dt, {1000}, values(rng, 1000)),
          dg(be, dt, {1000}, std::vector<double>(1000)),
          du(be, dt, {1000}, std::vector<double>(1000));
      be.glu_forward(y.t, g.t, u.t, kind);
      out["glu_forward_" + tag] = to_doubles(be, y.t);
      be.glu_backward(dg.t, du.t, dy.t, g.t, u.t, kind);
      out["glu_dgate_" + tag] = to_doubles(be, dg.t);
      out["glu_dup_" + tag] = to_doubles(be, du.t);
      // Per-column maps (DoRA's scaling fused) on rows of 45 (a partial vector), enough rows for
      // threads: both inputs mapped with both scales' gradients, then only up with its own.
      const int64_t R = 70, W = 45;
      HostTensor ag(be, dt, {R, W}, values(rng, R * W, -4, 4)),
          au(be, dt, {R, W}, values(rng, R * W)), ay(be, dt, {R, W}, std::vector<double>(R * W)),
          ady(be, dt, {R, W}, values(rng, R * W)), adg(be, dt, {R, W}, std::vector<double>(R * W)),
          adu(be, dt, {R, W}, std::vector<double>(R * W)), gs(be, dt, {W}, values(rng, W, 0.2, 2)),
          gb(be, dt, {W}, values(rng, W)), us(be, dt, {W}, values(rng, W, -2, 2)),
          ub(be, dt, {W}, values(rng, W)), dgs(be, dt, {W}, values(rng, W)),
          dus(be, dt, {W}, values(rng, W));
      for (const bool both : {true, false}) {
        const std::string at = tag + (both ? "_affine" : "_affine_up");
        GluAffine affine{.up = {.scale = us.t, .bias = ub.t, .dscale = dus.t}};
        if (both) affine.gate.scale = gs.t, affine.gate.bias = gb.t, affine.gate.dscale = dgs.t;
        be.glu_forward(ay.t, ag.t, au.t, kind, affine);
        out["glu_forward_" + at] = to_doubles(be, ay.t);
        be.glu_backward(adg.t, adu.t, ady.t, ag.t, au.t, kind, affine);
        out["glu_dgate_" + at] = to_doubles(be, adg.t);
        out["glu_dup_" + at] = to_doubles(be, adu.t);
        out["glu_dup_scale_" + at] = to_doubles(be, dus.t);
        if (both) out["glu_dgate_scale_" + at] = to_doubles(be, dgs.t);
      }
    }
    // Soft-capping at 3 of values up to 12 (well into tanh's flat part), then in place.
    HostTensor sx(be, dt, {30, 37}, values(rng, 1110, -12, 12)),
        sy(be, dt, {30, 37}, std::vector<double>(1110, 7.0)),
        sdy(be, dt, {30, 37}, values(rng, 1110)),
        sdx(be, dt, {30, 37}, std::vector<double>(1110, 7.0));
    be.soft_cap_forward(sy.t, sx.t, 3.0);
    out["soft_cap_forward"] = to_doubles(be, sy.t);
    be.soft_cap_backward(sdx.t, sdy.t, sy.t, 3.0);
    out["soft_cap_backward"] = to_doubles(be, sdx.t);
    be.soft_cap_forward(sx.t, sx.t, 0.5);
    be.soft_cap_backward(sdy.t, sdy.t, sx.t, 0.5);
    out["soft_cap_in_place"] = to_doubles(be, sdy.t);
    return out;
  };
}

OpCase attention_case(int64_t B, int64_t T, int64_t H, int64_t D, bool causal,
                      AttentionOptions o = {}) {
  return [=](Backend& be, DType dt, Rng& rng) {
    const int64_t C = H * D;
    const AttentionShape s{.batch = B,
                           .seq = T,
                           .heads = H,
                           .head_dim = D,
                           .causal = causal,
                           .kv_heads = o.kv_heads,
                           .window = o.window,
                           .scale = 1 / std::sqrt(double(D)),
                           .softcap = o.softcap,
                           .dropout = o.dropout,
                           .seed = 1234};
    const int64_t W = s.qkv_width();
    HostTensor qkv(be, dt, {B, T, W}, values(rng, B * T * W, -2, 2)),
        dout(be, dt, {B, T, C}, values(rng, B * T * C)),
        out(be, dt, {B, T, C}, std::vector<double>(B * T * C, 7.0)),
        lse(be, dt, {B, H, T}, std::vector<double>(B * H * T, 7.0)),
        dqkv(be, dt, {B, T, W}, std::vector<double>(B * T * W)), len;
    if (!o.lengths.empty())
      len =
          HostTensor(be, DType::i64, {B}, std::vector<double>(o.lengths.begin(), o.lengths.end()));
    const void* lp = o.lengths.empty() ? nullptr : len.t.data();
    be.attention_forward({.shape = s,
                          .qkv = qkv.t.data(),
                          .lengths = lp,
                          .out = out.t.data(),
                          .lse = lse.t.data(),
                          .first_row = o.first_row},
                         dt);
    if (o.first_row == 0)
      be.attention_backward({.shape = s,
                             .qkv = qkv.t.data(),
                             .lengths = lp,
                             .out = out.t.data(),
                             .lse = lse.t.data(),
                             .dout = dout.t.data(),
                             .dqkv = dqkv.t.data()},
                            dt);
    std::vector<double> l = to_doubles(be, lse.t), no_key(l.size());
    for (size_t i = 0; i < l.size(); ++i)
      if (std::isinf(l[i]) && l[i] < 0) {
        l[i] = 0;
        no_key[i] = 1;
      }
    return std::map<std::string, std::vector<double>>{{"out", to_doubles(be, out.t)},
                                                      {"lse", l},
                                                      {"lse_no_key", no_key},
                                                      {"dqkv", to_doubles(be, dqkv.t)}};
  };
}

// Cross-entropy over a vocabulary of many vectors and a tail, rows split over threads, wide
// logits, i64 targets with ignored rows, no class weights.
OpCase cross_entropy_case(int64_t rows, int64_t classes) {
  return [=](Backend& be, DType dt, Rng& rng) {
    HostTensor logits(be, dt, {rows, classes}, values(rng, rows * classes, -30, 30)),
        dlogits(be, dt, {rows, classes}, std::vector<double>(rows * classes, 7.0));
    std::vector<double> ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      ids[size_t(r)] = r % 7 == 3 ? -100.0 : double((r * 131) % classes);
    HostTensor targets(be, DType::i64, {rows}, ids);
    std::map<std::string, std::vector<double>> out;
    out["ce_loss"] = {be.cross_entropy_loss(logits.t, targets.t, {}, -100, dlogits.t)};
    out["ce_grad"] = to_doubles(be, dlogits.t);
    return out;
  };
}

// Dropout drawn from a seed base in backend memory (Backend::set_seed_base): every backend mixes
// it into the masks' seeds alike, a plain mask's and attention's.
OpCase seed_base_case() {
  return [](Backend& be, DType dt, Rng& rng) {
    HostTensor base(be, DType::i64, {1}, {977.0});
    be.set_seed_base(static_cast<const uint64_t*>(base.t.data()));
    HostTensor mask(be, dt, {300}, std::vector<double>(300));
    be.dropout_mask(mask.t, 0.3, 5);
    auto out = attention_case(2, 19, 2, 8, true, {.dropout = 0.4})(be, dt, rng);
    be.set_seed_base(nullptr);
    out["mask"] = to_doubles(be, mask.t);
    return out;
  };
}

const std::map<std::string, OpCase>& cases() {
  static const std::map<std::string, OpCase> all = {
      {"gemm_nn_256x128x512", gemm_case(false, false, 256, 128, 512, 0, 1.0f, 0.0f)},
      {"gemm_nt_bias_64x2048x512", gemm_case(false, true, 64, 2048, 512, 0, 1.0f, 1.0f)},
      {"gemm_tn_odd_33x17x129", gemm_case(true, false, 33, 17, 129, 3, 1.0f, 1.0f)},
      {"gemm_tt_strided_alpha", gemm_case(true, true, 7, 13, 5, 5, 0.5f, 0.25f)},
      {"gemm_k1", gemm_case(false, true, 20, 8, 1, 0, 1.0f, 1.0f)},
      {"gemm_bias_384x512x8", gemm_case(false, true, 384, 512, 8, 0, 1.0f, 0.0f, true)},
      {"gemm_bias_sum_17x33x65", gemm_case(false, true, 17, 33, 65, 2, 1.0f, 1.0f, true)},
      {"gemm_k0", gemm_case(false, false, 4, 6, 0, 0, 1.0f, 0.5f)},
      {"gemm_tn_narrow_512x8x3001", gemm_case(true, false, 512, 8, 3001, 0, 1.0f, 1.0f)},
      {"gemm_tn_narrow_odd_37x1x9", gemm_case(true, false, 37, 1, 9, 3, 0.5f, 0.25f)},
      {"gemm_tn_narrow_70x16x100001", gemm_case(true, false, 70, 16, 100001, 1, 1.0f, 0.0f)},
      {"gemm_tn_narrow_m_8x384x4096", gemm_case(true, false, 8, 384, 4096, 0, 1.0f, 1.0f)},
      {"gemm_tn_narrow_m_odd_5x37x301", gemm_case(true, false, 5, 37, 301, 3, 0.5f, 0.25f)},
      {"gemm_nt_narrow_4096x8x384", gemm_case(false, true, 4096, 8, 384, 0, 1.0f, 0.0f)},
      {"gemm_nt_narrow_odd_33x13x37", gemm_case(false, true, 33, 13, 37, 2, 0.5f, 0.25f)},
      {"gemm_nn_narrow_odd_41x6x1030", gemm_case(false, false, 41, 6, 1030, 1, 1.0f, 1.0f)},
      {"gemm_packed_nt_64x512x128", packed_gemm_case(true, 64, 512, 128, 128, false)},
      {"gemm_packed_nn_bias_33x17x68", packed_gemm_case(false, 33, 17, 68, 2, true)},
      {"lstm_cell_b1_h1", lstm_cell_case(1, 1, 0)},
      {"lstm_cell_b64_h128", lstm_cell_case(64, 128, 0)},
      {"lstm_cell_b256_h33_strided", lstm_cell_case(256, 33, 33)},
      {"lstm_cell_b300_h128_input8", lstm_cell_case(300, 128, 0, 8)},
      {"lstm_cell_b5_h35_input1_no_dh_out", lstm_cell_case(5, 35, 2, 1, true)},
      {"gru_cell_b1_h1", gru_cell_case(1, 1, 0)},
      {"lnlstm_cell_b1_h1", lnlstm_cell_case(1, 1, 0)},
      {"lnlstm_cell_b64_h128_strided", lnlstm_cell_case(64, 128, 128)},
      {"lnlstm_cell_b300_h37", lnlstm_cell_case(300, 37, 0)},
      {"lnlstm_cell_b5_h35_no_dh_out", lnlstm_cell_case(5, 35, 2, true)},
      {"gru_cell_b64_h128_strided", gru_cell_case(64, 128, 128)},
      {"gru_cell_b300_h37_input8", gru_cell_case(300, 37, 0, 8)},
      {"gru_cell_b5_h35_input1_no_dh_out", gru_cell_case(5, 35, 2, 1, true)},
      {"adamw_step1", adam_case(true, 1, 1000)},
      {"adam_l2_step7", adam_case(false, 7, 100003)},
      {"sgd_nesterov_first", sgd_case(true, true, 4097)},
      {"sgd_momentum_dampening", sgd_case(false, false, 100003)},
      {"optimizer_step_adamw_segments", optimizer_case(OptimizerKind::adamw, false)},
      {"optimizer_step_adam_segments_overflow", optimizer_case(OptimizerKind::adam, true)},
      {"optimizer_step_sgd_segments", optimizer_case(OptimizerKind::sgd, false)},
      {"small_ops", small_ops_case()},
      {"decoder_ops", decoder_ops_case()},
      {"cross_entropy_rows300_v2051", cross_entropy_case(300, 2051)},
      {"attention_causal_b2_t33_h3_d20", attention_case(2, 33, 3, 20, true)},
      {"attention_padded_noncausal_b3_t40_h2_d16",
       attention_case(3, 40, 2, 16, false, {.lengths = {40, 0, 17}})},
      {"attention_padded_causal_b2_t70_h4_d64",
       attention_case(2, 70, 4, 64, true, {.lengths = {70, 29}})},
      {"attention_dropout_causal_b2_t45_h2_d24",
       attention_case(2, 45, 2, 24, true, {.dropout = 0.3})},
      {"attention_dropout_padded_b2_t33_h1_d7",
       attention_case(2, 33, 1, 7, false, {.lengths = {20, 33}, .dropout = 0.5})},
      {"attention_first_row_causal_b2_t50_h2_d12",
       attention_case(2, 50, 2, 12, true, {.lengths = {50, 41}, .first_row = 37})},
      {"attention_b1_t1030_h1_d24_causal", attention_case(1, 1030, 1, 24, true)},
      {"attention_dropout_seed_base", seed_base_case()},
      {"attention_padded_b1_t67_h2_d130", attention_case(1, 67, 2, 130, false, {.lengths = {60}})},
      {"attention_b4_t128_h6_d32_causal", attention_case(4, 128, 6, 32, true)},
      {"attention_b1_t1_h1_d1", attention_case(1, 1, 1, 1, false)},
      {"attention_grouped_b2_t40_h6_kv2_d12",
       attention_case(2, 40, 6, 12, true, {.lengths = {40, 23}, .kv_heads = 2})},
      {"attention_grouped_noncausal_b2_t33_h4_kv1_d10",
       attention_case(2, 33, 4, 10, false, {.lengths = {7, 33}, .dropout = 0.3, .kv_heads = 1})},
      {"attention_window_b2_t300_h2_d24",
       attention_case(2, 300, 2, 24, true, {.lengths = {300, 130}, .window = 37})},
      {"attention_window_grouped_b1_t200_h4_kv2_d16",
       attention_case(1, 200, 4, 16, true, {.dropout = 0.2, .kv_heads = 2, .window = 64})},
      {"attention_softcap_causal_b2_t70_h2_d24",
       attention_case(2, 70, 2, 24, true, {.lengths = {70, 33}, .softcap = 0.8})},
      {"attention_softcap_window_grouped_b1_t130_h4_kv2_d10",
       attention_case(1, 130, 4, 10, true,
                      {.dropout = 0.3, .kv_heads = 2, .window = 20, .softcap = 2.0})},
      {"attention_softcap_first_row_b2_t40_h2_d16",
       attention_case(2, 40, 2, 16, true, {.lengths = {40, 35}, .first_row = 30, .softcap = 1.5})},
      {"attention_window_first_row_b2_t90_h3_kv1_d8",
       attention_case(2, 90, 3, 8, true,
                      {.lengths = {90, 40}, .first_row = 61, .kv_heads = 1, .window = 9})},
      {"attention_window_1_b1_t20_h2_kv1_d5",
       attention_case(1, 20, 2, 5, true, {.kv_heads = 1, .window = 1})},
  };
  return all;
}

double tolerance(const std::string& op) { return op.rfind("gemm", 0) == 0 ? 2e-5 : 1e-5; }

// The interface's operations a case exercises, by its name.
std::vector<Op> ops_of(const std::string& name) {
  if (name.rfind("gemm", 0) == 0) return {Op::memory, Op::gemm};
  if (name.find("_cell_") != std::string::npos) return {Op::memory, Op::cell};
  if (name.rfind("attention", 0) == 0) return {Op::memory, Op::attention};
  if (name.rfind("adam", 0) == 0 || name.rfind("sgd", 0) == 0 || name.rfind("optimizer", 0) == 0)
    return {Op::memory, Op::optimizer};
  if (name.rfind("decoder", 0) == 0) return {Op::memory, Op::decoder};
  std::vector<Op> rest;  // small_ops: the others
  for (Op op : kAllOps)
    if (op != Op::decoder) rest.push_back(op);
  return rest;
}

class OpMatchesReference : public ::testing::TestWithParam<std::string> {};

// The host backends run every op; a device backend says which it runs so far.
bool runs_every_op(const BackendEntry& entry) {
  const std::string name = entry.name;
  return name == "reference" || name == "cpu" || name == "sealed" || name == "sealed_async";
}

// Every registered backend this machine can make, in f32 against the reference in f64.
TEST_P(OpMatchesReference, EveryBackendF32) {
  const OpCase& op = cases().at(GetParam());
  auto ref = make_reference_backend();
  Rng r0(42);
  const auto want = op(*ref, DType::f64, r0);
  for (const BackendEntry& entry : registered_backends()) {
    if (!entry.usable()) continue;  // counted by Backends.DeviceBackendsSayWhyTheyCannotRun
    auto be = entry.make();
    bool runs = true;
    for (Op needed : ops_of(GetParam())) runs = runs && be->supports(needed, DType::f32);
    if (!runs) {
      EXPECT_FALSE(runs_every_op(entry)) << entry.name << " does not run " << GetParam();
      continue;
    }
    Rng r(42);
    const auto got = op(*be, DType::f32, r);
    for (const auto& [name, w] : want)
      EXPECT_LE(max_rel_error(got.at(name), w), tolerance(GetParam()))
          << entry.name << " " << GetParam() << " output " << name;
  }
}

// What the backends say they run: every op in f32 and f64 (the reference's dtypes), and bf16
// GEMMs on the reference always and on the CPU where it has bf16 dot products.
TEST(Backends, SayWhichOpsAndDtypesTheyRun) {
  ASSERT_GE(registered_backends().size(), 2u);
  EXPECT_STREQ(registered_backends()[0].name, "reference");
  std::string names;
  for (const BackendEntry& entry : registered_backends()) {
    names += (names.empty() ? "" : ", ") + std::string(entry.name);
    if (!runs_every_op(entry)) continue;
    auto be = entry.make();
    EXPECT_EQ(be->name(), entry.name);
    for (Op op : kAllOps)
      for (DType dt : {DType::f32, DType::f64})
        EXPECT_TRUE(be->supports(op, dt)) << entry.name << " " << op_name(op);
    EXPECT_FALSE(be->supports(Op::cell, DType::bf16)) << entry.name;
  }
  EXPECT_TRUE(make_reference_backend()->supports(Op::gemm, DType::bf16));
  EXPECT_EQ(make_cpu_backend()->supports(Op::gemm, DType::bf16), test::cpu_runs_bf16());
  const std::string e = test::error_of([] { make_backend("tpu"); });
  EXPECT_NE(e.find("unknown backend 'tpu' (expected one of: " + names + ")"), std::string::npos)
      << e;
}

// A device backend this machine cannot run is listed with its reason, and making it fails with
// that one line; where it can run, it says so and makes.
TEST(Backends, DeviceBackendsSayWhyTheyCannotRun) {
  for (const BackendEntry& entry : registered_backends()) {
    if (!entry.unavailable) continue;
    const std::string why = entry.unavailable();
    if (why.empty()) {
      EXPECT_EQ(entry.make()->name(), entry.name);
      continue;
    }
    EXPECT_EQ(test::error_of([&] { entry.make(); }), why);
    GTEST_SKIP() << why;
  }
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& [name, _] : cases()) names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpMatchesReference, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });

// The update's segments as separate steps: each segment's own update count, weight decay only
// where it applies, a frozen segment's gradients zeroed and nothing else moved, the padding
// between segments left as it was, and every count advanced but the frozen one's; an overflowed
// step zeroes the gradients and counts nothing. The reference's f64 run (two steps) of the op
// driver's case against adam_step and sgd_step called segment by segment on host memory.
TEST(Ops, OptimizerStepIsEachSegmentsOwnStep) {
  auto ref = make_reference_backend();
  for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::adam, OptimizerKind::sgd})
    for (const bool overflow : {false, true}) {
      Rng r0(42);
      const auto got = optimizer_case(kind, overflow)(*ref, DType::f64, r0);
      Rng r(42);
      std::vector<double> p = values(r, 9140), g = values(r, 9104, -1e-2, 1e-2),
                          m = values(r, 9104, -1e-3, 1e-3), v = values(r, 9104, 0, 1e-5);
      const std::vector<double> p0 = p, g0 = g;
      double sum_squares = overflow ? INFINITY : 3.0;
      const GradClip clip{
          .sum_squares = &sum_squares, .loss_scale = 2.0, .max_norm = 0.5, .skip_nonfinite = true};
      struct Seg {
        int64_t value, grad, n, step;
        bool decays, frozen;
      };
      const Seg segs[] = {{0, 0, 30, 5, true, false},
                          {40, 32, 17, 1, false, false},
                          {60, 50, 40, 3, true, true},
                          {120, 96, 9000, 10, true, false},
                          {9130, 9100, 1, 1, false, false}};
      auto t = [](std::vector<double>& x, int64_t at, int64_t n) {
        return Tensor(x.data() + at, DType::f64, {n});
      };
      for (int k = 0; k < 2; ++k)
        for (Seg s : segs) {
          if (!overflow) s.step += k;
          if (s.frozen) {
            std::fill_n(g.begin() + s.grad, s.n, 0.0);
            continue;
          }
          const double wd = s.decays ? 0.1 : 0.0;
          if (kind == OptimizerKind::sgd) {
            ref->sgd_step(t(p, s.value, s.n), t(g, s.grad, s.n), t(m, s.grad, s.n),
                          {.lr = 0.1,
                           .momentum = 0.9,
                           .dampening = 0.1,
                           .weight_decay = wd,
                           .first_step = s.step == 1,
                           .grad_scale = 0.5,
                           .clip = clip});
            std::fill_n(g.begin() + s.grad, s.n, 0.0);
          } else {
            ref->adam_step(t(p, s.value, s.n), t(g, s.grad, s.n), t(m, s.grad, s.n),
                           t(v, s.grad, s.n),
                           {.lr = 1e-2,
                            .weight_decay = wd,
                            .decoupled = kind == OptimizerKind::adamw,
                            .step = s.step,
                            .grad_scale = 0.5,
                            .clip = clip,
                            .zero_grads = true});
          }
        }
      const std::string what = std::to_string(int(kind)) + (overflow ? " overflow" : "");
      EXPECT_EQ(got.at("p"), p) << what;
      EXPECT_EQ(got.at("grads"), g) << what;
      EXPECT_EQ(got.at("m"), m) << what;
      if (kind != OptimizerKind::sgd) {
        EXPECT_EQ(got.at("v"), v) << what;
      }
      const std::vector<double> counts =
          overflow ? std::vector<double>{4, 0, 2, 9, 0} : std::vector<double>{6, 2, 2, 11, 2};
      EXPECT_EQ(got.at("steps"), counts) << what;
      for (const int64_t gap : {30, 31, 49, 90, 95, 9096, 9099, 9101, 9103})
        EXPECT_EQ(got.at("grads")[gap], g0[gap]) << what << " at " << gap;
      if (overflow) {
        EXPECT_EQ(got.at("p"), p0) << what;
      }
    }
}

// A seed base mixes into a mask's seed as ref::seed_with_base says (the hash of the base and the
// seed), on every host backend; null restores the seeds as given.
TEST(Ops, ASeedBaseMixesIntoEveryMasksSeed) {
  for (const char* name : {"reference", "cpu"}) {
    auto be = make_backend(name);
    const uint64_t base = 977;
    std::vector<float> with(300), plain(300), mixed(300), again(300);
    be->set_seed_base(&base);
    be->dropout_mask(Tensor(with.data(), DType::f32, {300}), 0.3, 5);
    be->set_seed_base(nullptr);
    be->dropout_mask(Tensor(plain.data(), DType::f32, {300}), 0.3, 5);
    be->dropout_mask(Tensor(mixed.data(), DType::f32, {300}), 0.3, ref::counter_hash(977, 5));
    EXPECT_EQ(with, mixed) << name;
    EXPECT_NE(with, plain) << name;
  }
}

// The regression losses as PyTorch defines them (F.mse_loss, F.l1_loss, F.huber_loss with
// delta; the pinball loss of quantiles 0.1, 0.5 and 0.9, value j of a row for quantile j % 3;
// mean over the selected rows' values), their gradients against central differences of the
// loss, on every host backend.
TEST(Ops, RegressionLossesAreTorchsAndTheirGradientsTheirDerivatives) {
  const int64_t N = 7, F = 6;
  const double levels[] = {0.1, 0.5, 0.9};
  Rng rng(17);
  std::vector<double> pred(N * F), target(N * F), mask(N);
  for (auto& v : pred) v = rng.uniform(-2, 2);
  for (auto& v : target) v = rng.uniform(-1, 1);
  for (int64_t r = 0; r < N; ++r) mask[r] = r % 3 == 1 ? 0.0 : 1.0;
  const double delta = 0.6;
  auto term = [&](LossKind k, double d, int64_t j) {
    const double a = std::fabs(d), q = levels[j % 3];
    return k == LossKind::mse        ? d * d
           : k == LossKind::mae      ? a
           : k == LossKind::quantile ? std::max(q * -d, (q - 1) * -d)
           : a < delta               ? 0.5 * d * d
                                     : delta * (a - 0.5 * delta);
  };
  for (const char* name : {"reference", "cpu", "sealed", "sealed_async"}) {
    auto be = make_backend(name);
    for (LossKind k : {LossKind::mse, LossKind::mae, LossKind::huber, LossKind::quantile}) {
      RegressionLoss kind{k, delta, 3};
      std::copy(std::begin(levels), std::end(levels), kind.quantiles);
      auto loss_at = [&](const std::vector<double>& p, std::vector<double>* grad) {
        Buffer pb, tb, mb, db;
        Tensor pt = pb.get(*be, DType::f64, {N, F}), tt = tb.get(*be, DType::f64, {N, F}),
               mt = mb.get(*be, DType::f64, {N}), dt = db.get(*be, DType::f64, {N, F});
        upload_doubles(*be, pt, p), upload_doubles(*be, tt, target), upload_doubles(*be, mt, mask);
        const double l = be->regression_loss(kind, pt, tt, mt, dt);
        if (grad) *grad = download_doubles(*be, dt);
        return l;
      };
      std::vector<double> grad;
      const double loss = loss_at(pred, &grad);
      double want = 0, count = 0;
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 0; j < F; ++j)
          if (mask[r] != 0) want += term(k, pred[r * F + j] - target[r * F + j], j), count += 1;
      EXPECT_NEAR(loss, want / count, 1e-12) << name << " kind " << int(k);
      for (int64_t i = 0; i < N * F; ++i) {
        std::vector<double> up = pred, down = pred;
        up[i] += 1e-6, down[i] -= 1e-6;
        const double numeric = (loss_at(up, nullptr) - loss_at(down, nullptr)) / 2e-6;
        EXPECT_NEAR(grad[i], numeric, 1e-6) << name << " kind " << int(k) << " value " << i;
      }
    }
  }
}

TEST(Ops, DropoutMaskStatistics) {
  auto be = make_cpu_backend();
  std::vector<float> mask(100000);
  Tensor t(mask.data(), DType::f32, {100000});
  be->dropout_mask(t, 0.3, 7);
  int64_t zeros = 0;
  for (float m : mask) {
    if (m == 0.0f)
      ++zeros;
    else
      EXPECT_FLOAT_EQ(m, 1.0f / 0.7f);
  }
  EXPECT_NEAR(zeros / 100000.0, 0.3, 0.01);
}

// f32 -> bf16 on the CPU backend's vectors rounds as to_bf16 does, bit for bit: ties to even,
// infinities, denormals, and NaNs whose payload would round into an infinity stay NaN.
TEST(Ops, Bf16ConversionMatchesScalarRounding) {
  auto cpu = make_cpu_backend();
  const uint32_t specials[] = {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f800000u, 0xff800000u,
                               0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x00000001u, 0x807fffffu,
                               0x7f7fffffu, 0x00000000u, 0x80000000u, 0x3f7fffffu};
  Rng rng(5);
  for (int64_t n : {3, 16, 1000, 70001}) {
    std::vector<float> src(static_cast<size_t>(n));
    for (size_t i = 0; i < src.size(); ++i) {
      const uint32_t bits =
          i % 3 == 0 ? specials[(i / 3) % std::size(specials)] : static_cast<uint32_t>(rng.next());
      std::memcpy(&src[i], &bits, 4);
    }
    std::vector<bf16> got(src.size());
    cpu->convert(Tensor(got.data(), DType::bf16, {n}), Tensor(src.data(), DType::f32, {n}));
    int64_t differ = 0;
    for (size_t i = 0; i < src.size(); ++i) differ += got[i].bits != to_bf16(src[i]).bits;
    EXPECT_EQ(differ, 0) << "n " << n;
  }
}

// LayerNorm and GELU writing bf16 from f32 inputs (the operands of bf16 GEMMs): on every backend,
// exactly their f32 outputs rounded; rows narrower and wider than the CPU's blocks of f32 scratch,
// and element counts split over threads with tails.
TEST(Ops, NormAndGeluWriteBf16AsTheirF32OutputsRounded) {
  auto rounded = [](std::vector<double> v) {
    for (double& x : v) x = from_bf16(to_bf16(static_cast<float>(x)));
    return v;
  };
  for (const BackendEntry& entry : registered_backends()) {
    if (!entry.usable()) continue;
    auto be = entry.make();
    if (!be->supports(Op::norm, DType::f32) || !be->supports(Op::activation, DType::f32)) continue;
    Rng rng(11);
    for (auto [N, C] : {std::pair<int64_t, int64_t>{70, 37}, {45, 1100}, {9, 5000}}) {
      HostTensor x(*be, DType::f32, {N, C}, values(rng, N * C, -3, 3)),
          w(*be, DType::f32, {C}, values(rng, C, 0.5, 1.5)),
          b(*be, DType::f32, {C}, values(rng, C)),
          y(*be, DType::f32, {N, C}, std::vector<double>(N * C)),
          y_low(*be, DType::bf16, {N, C}, std::vector<double>(N * C)),
          saved(*be, DType::f32, {N, 2}, std::vector<double>(2 * N)),
          saved_low(*be, DType::f32, {N, 2}, std::vector<double>(2 * N));
      be->layer_norm_forward(y.t, saved.t, x.t, w.t, b.t, 1e-5);
      be->layer_norm_forward(y_low.t, saved_low.t, x.t, w.t, b.t, 1e-5);
      EXPECT_EQ(to_doubles(*be, y_low.t), rounded(to_doubles(*be, y.t))) << entry.name << " " << C;
      EXPECT_EQ(to_doubles(*be, saved_low.t), to_doubles(*be, saved.t)) << entry.name << " " << C;
    }
    for (int64_t n : {5, 4096, 10007}) {
      HostTensor x(*be, DType::f32, {n}, values(rng, n, -6, 6)),
          y(*be, DType::f32, {n}, std::vector<double>(n)),
          y_low(*be, DType::bf16, {n}, std::vector<double>(n));
      be->gelu_forward(y.t, x.t);
      be->gelu_forward(y_low.t, x.t);
      EXPECT_EQ(to_doubles(*be, y_low.t), rounded(to_doubles(*be, y.t))) << entry.name << " " << n;
    }
    {  // mapped per column, rows of 45 (blocks of whole rows)
      const int64_t R = 300, C = 45;
      HostTensor x(*be, DType::f32, {R, C}, values(rng, R * C, -6, 6)),
          s(*be, DType::f32, {C}, values(rng, C, -2, 2)), b(*be, DType::f32, {C}, values(rng, C)),
          y(*be, DType::f32, {R, C}, std::vector<double>(R * C)),
          y_low(*be, DType::bf16, {R, C}, std::vector<double>(R * C));
      be->gelu_forward(y.t, x.t, {.scale = s.t, .bias = b.t});
      be->gelu_forward(y_low.t, x.t, {.scale = s.t, .bias = b.t});
      EXPECT_EQ(to_doubles(*be, y_low.t), rounded(to_doubles(*be, y.t))) << entry.name << " mapped";
    }
  }
}

// A Linear's bias gradient and dy's bf16 copy in one pass: on every backend exactly what
// sum_rows_acc and convert give (shapes with vector tails, and enough rows to split over threads).
TEST(Ops, SumRowsAccAndConvertIsBothOpsInOnePass) {
  for (const BackendEntry& entry : registered_backends()) {
    if (!entry.usable()) continue;
    auto be = entry.make();
    if (!be->supports(Op::elementwise, DType::f32)) continue;
    Rng rng(12);
    for (auto [R, N] : {std::pair<int64_t, int64_t>{37, 19}, {3000, 45}, {64, 1152}}) {
      const std::vector<double> dy_values = values(rng, R * N), db_values = values(rng, N);
      HostTensor dy(*be, DType::f32, {R, N}, dy_values), db(*be, DType::f32, {N}, db_values),
          db_two(*be, DType::f32, {N}, db_values),
          low(*be, DType::bf16, {R, N}, std::vector<double>(R * N)),
          low_two(*be, DType::bf16, {R, N}, std::vector<double>(R * N));
      be->sum_rows_acc_and_convert(db.t, dy.t, low.t);
      be->sum_rows_acc(db_two.t, dy.t);
      be->convert(low_two.t, dy.t);
      EXPECT_EQ(to_doubles(*be, db.t), to_doubles(*be, db_two.t)) << entry.name << " " << R;
      EXPECT_EQ(to_doubles(*be, low.t), to_doubles(*be, low_two.t)) << entry.name << " " << R;
    }
  }
}

// The CPU backend's vector hash draws the reference's mask element for element: sizes with a
// tail and split over threads, probabilities at the edges and between representable ones.
TEST(Ops, DropoutMaskMatchesReferenceExactly) {
  auto cpu = make_cpu_backend();
  auto ref = make_reference_backend();
  for (int64_t n : {1, 7, 1003, 200001})
    for (double p : {0.0, 1e-9, 0.1, 0.5, 1.0 / 3.0, 0.999}) {
      std::vector<float> a(static_cast<size_t>(n), -1.0f), b(static_cast<size_t>(n), -2.0f);
      cpu->dropout_mask(Tensor(a.data(), DType::f32, {n}), p, 0xfeedull + uint64_t(n));
      ref->dropout_mask(Tensor(b.data(), DType::f32, {n}), p, 0xfeedull + uint64_t(n));
      int64_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
      EXPECT_EQ(differ, 0) << "n " << n << ", p " << p;
    }
}

TEST(Ops, EmbeddingRejectsOutOfRangeId) {
  auto be = make_cpu_backend();
  std::vector<float> table(12), out(8);
  std::vector<int64_t> ids = {1, 3};
  EXPECT_THROW(be->embedding_forward(Tensor(out.data(), DType::f32, {2, 4}),
                                     Tensor(table.data(), DType::f32, {3, 4}),
                                     Tensor(ids.data(), DType::i64, {2})),
               Error);
}

}  // namespace
}  // namespace seqforge::ops_test
