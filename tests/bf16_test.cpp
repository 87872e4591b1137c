// Mixed precision (bf16 GEMM operands, f32 everything else): the CPU backend against the
// reference backend running the same bf16 arithmetic, and both against the f32 model.
#include <gtest/gtest.h>

#include "seqforge/nn/sequence_model.hpp"
#include "test_util.hpp"

namespace seqforge::bf16_test {
namespace {

using test::max_rel_error;
using test::relative_l2;
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

// Same bf16 operands on both backends, f32 sums in other orders; so now and then a value one
// backend rounds to bf16 lies on the other side of a rounding midpoint in the other, and that
// operand's step of 2^-8 moves what follows: over 60 random models each way the worst element's
// error reached 5e-4 in y and 2e-2 in dx, and 16 of the 120 runs went past 1e-4 in y or 1e-3 in a
// gradient. Each distance (L2, relative) is judged against bf16's own from f32 on the reference:
// over 300 random models the CPU's came to at most 0.24 of it, where a CPU that truncated to bf16
// rather than rounding came to 0.63 or more in every one.
TEST(Bf16, CpuFollowsTheReferenceInBf16) {
  SF_SKIP_WITHOUT_BF16();
  auto cpu = make_cpu_backend();
  auto ref = make_reference_backend();
  for (bool bi : {false, true}) {
    const StepResult a = train_step(*cpu, options(bi), DType::bf16, 6, 9);
    const StepResult b = train_step(*ref, options(bi), DType::bf16, 6, 9);
    const StepResult f32 = train_step(*ref, options(bi), DType::f32, 6, 9);
    const auto follows = [](const std::vector<double>& got, const std::vector<double>& want,
                            const std::vector<double>& full) {
      EXPECT_GT(relative_l2(want, full), 1e-5);  // the bf16 path ran
      return relative_l2(got, want) / relative_l2(want, full);
    };
    EXPECT_LE(follows(a.y, b.y, f32.y), 0.5) << "bidirectional " << bi;
    EXPECT_LE(follows(a.grads, b.grads, f32.grads), 0.5) << "bidirectional " << bi;
    EXPECT_LE(follows(a.dx, b.dx, f32.dx), 0.5) << "bidirectional " << bi;
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

// A frozen base held in bf16 under adapters gives exactly what the f32 base gives when its values
// are bf16's (the GEMMs read them in bf16 either way), for LoRA and DoRA on both families, and
// close to what f32 GEMMs give.
struct AdaptedStep {
  std::vector<double> y, grads;
};

AdaptedStep adapted_step(Backend& be, Model& model, Tensor x) {
  Rng rng(5);
  Tensor y = model.forward(be, x, {}, {}, true, rng);
  std::vector<float> dy(y.numel());
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(std::sin(0.37 * double(i)));
  Parameters& p = model.parameters();
  p.zero_grad(be);
  model.backward(be, Tensor(dy.data(), DType::f32, y.shape()));
  return {to_doubles(y), to_doubles(p.grads().flat())};
}

void expect_bf16_base_matches(const ModelOptions& opt, Tensor x) {
  auto be = make_cpu_backend();
  ModelOptions low_opt = opt;
  low_opt.adapter.bf16_base = true;
  auto full = make_model(opt), low = make_model(low_opt);
  full->initialize(*be, 4);
  low->initialize(*be, 4);
  Parameters &pf = full->parameters(), &pl = low->parameters();
  ASSERT_EQ(pf.size(), pl.size());
  int narrow = 0;
  Rng rng(8);
  for (size_t i = 0; i < pf.size(); ++i) {
    const std::string& name = pf.values().entries()[i].name;
    if (pl.value(i).dtype() == DType::bf16) {
      ++narrow;
      EXPECT_TRUE(pl.fixed(i)) << name;
      be->convert(pf.value(i), pl.value(i));                // the f32 base holds the bf16 values
    } else if (name.find("lora_B") != std::string::npos) {  // away from zero, so that it counts
      std::vector<float> b(pf.value(i).numel());
      for (float& v : b) v = static_cast<float>(rng.uniform(-0.3, 0.3));
      be->upload(pf.value(i), b.data());
      be->upload(pl.value(i), b.data());
    }
  }
  EXPECT_GT(narrow, 0);
  full->init_adapters(*be, {});
  low->init_adapters(*be, {});
  full->set_gemm_dtype(DType::bf16);
  low->set_gemm_dtype(DType::bf16);
  const AdaptedStep a = adapted_step(*be, *full, x), b = adapted_step(*be, *low, x);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.grads, b.grads);
  // And the bf16 GEMMs near the f32 ones on the same values, relative to the largest of each.
  full->set_gemm_dtype(DType::f32);
  const AdaptedStep c = adapted_step(*be, *full, x);
  const double ey = max_rel_error(a.y, c.y, 1.0), eg = max_rel_error(a.grads, c.grads, 1.0);
  std::printf("bf16 vs f32 GEMMs: output %.2e, gradients %.2e\n", ey, eg);
  EXPECT_LT(ey, 3e-2);  // the bounds of CloseToFp32
  EXPECT_LT(eg, 5e-2);
}

TEST(Bf16, FrozenBaseHeldInBf16GivesTheSameStep) {
  SF_SKIP_WITHOUT_BF16();
  for (const AdapterKind kind : {AdapterKind::lora, AdapterKind::dora}) {
    SCOPED_TRACE(kind == AdapterKind::lora ? "lora" : "dora");
    ModelOptions gpt;
    gpt.family = ModelFamily::transformer;
    gpt.vocab_size = 11;
    gpt.transformer = {.block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 24};
    std::vector<int64_t> ids(3 * 16);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 7 % 11);
    for (const double dropout : {0.0, 0.2}) {  // adapter dropout: DoRA's base term on its own
      SCOPED_TRACE("adapter dropout " + std::to_string(dropout));
      gpt.adapter = {.kind = kind, .rank = 4, .alpha = 8.0, .dropout = dropout};
      expect_bf16_base_matches(gpt, Tensor(ids.data(), DType::i64, {3, 16}));
    }

    ModelOptions lstm = options(true);
    lstm.adapter = {
        .kind = kind, .rank = 3, .alpha = 6.0, .targets = {"lstm.weight_ih", "lstm.weight_hh"}};
    std::vector<float> x(4 * 7 * 5);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::cos(0.11 * double(i)));
    expect_bf16_base_matches(lstm, Tensor(x.data(), DType::f32, {4, 7, 5}));
  }
}

}  // namespace
}  // namespace seqforge::bf16_test
