// seqforge's CUDA kernels and their launchers (src/kernels/cuda), compiled for the host emulation
// beside this file and run on the CPU against the reference: every cell forward and backward with
// each optional input, bf16 and f16 copies and strided rows; the elementwise, layout, dropout,
// loss, optimizer, embedding and adapter ops. What it cannot see is the GPU itself (memory spaces,
// real concurrency within a warp, launch limits): the device check runs the same ops there.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kernels/cells.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/reference.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/rng.hpp"

// The switch with which the emulated libraries open device memory, the hook through which the
// emulated cuBLASLt enqueues its matmuls and the one with which the emulated NCCL runs a
// stream's work, emitted (and exported) here.
[[gnu::used]] static void (*const device_open_for_libraries)(int) = sf_emu_device_open;
[[gnu::used]] static void (*const enqueue_for_cublaslt)(cudaStream_t, void*, void (*)(void*),
                                                        void (*)(void*)) = sf_emu_enqueue;
[[gnu::used]] static void (*const synchronize_for_nccl)(cudaStream_t) = sf_emu_synchronize;

namespace seqforge {
namespace {

// Named buffers of T (and of the half-precision copies' bits), filled at random, for one run of a
// step.
template <typename T>
struct Buffers {
  std::map<std::string, std::vector<T>> t;
  DType low_dtype = DType::bf16;
  std::map<std::string, std::vector<uint16_t>> low;
  T* operator()(const std::string& name, size_t n, Rng* rng = nullptr, double lo = -1,
                double hi = 1) {
    auto& v = t[name];
    if (v.empty()) {
      v.resize(n);
      for (T& x : v) x = rng ? T(rng->uniform(lo, hi)) : T(0.37);
    }
    return v.data();
  }
  uint16_t* half(const std::string& name, size_t n) {
    auto& v = low[name];
    if (v.empty()) v.assign(n, low_dtype == DType::f16 ? to_f16(0.37f) : to_bf16(0.37f).bits);
    return v.data();
  }
  float widen(uint16_t bits) const {
    return low_dtype == DType::f16 ? from_f16(bits) : from_bf16(bf16{bits});
  }
};

// Relative error of got against want over all named buffers; half copies in their own units
// (one rounding step apart at most: 2^-8 for bf16, 2^-11 for f16).
template <typename T>
void expect_close(const Buffers<T>& got, const Buffers<T>& want, double tolerance,
                  const std::string& what) {
  for (const auto& [name, w] : want.t) {
    const auto& g = got.t.at(name);
    double scale = 0;
    for (T x : w) scale = std::max(scale, std::fabs(double(x)));
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_LE(std::fabs(double(g[i]) - double(w[i])), tolerance * std::max(scale, 1.0))
          << what << ": " << name << "[" << i << "] " << g[i] << " vs " << w[i];
  }
  const double step = want.low_dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
  for (const auto& [name, w] : want.low) {
    const auto& g = got.low.at(name);
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_NEAR(got.widen(g[i]), want.widen(w[i]),
                  step * std::max(1.0f, std::fabs(want.widen(w[i]))))
          << what << ": " << name << "[" << i << "]";
  }
}

struct CellCase {
  CellKind cell;
  bool narrow_input;
  DType copies;  // of the GEMM operands: bf16, f16, or f32 for none
  bool rec_dh, out_dh;
};

// One forward and backward step of a cell with the emulated kernels and the reference, from the
// same inputs, every output compared (the bias gradient as the CUDA backend forms it: the column
// sums of dgates and dgates_rec, or of the LN-LSTM's per-row terms).
template <typename T>
void check_cell(const CellCase& c, double tolerance) {
  const CellType& type = cell_type(c.cell);
  const int64_t B = 5, H = 7, G = type.gates, GH = G * H, I = 3;
  const int64_t ldh = H + 2, ld_prev = H + 3, ld_dh = H + 1;
  const bool narrow = c.narrow_input && c.cell != CellKind::lnlstm;
  const bool copies = c.copies != DType::f32;
  const std::string what = std::string(type.name) + (narrow ? " narrow" : "") +
                           (copies ? " " + std::string(dtype_name(c.copies)) + " copies" : "") +
                           (sizeof(T) == 8 ? " f64" : " f32");
  Buffers<T> ref, emu;
  for (Buffers<T>* b : {&ref, &emu}) {
    Rng rng(7);
    b->low_dtype = c.copies;
    CellForward f;
    f.low = c.copies;
    f.batch = B, f.hidden = H;
    f.gates = (*b)("gates", B * GH, &rng, -2, 2);
    if (narrow) {
      f.x = (*b)("x", B * I + 2, &rng), f.input = I, f.ldx = I;
      f.w_ih_t = (*b)("w_ih_t", I * GH, &rng), f.bias = (*b)("bias", GH, &rng);
    }
    if (c.cell == CellKind::lnlstm) {
      f.bias = (*b)("bias", GH, &rng);
      f.params = (*b)("params", cell_param_columns(type, H), &rng, 0.5, 1.5);
    }
    f.gates_rec = (*b)("gates_rec", B * GH, &rng, -2, 2);
    if (c.cell == CellKind::gru) {
      f.bias_rec = (*b)("bias_rec", H, &rng);
      f.h_prev = (*b)("h_prev", B * ld_prev, &rng), f.ld_h_prev = ld_prev;
    }
    if (type.cell_state) {
      f.c_prev = (*b)("c_prev", B * H, &rng);
      f.c = (*b)("c", B * H);
    }
    f.saved = (*b)("saved", B * saved_columns(type, H));
    f.h = (*b)("h", B * ldh), f.ldh = ldh;
    if (copies) {
      f.gates_low = b->half("gates_low", B * GH);
      f.h_low = b->half("h_low", B * ldh);
    }
    if (b == &ref)
      (sizeof(T) == 4 ? cell_kernels(c.cell).forward_f32 : cell_kernels(c.cell).forward_f64)(f, 0,
                                                                                             B);
    else
      cuda::cell_forward(c.cell, f, sizeof(T) == 4 ? DType::f32 : DType::f64, nullptr);

    CellBackward k;
    k.batch = B, k.hidden = H;
    k.low = c.copies;
    if (copies)
      k.gates_low = b->half("gates_low", 0);
    else
      k.gates = b->t["gates"].data();
    k.c_prev = f.c_prev, k.saved = f.saved, k.params = f.params;
    k.h_prev = f.h_prev, k.ld_h_prev = f.ld_h_prev;
    if (c.out_dh) k.dh_out = (*b)("dh_out", B * ld_dh, &rng), k.ld_dh_out = ld_dh;
    if (c.rec_dh) k.dh_rec = (*b)("dh_rec", B * H, &rng);
    if (type.cell_state) k.dc = (*b)("dc", B * H, &rng);
    k.dgates = (*b)("dgates", B * GH);
    if (copies) k.dgates_low = b->half("dgates_low", B * GH);
    if (type.recurrent_grads) {
      k.dgates_rec = (*b)("dgates_rec", B * GH);
      if (copies) k.dgates_rec_low = b->half("dgates_rec_low", B * GH);
    }
    if (type.direct_state_grad) k.dh_direct = (*b)("dh_direct", B * H);
    const int64_t bias_columns = bias_grad_columns(type, H);
    k.dbias = (*b)("dbias", bias_columns, &rng);
    const DType dt = sizeof(T) == 4 ? DType::f32 : DType::f64;
    if (b == &ref) {
      (sizeof(T) == 4 ? cell_kernels(c.cell).backward_f32 : cell_kernels(c.cell).backward_f64)(k, 0,
                                                                                               B);
    } else if (c.cell == CellKind::lnlstm) {
      T* rows = (*b)("dbias_rows", B * bias_columns);
      cuda::cell_backward(c.cell, k, rows, dt, nullptr);
      cuda::sum_rows_acc(k.dbias, rows, dt, B, bias_columns, nullptr);
      b->t.erase("dbias_rows");
    } else {
      cuda::cell_backward(c.cell, k, nullptr, dt, nullptr);
      cuda::sum_rows_acc(k.dbias, k.dgates, dt, B, GH, nullptr);
      if (type.recurrent_grads)
        cuda::sum_rows_acc(static_cast<T*>(k.dbias) + GH, k.dgates_rec, dt, B, GH, nullptr);
    }
  }
  if (copies) {  // the activations went to gates_low: gates was the kernels' scratch
    ref.t.erase("gates");
    emu.t.erase("gates");
  }
  expect_close(emu, ref, tolerance, what);
}

TEST(CudaKernelsEmulated, CellsMatchTheReference) {
  for (CellKind cell : {CellKind::lstm, CellKind::gru, CellKind::lnlstm})
    for (bool narrow : {false, true})
      for (DType copies : {DType::f32, DType::bf16, DType::f16})
        for (auto [rec, out] : {std::pair{true, true}, {false, true}, {true, false}}) {
          const CellCase c{cell, narrow, copies, rec, out};
          check_cell<float>(c, 2e-6);
          check_cell<double>(c, 1e-13);
        }
}

std::vector<float> random(Rng& rng, size_t n, double lo = -1, double hi = 1) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

Tensor view(std::vector<float>& v, Shape shape) { return Tensor(v.data(), DType::f32, shape); }

void expect_near(const std::vector<float>& got, const std::vector<float>& want, double tolerance,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tolerance * std::max(1.0f, std::fabs(want[i])))
        << what << " [" << i << "]";
}

// The elementwise, layout and dropout launchers against the reference backend (whose memory is
// the host's, as the emulation's is).
TEST(CudaKernelsEmulated, ElementwiseLayoutAndDropoutMatchTheReference) {
  auto ref = make_reference_backend();
  Rng rng(3);
  const int64_t R = 37, C = 11;
  auto a = random(rng, R * C), b = random(rng, R * C);
  {
    auto want = a, got = a;
    ref->add(view(want, {R * C}), view(b, {R * C}));
    cuda::add(got.data(), b.data(), DType::f32, R * C, nullptr);
    expect_near(got, want, 0, "add");
    ref->mul(view(want, {R * C}), view(a, {R * C}), view(b, {R * C}));
    cuda::mul(got.data(), a.data(), b.data(), DType::f32, R * C, nullptr);
    expect_near(got, want, 0, "mul");
    ref->scale(view(want, {R * C}), -0.3);
    cuda::scale(got.data(), DType::f32, R * C, -0.3, nullptr);
    expect_near(got, want, 0, "scale");
  }
  {
    auto want = random(rng, C), got = want;
    ref->sum_rows_acc(view(want, {C}), view(a, {R, C}));
    cuda::sum_rows_acc(got.data(), a.data(), DType::f32, R, C, nullptr);
    expect_near(got, want, 1e-6, "sum_rows_acc");
    double sum = 0;
    std::vector<double> partials(cuda::kPartialBlocks + 1);
    cuda::sum_squares(&sum, a.data(), DType::f32, R * C, partials.data(), nullptr);
    EXPECT_NEAR(sum, ref->sum_squares(view(a, {R * C})), 1e-9 * sum);
  }
  {
    std::vector<float> want(R * C), got(R * C);
    ref->transpose01(view(want, {C, R, 1}), view(a, {R, C, 1}));
    cuda::transpose01(got.data(), a.data(), R, C, 1, 4, nullptr);
    expect_near(got, want, 0, "transpose01");
    std::vector<float> t_want(C * (R + 2), 9), t_got = t_want;
    ref->copy_transposed(t_want.data(), R + 2, a.data(), C, R, C, DType::f32);
    cuda::copy_transposed(t_got.data(), R + 2, a.data(), C, R, C, 4, nullptr);
    expect_near(t_got, t_want, 0, "copy_transposed");
  }
  for (double p : {0.0, 0.1, 0.5}) {
    std::vector<float> want(1001), got(1001);
    ref->dropout_mask(view(want, {1001}), p, 42);
    cuda::dropout_mask(got.data(), DType::f32, 1001, ref::uniform_below(p), 1.0 / (1.0 - p), 42,
                       nullptr, nullptr);
    expect_near(got, want, 0, "dropout_mask p " + std::to_string(p));
  }
  // Conversions round as the host's convert, bit for bit (NaN and infinity included).
  auto special = random(rng, 64, -70000, 70000);
  special[0] = NAN, special[1] = INFINITY, special[2] = 1e-42f, special[3] = -0.0f;
  for (DType to : {DType::bf16, DType::f16, DType::f64}) {
    std::vector<unsigned char> want(64 * 8), got(64 * 8);
    seqforge::convert(special.data(), DType::f32, want.data(), to, 64);
    cuda::convert(got.data(), to, special.data(), DType::f32, 64, nullptr);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), 64 * dtype_size(to)), 0) << dtype_name(to);
    std::vector<float> back_want(64), back_got(64);
    seqforge::convert(want.data(), to, back_want.data(), DType::f32, 64);
    cuda::convert(back_got.data(), DType::f32, want.data(), to, 64, nullptr);
    EXPECT_EQ(std::memcmp(back_got.data(), back_want.data(), 64 * 4), 0) << dtype_name(to);
  }
  std::vector<bf16> filled(9);
  cuda::fill(filled.data(), DType::bf16, 9, 1.7, nullptr);
  EXPECT_EQ(filled[8].bits, to_bf16(1.7f).bits);
}

// Losses, optimizers, embedding and the adapters' ops against the reference backend.
TEST(CudaKernelsEmulated, LossesOptimizersEmbeddingAndAdaptersMatchTheReference) {
  auto ref = make_reference_backend();
  Rng rng(5);
  const int64_t N = 29, F = 3, K = 6;
  double sums[3];
  std::vector<double> partials(cuda::kPartialBlocks + 1);
  {  // MSE, MAE, Huber (errors on both sides of its delta) and two quantiles' pinball loss (a
     // row's values take them in turn), with and without a row mask
    auto pred = random(rng, N * F, -2, 2), target = random(rng, N * F);
    std::vector<float> mask(N);
    for (int64_t r = 0; r < N; ++r) mask[r] = r % 3 ? 1.0f : 0.0f;
    const RegressionLoss quantile{LossKind::quantile, 1.0, 2, {0.2, 0.75}};
    for (const RegressionLoss kind : {RegressionLoss{}, RegressionLoss{LossKind::mae},
                                      RegressionLoss{LossKind::huber, 0.7}, quantile})
      for (bool masked : {false, true}) {
        std::vector<float> want(N * F), got(N * F);
        const Tensor m = masked ? view(mask, {N}) : Tensor();
        const double loss = ref->regression_loss(kind, view(pred, {N, F}), view(target, {N, F}), m,
                                                 view(want, {N, F}));
        cuda::regression_loss(kind, pred.data(), target.data(), masked ? mask.data() : nullptr,
                              got.data(), DType::f32, N, F, sums, partials.data(), nullptr);
        EXPECT_NEAR(sums[0] / (sums[1] * F), loss, 1e-6 * loss);
        expect_near(got, want, 1e-6, "regression loss dpred");
      }
  }
  {  // cross-entropy: class weights, an ignored row, i64 targets; and a target out of range
    auto logits = random(rng, N * K, -3, 3), weights = random(rng, K, 0.5, 2);
    std::vector<int64_t> targets(N);
    for (int64_t r = 0; r < N; ++r) targets[r] = r == 4 ? -100 : int64_t(rng.next() % K);
    std::vector<float> want(N * K), got(N * K);
    const double loss =
        ref->cross_entropy_loss(view(logits, {N, K}), Tensor(targets.data(), DType::i64, {N}),
                                view(weights, {K}), -100, view(want, {N, K}));
    uint64_t bad[cuda::kReportWords] = {UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX};
    cuda::cross_entropy_loss(logits.data(), targets.data(), DType::i64, weights.data(), -100,
                             got.data(), DType::f32, N, K, sums, partials.data(), bad, nullptr);
    EXPECT_EQ(bad[0], UINT64_MAX);
    EXPECT_NEAR(sums[0] / sums[1], loss, 1e-6 * loss);
    expect_near(got, want, 1e-6, "cross-entropy dlogits");
    targets[7] = K;
    targets[9] = -3;
    cuda::cross_entropy_loss(logits.data(), targets.data(), DType::i64, nullptr, -100, got.data(),
                             DType::f32, N, K, sums, partials.data(), bad, nullptr);
    // The first bad row, as the CPU reports it, with its class and the range.
    EXPECT_EQ(bad[0], 7u | cuda::kResolvedReport);
    EXPECT_EQ(static_cast<int64_t>(bad[1]), int64_t(K));
    EXPECT_EQ(bad[2], uint64_t(K));
    EXPECT_EQ(bad[3], cuda::kBadTargetClass);
    // A later launch's bad row leaves the report as it is.
    targets[7] = 0;
    cuda::cross_entropy_loss(logits.data(), targets.data(), DType::i64, nullptr, -100, got.data(),
                             DType::f32, N, K, sums, partials.data(), bad, nullptr);
    EXPECT_EQ(bad[0], 7u | cuda::kResolvedReport);
    EXPECT_EQ(static_cast<int64_t>(bad[1]), int64_t(K));
  }
  {  // Adam (AdamW and L2), SGD (momentum, Nesterov, first step)
    auto p0 = random(rng, 50), g0 = random(rng, 50), m0 = random(rng, 50),
         v0 = random(rng, 50, 0, 1);
    for (bool decoupled : {true, false}) {
      AdamParams a{.lr = 0.01,
                   .weight_decay = 0.1,
                   .decoupled = decoupled,
                   .step = 3,
                   .grad_scale = 0.5,
                   .zero_grads = true};
      auto p = p0, g = g0, m = m0, v = v0, p2 = p0, g2 = g0, m2 = m0, v2 = v0;
      ref->adam_step(view(p, {50}), view(g, {50}), view(m, {50}), view(v, {50}), a);
      cuda::adam_step(p2.data(), g2.data(), m2.data(), v2.data(), DType::f32, 50, a, nullptr);
      expect_near(p2, p, 1e-7, "adam params"), expect_near(m2, m, 1e-7, "adam m");
      expect_near(v2, v, 1e-7, "adam v"), expect_near(g2, g, 0, "adam zeroed grads");
    }
    for (bool nesterov : {false, true})
      for (bool first : {true, false}) {
        SgdParams s{.lr = 0.1,
                    .momentum = 0.9,
                    .dampening = nesterov ? 0.0 : 0.2,
                    .weight_decay = 0.01,
                    .nesterov = nesterov,
                    .first_step = first};
        auto p = p0, buf = m0, p2 = p0, buf2 = m0;
        ref->sgd_step(view(p, {50}), view(g0, {50}), view(buf, {50}), s);
        cuda::sgd_step(p2.data(), g0.data(), buf2.data(), DType::f32, 50, s, nullptr);
        expect_near(p2, p, 1e-7, "sgd params"), expect_near(buf2, buf, 1e-7, "sgd momentum");
      }
  }
  {  // embedding forward and backward, i32 ids with repeats; an id out of range
    const int64_t V = 9, E = 5, n = 17;
    auto table = random(rng, V * E), dout = random(rng, n * E);
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = int32_t(rng.next() % V);
    std::vector<float> want(n * E), got(n * E), dwant(V * E), dgot(V * E);
    const Tensor id_t(ids.data(), DType::i32, {n});
    ref->embedding_forward(view(want, {n, E}), view(table, {V, E}), id_t);
    uint64_t bad[cuda::kReportWords] = {UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX};
    cuda::embedding_forward(got.data(), table.data(), ids.data(), DType::i32, DType::f32, n, E, V,
                            bad, nullptr);
    EXPECT_EQ(bad[0], UINT64_MAX);
    expect_near(got, want, 0, "embedding forward");
    ref->embedding_backward(view(dwant, {V, E}), view(dout, {n, E}), id_t);
    std::vector<uint64_t> keys(cuda::embedding_sort_keys(n));
    cuda::embedding_backward(dgot.data(), dout.data(), ids.data(), DType::i32, DType::f32, n, E, V,
                             keys.data(), nullptr);
    expect_near(dgot, dwant, 1e-6, "embedding backward");
    // Two bad ids: the lower position is reported, though here a thread reaches the higher one
    // first (the emulation runs each thread's grid-stride loop whole, in turn).
    ids[2] = -1, ids[5] = int32_t(V);
    cuda::embedding_forward(got.data(), table.data(), ids.data(), DType::i32, DType::f32, n, E, V,
                            bad, nullptr);
    EXPECT_EQ(bad[0], 2u | cuda::kResolvedReport);
    EXPECT_EQ(static_cast<int64_t>(bad[1]), -1);
    EXPECT_EQ(bad[2], uint64_t(V));
    EXPECT_EQ(bad[3], cuda::kBadTokenId);
  }
  {  // embedding backward sorting more ids than a block holds (its merges across blocks), i64
     // ids with long runs of repeats and two the forward reported, which it skips
    const int64_t V = 300, E = 3, n = 5003;
    auto dout = random(rng, n * E);
    std::vector<int64_t> ids(n);
    for (auto& id : ids) id = rng.next() % 4 ? int64_t(rng.next() % 7) : int64_t(rng.next() % V);
    std::vector<float> dwant(V * E, 0.5f), dgot(V * E, 0.5f);
    std::vector<uint64_t> keys(cuda::embedding_sort_keys(n));
    ASSERT_EQ(keys.size(), 8192u);
    // The reference, which refuses a bad id, sees those two rows as zeros.
    auto dout_valid = dout;
    for (const int64_t i : {17, 4000})
      for (int64_t j = 0; j < E; ++j) dout_valid[i * E + j] = 0;
    ref->embedding_backward(view(dwant, {V, E}), view(dout_valid, {n, E}),
                            Tensor(ids.data(), DType::i64, {n}));
    ids[17] = -1, ids[4000] = V;
    cuda::embedding_backward(dgot.data(), dout.data(), ids.data(), DType::i64, DType::f32, n, E, V,
                             keys.data(), nullptr);
    expect_near(dgot, dwant, 1e-5, "embedding backward, sorted across blocks");
    // The keys end sorted and unique (id << 32 | position), the two bad ids and the padding last.
    for (size_t i = 1; i < keys.size(); ++i)
      ASSERT_TRUE(keys[i - 1] < keys[i] || keys[i] == ~0ull) << "key " << i;
    EXPECT_EQ(std::count(keys.begin(), keys.end(), ~0ull), int64_t(keys.size()) - n + 2);
    EXPECT_EQ(keys[0] >> 32, 0u);
  }
  {  // adapters: column scaling, DoRA's norm and backward
    const int64_t R = 13, C = 7;
    auto x = random(rng, R * C), s = random(rng, C), bias = random(rng, C), m = random(rng, R);
    std::vector<float> want(R * C), got(R * C);
    ref->scale_columns(view(want, {R, C}), view(x, {R, C}), view(s, {C}), view(bias, {C}));
    cuda::scale_columns(got.data(), C, nullptr, x.data(), s.data(), bias.data(), DType::f32, R, C,
                        nullptr);
    // x s + b is one FMA on a GPU (and here, compiled as nvcc compiles): one rounding fewer.
    expect_near(got, want, 2.4e-7, "scale_columns");
    std::vector<float> sw(R), iw(R), sg(R), ig(R);
    ref->dora_norm(view(sw, {R}), view(iw, {R}), view(x, {R, C}), view(m, {R}));
    cuda::dora_norm(sg.data(), ig.data(), x.data(), m.data(), DType::f32, R, C, nullptr);
    expect_near(sg, sw, 1e-6, "dora scale"), expect_near(ig, iw, 1e-6, "dora inv_norm");
    auto dy = random(rng, R * C), pre = random(rng, R * C), inv = random(rng, C, 0.5, 2);
    auto dm_want = random(rng, C), dm_got = dm_want;
    std::vector<float> dpre_want(R * C), dpre_got(R * C);
    ref->dora_backward(view(dpre_want, {R, C}), view(dm_want, {C}), view(dy, {R, C}),
                       view(pre, {R, C}), view(s, {C}), view(inv, {C}));
    std::vector<double> partial(static_cast<size_t>(cuda::layer_norm_partial_chunks(R) * C));
    cuda::dora_backward(dpre_got.data(), dm_got.data(), dy.data(), C, pre.data(), s.data(),
                        inv.data(), partial.data(), DType::f32, R, C, nullptr);
    expect_near(dpre_got, dpre_want, 0, "dora dpre"), expect_near(dm_got, dm_want, 1e-6, "dora dm");
    // Rows in several bands (200: four of 50), dy's rows strided.
    const int64_t Rb = 200, ld = C + 3;
    auto dyb = random(rng, Rb * ld), preb = random(rng, Rb * C);
    auto dmb_want = random(rng, C), dmb_got = dmb_want;
    std::vector<float> dpreb_want(Rb * C), dpreb_got(Rb * C);
    ref->dora_backward(view(dpreb_want, {Rb, C}), view(dmb_want, {C}), view(dyb, {Rb, C}),
                       view(preb, {Rb, C}), view(s, {C}), view(inv, {C}), ld);
    partial.resize(static_cast<size_t>(cuda::layer_norm_partial_chunks(Rb) * C));
    cuda::dora_backward(dpreb_got.data(), dmb_got.data(), dyb.data(), ld, preb.data(), s.data(),
                        inv.data(), partial.data(), DType::f32, Rb, C, nullptr);
    expect_near(dpreb_got, dpreb_want, 0, "dora dpre in bands");
    expect_near(dmb_got, dmb_want, 1e-5, "dora dm in bands");
  }
  {  // a GEMM without products: C = beta C + bias
    auto c = random(rng, 4 * 6), bias = random(rng, 5);
    auto want = c;
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 5; ++j) want[r * 6 + j] = 0.5f * want[r * 6 + j] + bias[j];
    cuda::gemm_without_k(c.data(), 6, 4, 5, 0.5, bias.data(), DType::f32, nullptr);
    expect_near(c, want, 1e-7, "gemm with k = 0");
  }
}

// The emulation itself. A block's threads meet at __syncthreads; between barriers they run in
// turn, forwards in one phase and backwards in the next, so that a thread reading its
// neighbour's write with no barrier between them reads the poison in either phase.
__global__ void neighbour_kernel(float* out, int phase, bool barrier) {
  SF_DYNAMIC_SHARED(bytes);
  float* s = reinterpret_cast<float*>(bytes);
  const unsigned t = threadIdx.x, n = blockDim.x;
  if (phase == 1) __syncthreads();
  s[t] = float(t);
  if (barrier) __syncthreads();
  out[t] = s[(t + 1) % n] + s[(t + n - 1) % n];
}

__global__ void divergent_barriers_kernel() {
  if (threadIdx.x == 0)
    __syncthreads();
  else
    cooperative_groups::this_grid().sync();
}

__global__ void grid_sync_kernel() { cooperative_groups::this_grid().sync(); }

// __syncthreads is one aligned barrier for the whole block: reached at two places of the code,
// or by some threads while others have returned, it is undefined on a GPU.
__global__ void two_sites_kernel() {
  if (threadIdx.x % 2)
    __syncthreads();
  else
    __syncthreads();
}

__global__ void early_return_kernel(int n) {
  if (static_cast<int>(threadIdx.x) >= n) return;
  __syncthreads();
}

__global__ void early_return_before_grid_sync_kernel() {
  if (blockIdx.x == 1) return;
  cooperative_groups::this_grid().sync();
}

TEST(CudaKernelsEmulated, ThreadsMeetAtBarriersAndUnsyncedReadsSeeThePoison) {
  for (int phase : {0, 1})
    for (bool barrier : {true, false}) {
      std::vector<float> out(8, -1);
      SF_LAUNCH(1, 8, 8 * sizeof(float), nullptr, neighbour_kernel)(out.data(), phase, barrier);
      bool all_neighbours = true;
      for (unsigned t = 0; t < 8; ++t) all_neighbours &= out[t] == float((t + 1) % 8 + (t + 7) % 8);
      EXPECT_EQ(all_neighbours, barrier) << "phase " << phase << ", barrier " << barrier;
    }
  const auto divergent = SF_LAUNCH_COOPERATIVE(1, 8, 0, nullptr, divergent_barriers_kernel);
  EXPECT_DEATH(divergent(), "a kernel's threads wait at different barriers");
  const auto grid_sync_not_cooperative = SF_LAUNCH(1, 8, 0, nullptr, grid_sync_kernel);
  EXPECT_DEATH(grid_sync_not_cooperative(), "a grid sync in a launch that is not cooperative");
  const auto two_sites = SF_LAUNCH(1, 8, 0, nullptr, two_sites_kernel);
  EXPECT_DEATH(two_sites(),
               "block 0: thread 0 waits at the barrier at .*kernels_test.cpp:[0-9]+, "
               "thread 1 at .*kernels_test.cpp:[0-9]+");
  const auto early_return = SF_LAUNCH(1, 8, 0, nullptr, early_return_kernel);
  EXPECT_DEATH(early_return(5), "block 0: thread 5 ended while thread 0 waits at the barrier");
  early_return(8);  // every thread reaches it
  const auto grid_early =
      SF_LAUNCH_COOPERATIVE(2, 8, 0, nullptr, early_return_before_grid_sync_kernel);
  EXPECT_DEATH(grid_early(), "block 1: thread 0 ended while others wait at a grid sync");
  const auto too_many = SF_LAUNCH(1, 1025, 0, nullptr, grid_sync_kernel);
  EXPECT_DEATH(too_many(), "a launch of 1 blocks of 1025 threads");
}

// The emulated streams run work only when something waits for it, so that a missing event shows:
// a stream that reads another's result without waiting for it reads the value from before; with
// the wait, the result. A capture that forks work onto another stream must join it back, and a
// captured stream may not wait on an event from outside the capture.
TEST(CudaKernelsEmulated, StreamsRunWorkInTheOrderTheirEventsGive) {
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t written = nullptr, outside = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming), cudaSuccess);
  std::vector<float> x(4), y(4);
  for (bool wait : {false, true}) {
    std::fill(x.begin(), x.end(), 1.0f);
    std::fill(y.begin(), y.end(), 0.0f);
    cuda::fill(x.data(), DType::f32, 4, 5.0, a);
    cudaEventRecord(written, a);
    if (wait) cudaStreamWaitEvent(b, written, 0);
    cuda::add(y.data(), x.data(), DType::f32, 4, b);
    EXPECT_EQ(y[0], 0.0f) << "work ran before anything waited for it";
    cudaStreamSynchronize(b);
    EXPECT_EQ(y[3], wait ? 5.0f : 1.0f) << "wait " << wait;
    cudaStreamSynchronize(a);
    EXPECT_EQ(x[3], 5.0f);
  }
  for (bool join : {false, true}) {
    std::fill(x.begin(), x.end(), 1.0f);
    std::fill(y.begin(), y.end(), 0.0f);
    ASSERT_EQ(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cudaEventRecord(written, a);
    cudaStreamWaitEvent(b, written, 0);  // b joins the capture
    cuda::fill(y.data(), DType::f32, 4, 2.0, b);
    cudaEventRecord(written, b);
    if (join) cudaStreamWaitEvent(a, written, 0);
    cuda::add(x.data(), y.data(), DType::f32, 4, a);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(a, &graph), join ? cudaSuccess : cudaErrorStreamCaptureUnjoined);
    if (!join) continue;
    EXPECT_EQ(y[0], 0.0f) << "captured work ran";
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
    ASSERT_EQ(cudaGraphLaunch(exec, a), cudaSuccess);
    cudaStreamSynchronize(a);
    EXPECT_EQ(y[3], 2.0f);
    EXPECT_EQ(x[3], 3.0f);
    cudaGraphExecDestroy(exec);
  }
  cudaEventRecord(outside, b);
  ASSERT_EQ(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(a, outside, 0), cudaErrorStreamCaptureIsolation);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(a, &graph), cudaErrorStreamCaptureInvalidated);
  for (cudaEvent_t e : {written, outside}) cudaEventDestroy(e);
  for (cudaStream_t s : {a, b}) cudaStreamDestroy(s);
}

}  // namespace
}  // namespace seqforge
