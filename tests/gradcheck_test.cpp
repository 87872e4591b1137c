// Finite-difference gradient checks in double precision on the reference backend: every layer and
// loss. The objective is L = sum(output * R) for a fixed random R (or the loss itself), and every
// analytic gradient (parameters, inputs, initial states) is compared with central differences.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/layers.hpp"
#include "seqforge/nn/recurrent.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/nn/transformer.hpp"
#include "test_util.hpp"

namespace seqforge::gradcheck_test {
namespace {

using test::HostTensor;
using test::to_doubles;

std::vector<double> random_values(Rng& rng, int64_t n, double scale = 1.0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = rng.uniform(-scale, scale);
  return v;
}

double dot(Tensor a, const std::vector<double>& r) {
  const auto v = to_doubles(a);
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
  return s;
}

// Compares `analytic` with central differences of `objective` over the elements of `x` (at most
// `max_checks` of them, spread evenly). Returns the worst relative error. A step of 1e-5 keeps
// both the truncation error (~h^2) and the rounding of the objective (~eps/h) far below 1e-6.
double check_gradient(Tensor x, const std::vector<double>& analytic,
                      const std::function<double()>& objective, int64_t max_checks = 60,
                      double step = 1e-5) {
  double* p = x.data_as<double>();
  const int64_t n = x.numel();
  const int64_t stride = std::max<int64_t>(1, n / max_checks);
  double worst = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const double saved = p[i], h = step * std::max(1.0, std::fabs(saved));
    p[i] = saved + h;
    const double up = objective();
    p[i] = saved - h;
    const double down = objective();
    p[i] = saved;
    const double numeric = (up - down) / (2 * h);
    const double err = std::fabs(numeric - analytic[i]) / std::max(1e-3, std::fabs(numeric));
    worst = std::max(worst, err);
  }
  return worst;
}

constexpr double kTolerance = 1e-6;

TEST(GradCheck, Linear) {
  auto be = make_reference_backend();
  Rng rng(1);
  Parameters params(DType::f64);
  Linear linear(params, "fc", 5, 3);
  params.allocate(*be, rng);
  HostTensor x(*be, DType::f64, {4, 5}, random_values(rng, 20));
  const auto r = random_values(rng, 12);
  auto objective = [&] { return dot(linear.forward(*be, x.t), r); };
  objective();
  HostTensor dy(*be, DType::f64, {4, 3}, r);
  params.zero_grad(*be);
  const auto dx = to_doubles(linear.backward(*be, dy.t));
  EXPECT_LT(check_gradient(x.t, dx, objective), kTolerance);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LT(check_gradient(params.value(i), to_doubles(params.grad(i)), objective), kTolerance)
        << params.values().entries()[i].name;
}

TEST(GradCheck, Embedding) {
  auto be = make_reference_backend();
  Rng rng(2);
  Parameters params(DType::f64);
  Embedding emb(params, "embedding", 7, 4);
  params.allocate(*be, rng);
  std::vector<int64_t> ids = {3, 0, 6, 3, 3, 1};  // repeated ids accumulate
  Tensor ids_t(ids.data(), DType::i64, {6});
  const auto r = random_values(rng, 24);
  auto objective = [&] { return dot(emb.forward(*be, ids_t), r); };
  objective();
  HostTensor dy(*be, DType::f64, {6, 4}, r);
  params.zero_grad(*be);
  emb.backward(*be, dy.t);
  EXPECT_LT(check_gradient(params.value(0), to_doubles(params.grad(0)), objective), kTolerance);
}

TEST(GradCheck, Dropout) {
  auto be = make_reference_backend();
  Rng rng(3);
  Dropout dropout(0.3);
  HostTensor x(*be, DType::f64, {8, 6}, random_values(rng, 48));
  const auto r = random_values(rng, 48);
  auto objective = [&] {
    Rng fixed(99);  // the same mask on every evaluation
    return dot(dropout.forward(*be, x.t, true, fixed), r);
  };
  objective();
  HostTensor dy(*be, DType::f64, {8, 6}, r);
  const auto dx = to_doubles(dropout.backward(*be, dy.t));
  EXPECT_LT(check_gradient(x.t, dx, objective, 48), kTolerance);
  // Every element is either dropped or scaled by 1 / (1 - p).
  int dropped = 0;
  for (size_t i = 0; i < dx.size(); ++i) {
    if (dx[i] == 0.0)
      ++dropped;
    else
      EXPECT_NEAR(dx[i], r[i] / 0.7, 1e-12);
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, 48);
}

struct LstmCase {
  const char* name;
  RecurrentOptions opt;
  int64_t T, B;
  bool states;
};

void PrintTo(const LstmCase& c, std::ostream* os) { *os << c.name; }

class LstmGradCheck : public ::testing::TestWithParam<LstmCase> {};

TEST_P(LstmGradCheck, AllGradients) {
  const LstmCase& c = GetParam();
  auto be = make_reference_backend();
  Rng rng(4);
  Parameters params(DType::f64);
  Recurrent lstm(params, "rnn", c.opt);
  params.allocate(*be, rng);
  const bool cell_state = lstm.cell().cell_state;
  const int64_t D = lstm.directions(), L = c.opt.num_layers, H = c.opt.hidden_size;
  const Shape x_shape =
      c.opt.batch_first ? Shape{c.B, c.T, c.opt.input_size} : Shape{c.T, c.B, c.opt.input_size};
  HostTensor x(*be, DType::f64, x_shape, random_values(rng, x_shape.numel()));
  const Shape s_shape{D * L, c.B, c.opt.state_size()}, c_shape{D * L, c.B, H};
  HostTensor h0, c0;
  if (c.states) {
    h0 = HostTensor(*be, DType::f64, s_shape, random_values(rng, s_shape.numel(), 0.5));
    c0 = HostTensor(*be, DType::f64, c_shape, random_values(rng, c_shape.numel(), 0.5));
    if (!cell_state) c0 = HostTensor();
  }
  const int64_t y_numel = c.T * c.B * lstm.output_size();
  const auto ry = random_values(rng, y_numel), rh = random_values(rng, s_shape.numel()),
             rc = random_values(rng, c_shape.numel());
  // L = sum(y * ry) + sum(h_n * rh) + sum(c_n * rc)
  auto objective = [&] {
    Rng fixed(5);
    Tensor y = lstm.forward(*be, x.t, h0.t, c0.t, true, fixed);
    return dot(y, ry) + dot(lstm.h_n(), rh) + (cell_state ? dot(lstm.c_n(), rc) : 0.0);
  };
  objective();
  const int64_t F = lstm.output_size();
  const Shape y_shape = c.opt.batch_first ? Shape{c.B, c.T, F} : Shape{c.T, c.B, F};
  HostTensor dy(*be, DType::f64, y_shape, ry), dhn(*be, DType::f64, s_shape, rh),
      dcn(*be, DType::f64, c_shape, rc);
  params.zero_grad(*be);
  const auto dx = to_doubles(lstm.backward(*be, dy.t, dhn.t, cell_state ? dcn.t : Tensor()));
  const auto dh0 = to_doubles(lstm.dh0());
  EXPECT_LT(check_gradient(x.t, dx, objective), kTolerance) << "dx";
  if (c.states) {
    EXPECT_LT(check_gradient(h0.t, dh0, objective), kTolerance) << "dh0";
    if (cell_state) {
      EXPECT_LT(check_gradient(c0.t, to_doubles(lstm.dc0()), objective), kTolerance) << "dc0";
    }
  }
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LT(check_gradient(params.value(i), to_doubles(params.grad(i)), objective), kTolerance)
        << params.values().entries()[i].name;
}

INSTANTIATE_TEST_SUITE_P(
    Layers, LstmGradCheck,
    ::testing::Values(
        LstmCase{"one_layer", {.input_size = 3, .hidden_size = 4}, 5, 2, false},
        LstmCase{"states", {.input_size = 2, .hidden_size = 3}, 4, 3, true},
        LstmCase{"two_layers_bi",
                 {.input_size = 3, .hidden_size = 3, .num_layers = 2, .bidirectional = true},
                 4,
                 2,
                 true},
        LstmCase{"batch_first",
                 {.input_size = 2, .hidden_size = 5, .num_layers = 2, .batch_first = true},
                 3,
                 2,
                 false},
        LstmCase{"dropout",
                 {.input_size = 3,
                  .hidden_size = 4,
                  .num_layers = 3,
                  .bidirectional = true,
                  .dropout = 0.4,
                  .batch_first = true},
                 3,
                 2,
                 true},
        LstmCase{"one_step", {.input_size = 1, .hidden_size = 1}, 1, 1, true},
        LstmCase{
            "gru_states", {.cell = CellKind::gru, .input_size = 2, .hidden_size = 3}, 4, 3, true},
        LstmCase{"variational_gru_bi",
                 {.cell = CellKind::gru,
                  .input_size = 3,
                  .hidden_size = 3,
                  .num_layers = 2,
                  .bidirectional = true,
                  .dropout = 0.4,
                  .variational_dropout = true},
                 4,
                 2,
                 true},
        LstmCase{"variational_lstm_proj",
                 {.input_size = 20,
                  .hidden_size = 4,
                  .num_layers = 2,
                  .dropout = 0.3,
                  .batch_first = true,
                  .proj_size = 3,
                  .variational_dropout = true},
                 3,
                 2,
                 true},
        LstmCase{"lnlstm_two_layers_bi",
                 {.cell = CellKind::lnlstm,
                  .input_size = 20,
                  .hidden_size = 6,
                  .num_layers = 2,
                  .bidirectional = true},
                 4,
                 2,
                 true},
        LstmCase{"lnlstm_variational",
                 {.cell = CellKind::lnlstm,
                  .input_size = 20,
                  .hidden_size = 5,
                  .num_layers = 2,
                  .dropout = 0.3,
                  .batch_first = true,
                  .variational_dropout = true},
                 3,
                 2,
                 true},
        LstmCase{"proj_two_layers_bi",
                 {.input_size = 3,
                  .hidden_size = 4,
                  .num_layers = 2,
                  .bidirectional = true,
                  .dropout = 0.3,
                  .proj_size = 2},
                 4,
                 2,
                 true},
        LstmCase{"gru_two_layers_bi",
                 {.cell = CellKind::gru,
                  .input_size = 3,
                  .hidden_size = 3,
                  .num_layers = 2,
                  .bidirectional = true},
                 4,
                 2,
                 true},
        LstmCase{"gru_dropout",
                 {.cell = CellKind::gru,
                  .input_size = 20,
                  .hidden_size = 4,
                  .num_layers = 3,
                  .bidirectional = true,
                  .dropout = 0.4,
                  .batch_first = true},
                 3,
                 2,
                 true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(GradCheck, MseLossMasked) {
  auto be = make_reference_backend();
  Rng rng(6);
  HostTensor pred(*be, DType::f64, {6, 3}, random_values(rng, 18)),
      target(*be, DType::f64, {6, 3}, random_values(rng, 18)),
      mask(*be, DType::f64, {6}, {1, 0, 1, 1, 0, 1}),
      grad(*be, DType::f64, {6, 3}, std::vector<double>(18));
  auto objective = [&] { return be->mse_loss(pred.t, target.t, mask.t, grad.t); };
  const double loss = objective();
  const auto d = to_doubles(grad.t);
  EXPECT_LT(check_gradient(pred.t, d, objective), kTolerance);
  // Masked-out rows get no gradient, and the loss is the mean over the selected rows.
  const auto p = to_doubles(pred.t), t = to_doubles(target.t);
  double expect = 0;
  for (int r : {0, 2, 3, 5})
    for (int j = 0; j < 3; ++j)
      expect += (p[r * 3 + j] - t[r * 3 + j]) * (p[r * 3 + j] - t[r * 3 + j]);
  EXPECT_NEAR(loss, expect / 12, 1e-14);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(d[3 + j], 0.0);
}

TEST(GradCheck, CrossEntropyWeightedIgnore) {
  auto be = make_reference_backend();
  Rng rng(7);
  HostTensor logits(*be, DType::f64, {5, 4}, random_values(rng, 20, 3.0)),
      weights(*be, DType::f64, {4}, {0.5, 2.0, 1.0, 1.5}),
      grad(*be, DType::f64, {5, 4}, std::vector<double>(20));
  std::vector<int64_t> targets = {1, 3, -100, 0, 1};
  Tensor tt(targets.data(), DType::i64, {5});
  auto objective = [&] { return be->cross_entropy_loss(logits.t, tt, weights.t, -100, grad.t); };
  objective();
  const auto d = to_doubles(grad.t);
  EXPECT_LT(check_gradient(logits.t, d, objective), kTolerance);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(d[2 * 4 + j], 0.0);  // ignored row
}

TEST(GradCheck, CrossEntropyRejectsBadTarget) {
  auto be = make_reference_backend();
  std::vector<double> logits(8, 0.0), grad(8);
  std::vector<int32_t> targets = {1, 4};
  EXPECT_THROW(be->cross_entropy_loss(Tensor(logits.data(), DType::f64, {2, 4}),
                                      Tensor(targets.data(), DType::i32, {2}), {}, -100,
                                      Tensor(grad.data(), DType::f64, {2, 4})),
               Error);
}

}  // namespace
}  // namespace seqforge::gradcheck_test

namespace seqforge::gradcheck_test {
namespace {

// L = sum(logits * r) of a training pass of a 7-token language model on two rows of five tokens
// (its dropout masks from Rng(17) in every pass), r drawn from `data`: backward fills the
// parameters' gradients, and L is returned as a function of the parameters.
std::function<double()> language_model_gradients(Backend& be, Transformer& model, Rng& data) {
  auto ids = std::make_shared<HostTensor>(be, DType::i64, Shape{2, 5},
                                          std::vector<double>{1, 4, 6, 0, 2, 3, 3, 5, 1, 0});
  const std::vector<double> r = random_values(data, 2 * 5 * 7);
  auto objective = [&be, &model, ids, r] {
    Rng rng(17);
    return dot(model.forward(be, ids->t, true, rng), r);
  };
  objective();
  HostTensor dy(be, DType::f64, {10, 7}, r);
  model.parameters().zero_grad(be);
  model.backward_logits(be, dy.t);
  return objective;
}

// The transformer (causal and bidirectional, with dropout on the embeddings and both residual
// branches, with and without activation checkpointing): every parameter's gradient of
// L = sum(logits * R) against central differences, the dropout masks the same in every pass
// (drawn from the same generator state).
// The small GPT the transformer's finite differences run on.
TransformerOptions small_transformer() {
  return {.vocab_size = 7, .block_size = 6, .n_layer = 2, .n_head = 2, .n_embd = 6, .dropout = 0.2};
}

TEST(GradCheck, Transformer) {
  for (const bool causal : {true, false})
    for (const bool checkpoint : {false, true}) {
      auto be = make_reference_backend();
      TransformerOptions o = small_transformer();
      o.causal = causal;
      o.checkpoint_activations = checkpoint;
      Transformer model(o, DType::f64);
      model.initialize(*be, 3);
      Parameters& p = model.parameters();
      Rng data(9);
      const auto objective = language_model_gradients(*be, model, data);
      for (size_t i = 0; i < p.size(); ++i)
        EXPECT_LE(check_gradient(p.value(i), to_doubles(p.grad(i)), objective, 12), kTolerance)
            << p.values().entries()[i].name << (causal ? " causal" : " bidirectional")
            << (checkpoint ? " recomputed" : "");
      // What checkpointing saved, from the buffers the step kept: with two blocks, the kept
      // activations are one block's set fewer than without.
      const std::string note = model.activation_note();
      if (!checkpoint) {
        EXPECT_EQ(note, "");
        continue;
      }
      double kept = 0, without = 0, set = 0;
      ASSERT_EQ(std::sscanf(note.c_str(),
                            "activation checkpointing: %lf MB of block activations kept for "
                            "backward instead of %lf MB (one block's set of %lf MB",
                            &kept, &without, &set),
                3)
          << note;
      EXPECT_GT(set, 0) << note;
      EXPECT_NEAR(without - kept, set, 1e-9 + 0.01 * set) << note;
    }
}

}  // namespace
}  // namespace seqforge::gradcheck_test

namespace seqforge::gradcheck_test {
namespace {

// Adapters with adapter dropout on a frozen transformer, with and without activation
// checkpointing: every adapter parameter's gradient against central differences (LoRA; DoRA's
// magnitudes, whose gradient does not depend on treating ||V|| as a constant, and through them
// DoRA's dx), and no gradient at all for the base.
TEST(GradCheck, TransformerAdapters) {
  for (const AdapterKind kind : {AdapterKind::lora, AdapterKind::dora})
    for (const bool checkpoint : {false, true}) {
      auto be = make_reference_backend();
      TransformerOptions o{.vocab_size = 7,
                           .block_size = 6,
                           .n_layer = 2,
                           .n_head = 2,
                           .n_embd = 6,
                           .checkpoint_activations = checkpoint};
      o.adapter = {.kind = kind,
                   .rank = 2,
                   .alpha = 3.0,
                   .dropout = 0.25,
                   .targets = {"attn.c_attn", "mlp.c_proj", "attn.c_proj"}};
      Transformer model(o, DType::f64);
      model.initialize(*be, 3);
      Parameters& p = model.parameters();
      Rng data(9);
      for (size_t i = 0; i < p.size(); ++i)  // B away from zero, so that A's gradient is not zero
        if (p.values().entries()[i].name.find("lora_B") != std::string::npos)
          be->copy(p.value(i), HostTensor(*be, DType::f64, p.value(i).shape(),
                                          random_values(data, p.value(i).numel(), 0.5))
                                   .t);
      const auto objective = language_model_gradients(*be, model, data);
      const std::vector<bool> frozen = model.frozen_parameters();
      ASSERT_EQ(frozen.size(), p.size());
      int adapters = 0;
      for (size_t i = 0; i < p.size(); ++i) {
        const std::string& name = p.values().entries()[i].name;
        const bool adapter = name.rfind("base_model.model.", 0) == 0;
        EXPECT_EQ(frozen[i], !adapter) << name;
        const std::vector<double> g = to_doubles(p.grad(i));
        EXPECT_EQ(p.fixed(i), !adapter) << name;
        if (!adapter) {  // the base: no gradient, not even its memory
          EXPECT_TRUE(g.empty()) << name << " has a gradient";
          continue;
        }
        ++adapters;
        if (kind == AdapterKind::dora && name.find("magnitude") == std::string::npos) continue;
        // A smaller step: the attention softmax curves sharply here (1e-5 leaves 1e-8 of
        // truncation error on some elements).
        EXPECT_LE(check_gradient(p.value(i), g, objective, 12, 1e-6), kTolerance) << name;
      }
      EXPECT_EQ(adapters, 2 * 3 * (kind == AdapterKind::dora ? 3 : 2));
    }
}

}  // namespace
}  // namespace seqforge::gradcheck_test

namespace seqforge::gradcheck_test {
namespace {

// The transformer as a sequence classifier (an encoder and a decoder, with dropout and with and
// without activation checkpointing): padded rows of different lengths, segment embeddings and the
// head on the mean over each row's tokens, every parameter's gradient against central
// differences; and the padding's ids and segments change nothing.
TEST(GradCheck, TransformerClassifier) {
  for (const bool causal : {false, true})
    for (const bool checkpoint : {false, true}) {
      auto be = make_reference_backend();
      TransformerOptions o{.vocab_size = 7,
                           .block_size = 6,
                           .n_layer = 2,
                           .n_head = 2,
                           .n_embd = 6,
                           .dropout = 0.2,
                           .causal = causal,
                           .checkpoint_activations = checkpoint};
      o.num_classes = 3;
      o.segments = 2;
      Transformer model(o, DType::f64);
      model.initialize(*be, 3);
      Parameters& p = model.parameters();
      Rng data(9);
      HostTensor ids(*be, DType::i64, {3, 5}, {1, 4, 6, 0, 2, 3, 3, 5, 1, 0, 6, 2, 0, 0, 0});
      HostTensor lengths(*be, DType::i64, {3}, {5, 3, 2});
      HostTensor segments(*be, DType::i64, {3, 5}, {0, 0, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0});
      model.set_token_layout(lengths.t, segments.t);
      const std::vector<double> r = random_values(data, 3 * 3);
      auto objective = [&] {
        Rng rng(17);
        return dot(model.forward(*be, ids.t, true, rng), r);
      };
      const double before = objective();
      HostTensor dy(*be, DType::f64, {3, 3}, r);
      p.zero_grad(*be);
      model.backward_logits(*be, dy.t);
      for (size_t i = 0; i < p.size(); ++i)
        EXPECT_LE(check_gradient(p.value(i), to_doubles(p.grad(i)), objective, 12, 1e-6),
                  kTolerance)
            << p.values().entries()[i].name << (causal ? " causal" : " bidirectional")
            << (checkpoint ? " recomputed" : "");
      // Other ids and segments in the padding: the same logits, to the last bit.
      HostTensor other_ids(*be, DType::i64, {3, 5}, {1, 4, 6, 0, 2, 3, 3, 5, 6, 6, 6, 2, 5, 1, 3});
      HostTensor other_segments(*be, DType::i64, {3, 5},
                                {0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1});
      model.set_token_layout(lengths.t, other_segments.t);
      Rng rng(17);
      EXPECT_EQ(dot(model.forward(*be, other_ids.t, true, rng), r), before);
    }
}

}  // namespace
}  // namespace seqforge::gradcheck_test

namespace seqforge::gradcheck_test {
namespace {

// Adapters on a frozen recurrent layer (LoRA and DoRA, on weight_ih and weight_hh of every layer
// and direction): every adapter and head gradient against central differences, none for the
// base; with B at zero the model gives the base model's outputs exactly.
// A head on the final states (model.output final_states): its input is the top layer's h_n,
// torch.cat([h_n[-2], h_n[-1]], 1), and every gradient flows back through both directions' ends.
TEST(GradCheck, HeadOnFinalStates) {
  for (const CellKind cell : {CellKind::lstm, CellKind::gru})
    for (const bool batch_first : {true, false}) {
      auto be = make_reference_backend();
      ModelOptions o;
      o.rnn = {.cell = cell,
               .input_size = 3,
               .hidden_size = 4,
               .num_layers = 2,
               .bidirectional = true,
               .batch_first = batch_first,
               .proj_size = cell == CellKind::lstm ? 3 : 0};
      o.output_size = 2;
      o.final_states = true;
      SequenceModel model(o, DType::f64);
      model.initialize(*be, 3);
      const int64_t B = 2, T = 5, S = cell == CellKind::lstm ? 3 : 4;
      Rng data(9);
      const Shape x_shape = batch_first ? Shape{B, T, 3} : Shape{T, B, 3};
      HostTensor x(*be, DType::f64, x_shape, random_values(data, x_shape.numel()));
      Rng rng(17);
      const std::vector<double> y = to_doubles(model.forward(*be, x.t, {}, {}, false, rng));
      // The head's input rebuilt from h_n: y = W [h_fwd, h_rev] + b.
      const std::vector<double> h_n = to_doubles(model.recurrent()->h_n());  // (4, B, S)
      Parameters& p = model.parameters();
      std::vector<double> w, bias;
      for (size_t i = 0; i < p.size(); ++i) {
        if (p.values().entries()[i].name == "head.weight") w = to_doubles(p.value(i));
        if (p.values().entries()[i].name == "head.bias") bias = to_doubles(p.value(i));
      }
      ASSERT_EQ(w.size(), size_t(2 * 2 * S));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t k = 0; k < 2; ++k) {
          double want = bias[k];
          for (int64_t d = 0; d < 2; ++d)
            for (int64_t j = 0; j < S; ++j)
              want += w[k * 2 * S + d * S + j] * h_n[((2 + d) * B + b) * S + j];
          EXPECT_NEAR(y[b * 2 + k], want, 1e-12) << cell_type(cell).name << " " << b << k;
        }
      const std::vector<double> r = random_values(data, B * 2);
      auto objective = [&] { return dot(model.forward(*be, x.t, {}, {}, false, rng), r); };
      objective();
      HostTensor dy(*be, DType::f64, {B, 2}, r);
      p.zero_grad(*be);
      const std::vector<double> dx = to_doubles(model.backward(*be, dy.t));
      EXPECT_LE(check_gradient(x.t, dx, objective), kTolerance) << "dx";
      for (size_t i = 0; i < p.size(); ++i)
        EXPECT_LE(check_gradient(p.value(i), to_doubles(p.grad(i)), objective, 30), kTolerance)
            << p.values().entries()[i].name << " " << cell_type(cell).name
            << (batch_first ? " batch_first" : "");
    }
}

TEST(GradCheck, RecurrentAdapters) {
  for (const CellKind cell : {CellKind::lstm, CellKind::gru})
    for (const AdapterKind kind : {AdapterKind::lora, AdapterKind::dora}) {
      auto be = make_reference_backend();
      ModelOptions o;
      o.rnn = {.cell = cell,
               .input_size = 3,
               .hidden_size = 4,
               .num_layers = 2,
               .bidirectional = true,
               .batch_first = true};
      o.output_size = 2;
      const std::string name = cell_type(cell).name;
      o.adapter = {.kind = kind,
                   .rank = 3,
                   .alpha = 2.0,  // s = 2/3, not a float: the f64 path must scale in double
                   .dropout = 0.0,
                   .targets = {name + ".weight_ih", name + ".weight_hh"}};
      SequenceModel model(o, DType::f64);
      model.initialize(*be, 3);
      Parameters& p = model.parameters();
      Rng data(9);
      HostTensor x(*be, DType::f64, {2, 5, 3}, random_values(data, 2 * 5 * 3));
      Rng rng(17);
      // B at zero (and DoRA's m at ||W0||): the base model's outputs.
      ModelOptions plain_options = o;
      plain_options.adapter.kind = AdapterKind::none;
      SequenceModel plain(plain_options, DType::f64);
      plain.initialize(*be, 3);
      const std::vector<double> want = to_doubles(plain.forward(*be, x.t, {}, {}, false, rng));
      const std::vector<double> got = to_doubles(model.forward(*be, x.t, {}, {}, false, rng));
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-14) << i;
      for (size_t i = 0; i < p.size(); ++i)  // B away from zero, so that A's gradient is not 0
        if (p.values().entries()[i].name.find("lora_B") != std::string::npos)
          be->copy(p.value(i), HostTensor(*be, DType::f64, p.value(i).shape(),
                                          random_values(data, p.value(i).numel(), 0.5))
                                   .t);
      const std::vector<double> r = random_values(data, 2 * 2);
      auto objective = [&] { return dot(model.forward(*be, x.t, {}, {}, false, rng), r); };
      objective();
      HostTensor dy(*be, DType::f64, {2, 2}, r);
      p.zero_grad(*be);
      model.backward(*be, dy.t);
      const std::vector<bool> frozen = model.frozen_parameters();
      ASSERT_EQ(frozen.size(), p.size());
      int adapters = 0;
      for (size_t i = 0; i < p.size(); ++i) {
        const std::string& n = p.values().entries()[i].name;
        const bool adapter = n.rfind("base_model.model.", 0) == 0;
        const bool head = n.rfind("head.", 0) == 0;
        EXPECT_EQ(frozen[i], !adapter && !head) << n;
        const std::vector<double> g = to_doubles(p.grad(i));
        EXPECT_EQ(p.fixed(i), frozen[i]) << n;
        if (frozen[i]) {  // the base: no gradient, not even its memory
          EXPECT_TRUE(g.empty()) << n << " has a gradient";
          continue;
        }
        adapters += adapter;
        // DoRA's A and B: PyTorch's below (their gradients hold ||V|| a constant, as PEFT's).
        if (kind == AdapterKind::dora && adapter && n.find("magnitude") == std::string::npos)
          continue;
        EXPECT_LE(check_gradient(p.value(i), g, objective, 30), kTolerance)
            << n << " " << name << (kind == AdapterKind::dora ? " dora" : " lora");
      }
      EXPECT_EQ(adapters, 2 * 2 * 2 * (kind == AdapterKind::dora ? 3 : 2));
      // PyTorch's nn.LSTM / nn.GRU on the adapted weights: the output and every gradient.
      const std::vector<double> y = to_doubles(model.forward(*be, x.t, {}, {}, false, rng));
      std::vector<std::vector<double>> keep;  // host copies the file points into
      std::vector<io::SafetensorsTensor> tensors;
      auto add = [&](const std::string& key, Tensor v) {
        keep.push_back(to_doubles(v));
        tensors.push_back({key, DType::f64, v.shape().to_vector(), keep.back().data()});
      };
      keep.reserve(4 * p.size() + 3);
      for (size_t i = 0; i < p.size(); ++i) {
        add("param." + p.values().entries()[i].name, p.value(i));
        if (!frozen[i]) add("grad." + p.values().entries()[i].name, p.grad(i));
      }
      add("x", x.t);
      add("dy", dy.t);
      keep.push_back(y);
      tensors.push_back({"y", DType::f64, {2, 2}, keep.back().data()});
      const nlohmann::json config = {{"cell", name},
                                     {"input", 3},
                                     {"hidden", 4},
                                     {"layers", 2},
                                     {"bidirectional", true},
                                     {"output", 2},
                                     {"rank", 3},
                                     {"alpha", 2.0},
                                     {"kind", kind == AdapterKind::dora ? "dora" : "lora"}};
      const std::string file = (std::filesystem::temp_directory_path() /
                                ("seqforge_recurrent_adapters_" + name + ".safetensors"))
                                   .string();
      io::write_safetensors(file, tensors, {{"config", config.dump()}});
      const std::string cmd = "/usr/bin/python3 " SEQFORGE_SOURCE_DIR
                              "/tests/python/check_recurrent_adapters.py " +
                              file;
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
}

// Adapter dropout on a recurrent layer drops entries of A (each with probability p, a new mask per
// training pass): in evaluation the model is the undropped one; in training it is exactly the
// undropped model on A M / (1 - p), with that model's gradients, dA masked the same way; LoRA's
// gradients also against central differences of the training pass (its mask replayed).
TEST(GradCheck, RecurrentAdapterDropoutDropsEntriesOfA) {
  constexpr double kP = 0.5;
  for (const AdapterKind kind : {AdapterKind::lora, AdapterKind::dora}) {
    SCOPED_TRACE(kind == AdapterKind::dora ? "dora" : "lora");
    auto be = make_reference_backend();
    ModelOptions o;
    o.rnn = {.cell = CellKind::lstm,
             .input_size = 3,
             .hidden_size = 4,
             .num_layers = 2,
             .bidirectional = true,
             .batch_first = true};
    o.output_size = 2;
    o.adapter = {.kind = kind,
                 .rank = 3,
                 .alpha = 2.0,
                 .dropout = kP,
                 .targets = {"lstm.weight_ih", "lstm.weight_hh"}};
    SequenceModel model(o, DType::f64);
    ModelOptions undropped_options = o;
    undropped_options.adapter.dropout = 0.0;
    SequenceModel undropped(undropped_options, DType::f64);
    model.initialize(*be, 3);
    undropped.initialize(*be, 3);
    Parameters& p = model.parameters();
    Parameters& q = undropped.parameters();
    ASSERT_EQ(p.size(), q.size());
    Rng data(9);
    for (size_t i = 0; i < p.size(); ++i) {  // B away from zero; the same values in both
      if (p.values().entries()[i].name.find("lora_B") != std::string::npos)
        be->copy(p.value(i), HostTensor(*be, DType::f64, p.value(i).shape(),
                                        random_values(data, p.value(i).numel(), 0.5))
                                 .t);
      be->copy(q.value(i), p.value(i));
    }
    HostTensor x(*be, DType::f64, {2, 5, 3}, random_values(data, 2 * 5 * 3));
    const std::vector<double> r = random_values(data, 2 * 2);
    HostTensor dy(*be, DType::f64, {2, 2}, r);
    Rng unused(1);
    const std::vector<double> eval = to_doubles(model.forward(*be, x.t, {}, {}, false, unused));
    const std::vector<double> want = to_doubles(undropped.forward(*be, x.t, {}, {}, false, unused));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(eval[i], want[i]) << i;

    auto training_pass = [&] {  // the same masks every time
      Rng rng(21);
      return model.forward(*be, x.t, {}, {}, true, rng);
    };
    const std::vector<double> y = to_doubles(training_pass());
    p.zero_grad(*be);
    model.backward(*be, dy.t);

    // The mask is where dA is 0; A on the kept entries scaled by 1 / (1 - p) in the undropped
    // model.
    std::vector<std::vector<double>> masks(p.size());
    int64_t dropped = 0, entries = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p.values().entries()[i].name.find("lora_A") == std::string::npos) continue;
      std::vector<double> a = to_doubles(p.value(i));
      for (double g : to_doubles(p.grad(i))) masks[i].push_back(g == 0 ? 0.0 : 1 / (1 - kP));
      for (size_t j = 0; j < a.size(); ++j) a[j] *= masks[i][j];
      dropped += std::count(masks[i].begin(), masks[i].end(), 0.0);
      entries += static_cast<int64_t>(a.size());
      be->copy(q.value(i), HostTensor(*be, DType::f64, q.value(i).shape(), a).t);
    }
    ASSERT_EQ(entries, 2 * 3 * (3 + 4 + 8 + 4));  // (rank, in) of ih and hh, per layer, direction
    EXPECT_GT(dropped, entries / 4);
    EXPECT_LT(dropped, 3 * entries / 4);
    const std::vector<double> same = to_doubles(undropped.forward(*be, x.t, {}, {}, false, unused));
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], same[i], 1e-13) << i;
    EXPECT_NE(y, eval);
    q.zero_grad(*be);
    undropped.backward(*be, dy.t);
    const std::vector<bool> frozen = model.frozen_parameters();
    for (size_t i = 0; i < p.size(); ++i) {
      if (frozen[i]) continue;
      const std::string& n = p.values().entries()[i].name;
      const std::vector<double> g = to_doubles(p.grad(i));
      std::vector<double> g_want = to_doubles(q.grad(i));
      if (!masks[i].empty())
        for (size_t j = 0; j < g_want.size(); ++j) g_want[j] *= masks[i][j];
      ASSERT_EQ(g.size(), g_want.size()) << n;
      for (size_t j = 0; j < g.size(); ++j)
        EXPECT_NEAR(g[j], g_want[j], 1e-12 * std::max(1.0, std::fabs(g_want[j]))) << n << " " << j;
      if (kind == AdapterKind::lora || n.find("magnitude") != std::string::npos) {
        EXPECT_LE(check_gradient(
                      p.value(i), g, [&] { return dot(training_pass(), r); }, 30),
                  kTolerance)
            << n;
      }
    }
  }
}

// nanoGPT's bias=False: no Linear or LayerNorm bias among the parameters, the rest exact.
TEST(GradCheck, TransformerWithoutBiases) {
  auto be = make_reference_backend();
  TransformerOptions o = small_transformer();
  o.bias = false;
  Transformer model(o, DType::f64);
  model.initialize(*be, 4);
  Parameters& p = model.parameters();
  ASSERT_EQ(p.size(), 2u + 2 * 6 + 1)
      << "wte, wpe; per block 2 LayerNorm and 4 Linear weights; ln_f";
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_EQ(p.values().entries()[i].name.find("bias"), std::string::npos)
        << p.values().entries()[i].name;
  Rng data(10);
  const auto objective = language_model_gradients(*be, model, data);
  // A smaller step than the default: unshifted LayerNorms over 6 values curve sharply enough for
  // central differences at 1e-5 to be off by 1e-6 (truncation, not the gradient).
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_LE(check_gradient(p.value(i), to_doubles(p.grad(i)), objective, 12, 3e-6), kTolerance)
        << p.values().entries()[i].name;
}

}  // namespace
}  // namespace seqforge::gradcheck_test
