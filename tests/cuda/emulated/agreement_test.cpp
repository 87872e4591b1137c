// The CUDA backend's checks of its kernels against the reference at run time: attention's
// (src/backend/cuda/attention_agreement.hpp), where the first call of each kind is checked and
// agrees, a kernel that leaves its output unwritten (a launch the emulation skips) stops the run
// where it is the tiles, and where it is the tensor cores, they are dropped for the tiles with a
// warning and the call's results are the tiles'; and the optimizer's one-pass update
// (optimizer_agreement.hpp), whose first call is checked, a skipped launch stopping the run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "attention_problems.hpp"
#include "kernels/cuda/launch.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/rng.hpp"
#include "test_util.hpp"

namespace seqforge {
namespace {

using namespace test::attention;
using test::max_rel_error;

// An environment variable set for the scope, then unset.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Two batch rows (the second padded), two key/value heads of two query heads each: the checked
// slice is batch row 1, key/value head 1.
Problem grouped_problem(bool bf16_products, double dropout = 0) {
  AttentionShape s{.batch = 2, .seq = 20, .heads = 4, .head_dim = 16, .causal = true};
  s.kv_heads = 2;
  s.dropout = dropout;
  s.seed = 5;
  s.bf16_products = bf16_products;
  return make_problem(s, {20, 13}, 91);
}

// p forward and backward in f32 on `gpu`, the `nth` launch from now skipped: the result, and
// what was said on stderr into `said`.
Result run_skipping(Backend& gpu, const Problem& p, int nth, std::string* said) {
  gpu.synchronize();
  sf_emu::skip_launch(nth);
  testing::internal::CaptureStderr();
  const Result r = run(gpu, DType::f32, p);
  *said = testing::internal::GetCapturedStderr();
  return r;
}

TEST(AttentionAgreementEmulated, TheFirstCallOfEachKindIsCheckedAndAgrees) {
  const ScopedEnv verbose("SEQFORGE_VERBOSE", "1");
  auto gpu = make_cuda_backend();
  auto ref = make_reference_backend();
  const Problem p = grouped_problem(false, 0.1);
  testing::internal::CaptureStderr();
  const Result first = run(*gpu, DType::f32, p);
  const Result second = run(*gpu, DType::f32, p);
  run(*gpu, DType::f32, p, false, p.shape.seq - 1);  // decoding: a kind of its own
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(said, "attention's kernels agree with the reference forward"), 2) << said;
  EXPECT_EQ(count(said, "attention's kernels agree with the reference backward"), 1) << said;
  EXPECT_EQ(first.out, second.out);
  const Result want = run(*ref, DType::f64, p);
  EXPECT_LT(max_rel_error(first.out, want.out), 1e-5);
  EXPECT_LT(max_rel_error(first.dqkv, want.dqkv), 1e-5);

  const ScopedEnv tensor_cores("SEQFORGE_CUDA_ATTENTION", "tensor_cores");
  testing::internal::CaptureStderr();
  run(*gpu, DType::f32, grouped_problem(true));
  const std::string tc = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(tc, "attention's tensor-core kernels agree with the reference forward"), 1) << tc;
  EXPECT_EQ(count(tc, "attention's tensor-core kernels agree with the reference backward"), 1)
      << tc;
}

// The emulated GPU offers a block 99 KiB of shared memory, as an RTX 3090 or 4090: tensor cores
// for every head up to Gemma's 256.
TEST(AttentionAgreementEmulated, TensorCoresHoldEveryHeadUpTo256In99KiB) {
  const ScopedEnv tensor_cores("SEQFORGE_CUDA_ATTENTION", "tensor_cores");
  for (int64_t D = 1; D <= 256; ++D) {
    AttentionShape s{.batch = 1, .seq = 8, .heads = 1, .head_dim = D};
    s.bf16_products = true;
    EXPECT_EQ(cuda::attention_kernels(s, DType::f32), cuda::AttentionKernels::tensor_cores)
        << "head size " << D;
  }
}

TEST(AttentionAgreementEmulated, TilesThatDisagreeStopTheRun) {
  const Problem p = grouped_problem(false);
  {
    auto gpu = make_cuda_backend();
    gpu->synchronize();
    sf_emu::skip_launch(1);  // the forward
    const std::string e = test::error_of([&] { run(*gpu, DType::f32, p); });
    EXPECT_NE(e.find("cuda: attention's kernels disagree with the reference on this device "
                     "(forward: "),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("train on the CPU (train.device: cpu)"), std::string::npos) << e;
  }
  auto gpu = make_cuda_backend();
  run(*gpu, DType::f32, p, false);  // forward checked
  gpu->synchronize();
  sf_emu::skip_launch(4);  // forward, then backward's delta, dK and dV, dQ
  const std::string e = test::error_of([&] { run(*gpu, DType::f32, p); });
  EXPECT_NE(
      e.find("cuda: attention's kernels disagree with the reference on this device (backward: dq"),
      std::string::npos)
      << e;
}

TEST(AttentionAgreementEmulated, TensorCoresThatDisagreeAreDroppedForTheTiles) {
  const Problem p = grouped_problem(true, 0.1);
  auto tiles_gpu = make_cuda_backend();
  const Result tiles = run(*tiles_gpu, DType::f32, p);
  const ScopedEnv tensor_cores("SEQFORGE_CUDA_ATTENTION", "tensor_cores");
  {  // forward
    auto gpu = make_cuda_backend();
    std::string said;
    const Result got = run_skipping(*gpu, p, 1, &said);
    EXPECT_NE(said.find("seqforge: warning: attention's tensor-core kernels disagree with the "
                        "reference on this device (forward: "),
              std::string::npos)
        << said;
    EXPECT_NE(said.find("they are not used"), std::string::npos) << said;
    EXPECT_EQ(got.out, tiles.out);
    EXPECT_EQ(got.lse, tiles.lse);
    EXPECT_EQ(got.dqkv, tiles.dqkv);
  }
  auto gpu = make_cuda_backend();
  const Result tc = run(*gpu, DType::f32, p, false);  // forward on tensor cores, checked
  EXPECT_NE(tc.out, tiles.out) << "the tensor cores did not run";
  std::string said;
  const Result got = run_skipping(*gpu, p, 3, &said);  // forward, backward's delta, dK and dV
  EXPECT_NE(said.find("seqforge: warning: attention's tensor-core kernels disagree with the "
                      "reference on this device (backward: d"),
            std::string::npos)
      << said;
  EXPECT_EQ(got.out, tc.out);
  EXPECT_EQ(got.dqkv, tiles.dqkv);  // the tiles' backward from the tiles' forward
  const Result after = run(*gpu, DType::f32, p);
  EXPECT_EQ(after.out, tiles.out);
  EXPECT_EQ(after.dqkv, tiles.dqkv);
}

// One AdamW update over arenas of three segments (decayed, not decayed and short, frozen), values
// laid out apart from the gradients, clipped from a sum of squares in device memory: the arenas
// after it.
std::map<std::string, std::vector<double>> adamw_step(Backend& be) {
  using S = OptimizerSegment;
  const std::vector<OptimizerSegment> segments = {
      {5, 0, 40, S::kDecays}, {50, 44, 3, 0}, {60, 50, 70, S::kFrozen | S::kDecays}};
  const int64_t nv = 130, ng = 120;
  Rng rng(17);
  auto values = [&](int64_t n, double lo, double hi) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = static_cast<float>(rng.uniform(lo, hi));
    return v;
  };
  test::HostTensor p(be, DType::f32, {nv}, values(nv, -1, 1)),
      g(be, DType::f32, {ng}, values(ng, -1e-2, 1e-2)),
      m(be, DType::f32, {ng}, values(ng, -1e-3, 1e-3)),
      v(be, DType::f32, {ng}, values(ng, 0, 1e-5));
  std::vector<double> table;
  for (const OptimizerSegment& seg : segments)
    table.insert(table.end(), {double(seg.value_offset), double(seg.grad_offset), double(seg.numel),
                               double(seg.flags)});
  test::HostTensor seg_t(be, DType::i64, {3, 4}, table), steps(be, DType::i64, {3}, {4, 0, 2}),
      lr(be, DType::f64, {1}, {1e-2}), sum_squares(be, DType::f64, {1}, {3.0});
  OptimizerStep a;
  a.weight_decay = 0.1;
  a.clip = {.sum_squares = static_cast<const double*>(sum_squares.t.data()), .max_norm = 0.5};
  a.zero_grads = true;
  a.params = p.t.data();
  a.grads = g.t.data();
  a.m = m.t.data();
  a.v = v.t.data();
  a.grad_elements = ng;
  a.segments = static_cast<const OptimizerSegment*>(seg_t.t.data());
  a.segment_count = 3;
  a.steps = static_cast<int64_t*>(steps.t.data());
  a.lr = static_cast<const double*>(lr.t.data());
  be.optimizer_step(a, DType::f32);
  return {{"p", test::to_doubles(be, p.t)},
          {"grads", test::to_doubles(be, g.t)},
          {"m", test::to_doubles(be, m.t)},
          {"v", test::to_doubles(be, v.t)},
          {"steps", test::to_doubles(be, steps.t)}};
}

TEST(OptimizerAgreementEmulated, TheFirstUpdateIsCheckedAndAgrees) {
  const ScopedEnv verbose("SEQFORGE_VERBOSE", "1");
  auto gpu = make_cuda_backend();
  auto ref = make_reference_backend();
  testing::internal::CaptureStderr();
  const auto got = adamw_step(*gpu);
  adamw_step(*gpu);
  const std::string said = testing::internal::GetCapturedStderr();
  // 16 + 16 of the first segment, 3 of the second, 16 + 16 of the frozen one.
  EXPECT_EQ(count(said,
                  "seqforge: cuda: the optimizer's update agrees with the reference on 67 "
                  "sampled values of 3 segments"),
            1)
      << said;
  const auto want = adamw_step(*ref);
  for (const auto& [name, values] : want)
    EXPECT_LT(max_rel_error(got.at(name), values), 1e-6) << name;
}

TEST(OptimizerAgreementEmulated, AnUpdateThatDisagreesStopsTheRun) {
  for (const int skipped : {1, 2}) {  // the update, the update counts
    auto gpu = make_cuda_backend();
    gpu->synchronize();
    sf_emu::skip_launch(skipped);
    const std::string e = test::error_of([&] { adamw_step(*gpu); });
    const std::string what = skipped == 1 ? "segment 0's parameters: element 0 of 40 is "
                                          : "segment 0's update count is 4, the reference's 5";
    EXPECT_NE(e.find("cuda: the optimizer's update disagrees with the reference on this device "
                     "(" +
                     what),
              std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace seqforge
