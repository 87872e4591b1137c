// Dynamic loss scaling (GradScaler's semantics) and the fused optimizer update: injected
// overflows skip the step and back the scale off, clean steps grow it again, and the fused
// unscale + clip + step + zero pass equals the separate passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/optim/optimizer.hpp"
#include "test_util.hpp"

namespace seqforge::loss_scale_test {
namespace {

using test::max_rel_error;
using test::to_doubles;

TEST(LossScaler, GradScalerSemantics) {
  LossScaler s(
      {.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(true));  // overflow: skip, back off
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(false));  // third clean step in a row: grow
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));  // an overflow resets the run of clean steps
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_THROW(LossScaler({.backoff_factor = 1.5}), Error);
  EXPECT_THROW(LossScaler({.growth_interval = 0}), Error);
}

// A small model and one batch; each step's loss gradient is multiplied by the current scale.
struct Fixture {
  std::unique_ptr<Backend> be = make_cpu_backend();
  SequenceModel model{[] {
    ModelOptions o;
    o.rnn = {.input_size = 3, .hidden_size = 8, .num_layers = 1, .batch_first = true};
    return o;
  }()};
  std::vector<float> x, y, dy;
  Rng rng{1};
  Fixture() {
    model.initialize(*be, 3);
    x.resize(4 * 5 * 3);
    for (auto& v : x) v = static_cast<float>(rng.uniform(-1, 1));
    y.assign(4, 0.5f);
    dy.resize(4);
  }
  // Forward, loss, backward with the loss scaled by `scale`; `poison` puts an inf in dy.
  void backward(double scale, bool poison) {
    Tensor out = model.forward(*be, Tensor(x.data(), DType::f32, {4, 5, 3}), {}, {}, true, rng);
    Tensor d(dy.data(), DType::f32, {4, 1});
    be->mse_loss(out, Tensor(y.data(), DType::f32, {4, 1}), {}, d);
    be->scale(d, scale);
    if (poison) dy[1] = std::numeric_limits<float>::infinity();
    model.backward(*be, d);
  }
};

TEST(LossScaler, InjectedOverflowSkipsTheStepThenTheScaleGrowsAgain) {
  Fixture f;
  Optimizer opt(*f.be, f.model.parameters(), {.kind = "adamw", .lr = 1e-2});
  LossScaler scaler({.init_scale = 256, .growth_interval = 2});
  f.model.parameters().zero_grad(*f.be);

  f.backward(scaler.scale(), false);
  StepReport r = fused_step(*f.be, f.model.parameters(), opt, 1.0, &scaler);
  EXPECT_TRUE(r.applied);
  EXPECT_EQ(scaler.scale(), 256);

  const auto before = to_doubles(f.model.parameters().values().flat());
  f.backward(scaler.scale(), true);  // overflow
  r = fused_step(*f.be, f.model.parameters(), opt, 1.0, &scaler);
  EXPECT_FALSE(r.applied);
  EXPECT_FALSE(std::isfinite(r.grad_norm));
  EXPECT_EQ(scaler.scale(), 128);                                       // backed off
  EXPECT_EQ(to_doubles(f.model.parameters().values().flat()), before);  // step skipped
  EXPECT_EQ(opt.steps(), 1);
  for (double g : to_doubles(f.model.parameters().grads().flat())) EXPECT_EQ(g, 0.0);

  for (int i = 0; i < 2; ++i) {  // two clean steps: the scale grows back
    f.backward(scaler.scale(), false);
    EXPECT_TRUE(fused_step(*f.be, f.model.parameters(), opt, 1.0, &scaler).applied);
  }
  EXPECT_EQ(scaler.scale(), 256);
  EXPECT_NE(to_doubles(f.model.parameters().values().flat()), before);
  EXPECT_EQ(opt.steps(), 3);
}

TEST(FusedStep, EqualsUnscaleClipStepZeroInSeparatePasses) {
  for (const char* kind : {"adamw", "adam", "sgd"}) {
    Fixture a, b;
    OptimizerOptions o{.kind = kind, .lr = 0.05, .weight_decay = 0.01, .momentum = 0.9};
    Optimizer oa(*a.be, a.model.parameters(), o), ob(*b.be, b.model.parameters(), o);
    LossScaler scaler({.init_scale = 1024});
    for (int step = 0; step < 3; ++step) {
      a.model.parameters().zero_grad(*a.be);
      b.model.parameters().zero_grad(*b.be);
      a.backward(1.0, false);
      b.backward(scaler.scale(), false);
      const double norm = clip_grad_norm(*a.be, a.model.parameters(), 0.05);
      oa.step();
      const StepReport r = fused_step(*b.be, b.model.parameters(), ob, 0.05, &scaler);
      EXPECT_TRUE(r.applied);
      EXPECT_NEAR(r.grad_norm, norm, 1e-5 * norm) << kind;
      EXPECT_LT(r.clip_coef, 1.0) << kind;  // clipping was active
      EXPECT_LE(max_rel_error(to_doubles(b.model.parameters().values().flat()),
                              to_doubles(a.model.parameters().values().flat())),
                1e-5)
          << kind << " step " << step;
      for (double g : to_doubles(b.model.parameters().grads().flat())) EXPECT_EQ(g, 0.0);
    }
  }
}

// Frozen parameters (train.freeze_modules) leave the norm that clipping scales by, as their
// missing gradients leave PyTorch's clip_grad_norm_: the others step as if they alone had
// gradients.
TEST(FusedStep, FrozenParametersLeaveTheNorm) {
  for (const char* kind : {"adamw", "sgd"}) {
    Fixture a, b;
    const OptimizerOptions o{.kind = kind, .lr = 0.05, .momentum = 0.9};
    Optimizer oa(*a.be, a.model.parameters(), o), ob(*b.be, b.model.parameters(), o);
    Parameters& pa = a.model.parameters();
    std::vector<bool> frozen(pa.size());
    for (size_t i = 0; i < pa.size(); ++i)
      frozen[i] = pa.values().entries()[i].name.rfind("head.", 0) == 0;
    ASSERT_EQ(std::count(frozen.begin(), frozen.end(), true), 2);
    oa.set_frozen(frozen);
    ob.set_frozen(frozen);
    const std::vector<double> head_before = to_doubles(b.model.parameters().value(pa.size() - 1));
    for (int step = 0; step < 2; ++step) {
      pa.zero_grad(*a.be);
      b.model.parameters().zero_grad(*b.be);
      a.backward(1.0, false);
      b.backward(1.0, false);
      const double all = std::sqrt(a.be->sum_squares(pa.grads().flat()));
      for (size_t i = 0; i < pa.size(); ++i)
        if (frozen[i]) a.be->fill(pa.grad(i), 0.0);
      const double norm = clip_grad_norm(*a.be, pa, 0.05);
      oa.step();
      const StepReport r = fused_step(*b.be, b.model.parameters(), ob, 0.05, nullptr);
      EXPECT_LT(norm, all * (1 - 1e-3)) << kind;  // the head's gradients counted otherwise
      EXPECT_NEAR(r.grad_norm, norm, 1e-6 * norm) << kind;
      EXPECT_LE(max_rel_error(to_doubles(b.model.parameters().values().flat()),
                              to_doubles(pa.values().flat())),
                1e-6)
          << kind << " step " << step;
    }
    EXPECT_EQ(to_doubles(b.model.parameters().value(pa.size() - 1)), head_before) << kind;
  }
}

}  // namespace
}  // namespace seqforge::loss_scale_test
