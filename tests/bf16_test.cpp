// Mixed precision (bf16 GEMM operands, f32 everything else): the CPU backend against the
// reference backend running the same bf16 arithmetic, and both against the f32 model.
#include <gtest/gtest.h>

#include "seqforge/nn/sequence_model.hpp"
#include "test_util.hpp"

namespace seqforge {
namespace {

using test::max_rel_error;
using test::to_doubles;

struct StepResult {
  std::vector<double> y, grads, dx;
};

StepResult train_step(Backend& be, const ModelOptions& opt, DType gemm_dtype, int64_t B,
                      int64_t T) {
  SequenceModel model(opt);
  model.initialize(be, 11);
  model.set_gemm_dtype(gemm_dtype);
  model.rnn().set_weight_grad_chunk(T / 3);  // several chunks of K-major copies in bf16
  Rng rng(3);
  std::vector<float> x(B * T * opt.rnn.input_size);
  for (float& v : x) v = static_cast<float>(rng.uniform(-1, 1));
  Tensor y = model.forward(be, Tensor(x.data(), DType::f32, {B, T, opt.rnn.input_size}), {}, {},
                           true, rng);
  std::vector<float> dy(y.numel());
  for (float& v : dy) v = static_cast<float>(rng.uniform(-1, 1));
  model.parameters().zero_grad(be);
  Tensor dx = model.backward(be, Tensor(dy.data(), DType::f32, y.shape()));
  return {to_doubles(y), to_doubles(model.parameters().grads().flat()), to_doubles(dx)};
}

ModelOptions options(bool bidirectional) {
  ModelOptions opt;
  opt.rnn = {.input_size = 5,
             .hidden_size = 24,
             .num_layers = 2,
             .bidirectional = bidirectional,
             .batch_first = true};
  opt.output_size = 3;
  opt.per_step = true;
  return opt;
}

TEST(Bf16, CpuMatchesReferenceInBf16) {
  SF_SKIP_WITHOUT_BF16();
  auto cpu = make_cpu_backend();
  auto ref = make_reference_backend();
  for (bool bi : {false, true}) {
    const StepResult a = train_step(*cpu, options(bi), DType::bf16, 6, 9);
    const StepResult b = train_step(*ref, options(bi), DType::bf16, 6, 9);
    // Same bf16 operands; only the f32 accumulation order differs.
    EXPECT_LE(max_rel_error(a.y, b.y), 1e-4) << "bidirectional " << bi;
    EXPECT_LE(max_rel_error(a.grads, b.grads), 1e-3) << "bidirectional " << bi;
    EXPECT_LE(max_rel_error(a.dx, b.dx), 1e-3) << "bidirectional " << bi;
  }
}

TEST(Bf16, CloseToFp32) {
  SF_SKIP_WITHOUT_BF16();
  auto cpu = make_cpu_backend();
  for (bool bi : {false, true}) {
    const StepResult low = train_step(*cpu, options(bi), DType::bf16, 16, 20);
    const StepResult full = train_step(*cpu, options(bi), DType::f32, 16, 20);
    const double ey = max_rel_error(low.y, full.y), eg = max_rel_error(low.grads, full.grads);
    std::printf("bf16 vs fp32 (bidirectional %d): output %.2e, gradients %.2e\n", bi, ey, eg);
    EXPECT_LE(ey, 3e-2);
    EXPECT_LE(eg, 5e-2);
    EXPECT_GT(ey, 0.0);  // the bf16 path really ran
  }
}

TEST(Bf16, RejectsBf16WithF64Parameters) {
  SequenceModel model(options(false), DType::f64);
  EXPECT_THROW(model.set_gemm_dtype(DType::bf16), Error);
}

}  // namespace
}  // namespace seqforge
