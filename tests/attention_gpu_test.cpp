// Attention on a GPU's tensor cores (bf16 or fp16 products of f32 tensors, SEQFORGE_CUDA_ATTENTION=
// tensor_cores) against the reference in f64, within what rounding the operands explains:
// head sizes off and on multiples of 16, sequences across the tiles, causal or not, padded
// rows, dropout, grouped key/value heads and sliding windows. Runs on the emulated GPU in CI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "attention_problems.hpp"
#include "seqforge/backend/backend.hpp"
#include "test_util.hpp"

namespace seqforge::attention_gpu_test {
namespace {

using namespace test::attention;
using test::sweep_case_runs;

// An environment variable set for the scope, then unset.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};
struct ScopedAttentionChoice : ScopedEnv {
  explicit ScopedAttentionChoice(const char* v) : ScopedEnv("SEQFORGE_CUDA_ATTENTION", v) {}
};

// The sweep on tensor cores with `products` (bf16 or fp16) operands over head sizes `heads` and
// sequence lengths `seqs`: its largest errors.
void tensor_core_sweep(DType products, std::initializer_list<int64_t> heads,
                       std::initializer_list<int64_t> seqs) {
  auto ref = make_reference_backend();
  auto gpu = make_backend("cuda");
  const ScopedAttentionChoice tensor_cores("tensor_cores");
  Errors worst;
  int count = 0, index = 0, differs_from_f32 = 0;
  for (int64_t D : heads)
    for (int64_t T : seqs)
      for (bool causal : {true, false})
        for (bool padded : {false, true}) {
          const int idx = index++;
          if (!sweep_case_runs(idx)) continue;
          ++count;
          bool peaked;
          AttentionShape s = grouped_shape(idx, T, D, causal, &peaked);
          s.batch = 1 + idx % 2;
          if (idx % 3 == 1) {
            s.dropout = 0.2;
            s.seed = 41 + idx;
          }
          const Problem p = make_problem(
              s, padded ? sweep_lengths(idx, s.batch, T) : std::vector<int64_t>{}, 7000 + idx);
          differs_from_f32 += expect_within_product_rounding(*ref, *gpu, p, worst, products);
        }
  EXPECT_GT(differs_from_f32, count / 2) << "the tensor-core kernels did not run";
  std::printf(
      "tensor cores, %s products, %d shapes, heads up to %lld; largest relative errors: out %.2e, "
      "lse %.2e, dqkv %.2e\n",
      std::string(dtype_name(products)).c_str(), count, static_cast<long long>(std::max(heads)),
      worst.out, worst.lse, worst.dqkv);
}

TEST(Attention, GpuTensorCoresMatchReferenceWithinBf16Rounding) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  tensor_core_sweep(DType::bf16, {7, 16, 65}, {1, 17, 130});
}

TEST(Attention, GpuTensorCoresMatchReferenceWithinFp16Rounding) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  tensor_core_sweep(DType::f16, {7, 16, 65}, {1, 17, 130});
}

// Llama's and Gemma's heads: on a GPU with 99 KiB of shared memory per block (sm_86, sm_89; the
// emulated one is given as much) their tiles hold fewer rows.
TEST(Attention, GpuTensorCoresMatchReferenceForHeadsOf128And256) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const ScopedEnv shared("SEQFORGE_EMULATED_SHARED_KB", "99");
  tensor_core_sweep(DType::bf16, {128, 256}, {33, 90});
}

// The smallest tiles, (16, 64) to (16, 16), where an emulated GPU offers a block 20 KiB (a real
// one runs its own tiles).
TEST(Attention, GpuTensorCoresMatchReferenceOnTheSmallestTiles) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const ScopedEnv shared("SEQFORGE_EMULATED_SHARED_KB", "20");
  tensor_core_sweep(DType::f16, {16, 40}, {17, 70});
}

TEST(Attention, GpuAttentionChoiceIsChecked) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  auto gpu = make_backend("cuda");
  const ScopedAttentionChoice wrong("tensor-cores");
  AttentionShape s{.batch = 1, .seq = 4, .heads = 1, .head_dim = 8};
  s.bf16_products = true;
  const Problem p = make_problem(s, {}, 3);
  const std::string e = test::error_of([&] { run(*gpu, DType::f32, p); });
  EXPECT_NE(e.find("SEQFORGE_CUDA_ATTENTION: unknown value 'tensor-cores' (expected f32 or "
                   "tensor_cores)"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace seqforge::attention_gpu_test
