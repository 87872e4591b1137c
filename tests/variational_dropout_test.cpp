// Variational (locked) dropout against a reference written in PyTorch
// (tests/python/check_variational_dropout.py: an explicit loop over time, with seqforge's masks),
// and the masks' own contract: one mask per sequence, shared by every step, of the given rate.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/recurrent.hpp"
#include "test_util.hpp"

namespace seqforge::variational_dropout_test {
namespace {

namespace fs = std::filesystem;
using test::HostTensor;
using test::to_doubles;

struct Case {
  const char* name;
  RecurrentOptions opt;
  int64_t T, B;
  const char* backend;
  DType dtype;
  double tolerance;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class VariationalDropout : public ::testing::TestWithParam<Case> {};

TEST_P(VariationalDropout, MatchesThePyTorchLoop) {
  const Case& c = GetParam();
  auto be = make_backend(c.backend);
  Rng rng(17);
  Parameters params(c.dtype);
  Recurrent rnn(params, "rnn", c.opt);
  params.allocate(*be, rng);
  const bool lstm = rnn.cell().cell_state;
  const int64_t D = rnn.directions(), L = c.opt.num_layers, H = c.opt.hidden_size;
  const int64_t P = c.opt.state_size();
  auto values = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = static_cast<float>(rng.uniform(-1, 1));
    return v;
  };
  const Shape x_shape{c.T, c.B, c.opt.input_size}, h_shape{D * L, c.B, P}, c_shape{D * L, c.B, H};
  HostTensor x(*be, c.dtype, x_shape, values(x_shape.numel()));
  HostTensor h0(*be, c.dtype, h_shape, values(h_shape.numel()));
  HostTensor c0 = lstm ? HostTensor(*be, c.dtype, c_shape, values(c_shape.numel())) : HostTensor();
  Rng dropout_rng(3);
  Tensor y = rnn.forward(*be, x.t, h0.t, c0.t, true, dropout_rng);
  HostTensor dy(*be, c.dtype, y.shape(), values(y.numel()));
  HostTensor dhn(*be, c.dtype, h_shape, values(h_shape.numel()));
  HostTensor dcn = lstm ? HostTensor(*be, c.dtype, c_shape, values(c_shape.numel())) : HostTensor();
  params.zero_grad(*be);
  Tensor dx = rnn.backward(*be, dy.t, dhn.t, dcn.t);

  std::vector<io::SafetensorsTensor> out;
  auto add = [&](const std::string& name, Tensor t) {
    ASSERT_FALSE(t.empty()) << name;
    out.push_back({name, t.dtype(), t.shape().to_vector(), t.data()});
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string name = params.values().entries()[i].name.substr(4);  // without "rnn."
    add("param." + name, params.value(i));
    add("grad." + name, params.grad(i));
  }
  add("x", x.t);
  add("h0", h0.t);
  add("y", y);
  add("h_n", rnn.h_n());
  add("dy", dy.t);
  add("dh_n", dhn.t);
  add("grad.x", dx);
  add("grad.h0", rnn.dh0());
  if (lstm) {
    add("c0", c0.t);
    add("c_n", rnn.c_n());
    add("dc_n", dcn.t);
    add("grad.c0", rnn.dc0());
  }
  for (int64_t l = 0; l < L; ++l) {
    const Tensor mask = rnn.input_dropout_mask(l);
    add("mask.input.l" + std::to_string(l), mask);
    // One mask per sequence: every step's equals the first's, and about the rate is dropped.
    const auto m = to_doubles(mask);
    const size_t step = m.size() / static_cast<size_t>(c.T);
    int64_t dropped = 0;
    for (size_t i = 0; i < m.size(); ++i) {
      ASSERT_EQ(m[i], m[i % step]) << "layer " << l << " element " << i;
      dropped += m[i] == 0.0;
      if (m[i] != 0.0) {
        ASSERT_NEAR(m[i], 1.0 / (1.0 - c.opt.dropout), 1e-6);
      }
    }
    const double share = static_cast<double>(dropped) / static_cast<double>(m.size());
    EXPECT_NEAR(share, c.opt.dropout, 0.2) << "layer " << l;
  }
  for (int64_t s = 0; s < D * L; ++s)
    add("mask.state.s" + std::to_string(s), rnn.state_dropout_mask(s));

  const nlohmann::json config = {{"cell", rnn.cell().name},
                                 {"layers", L},
                                 {"bidirectional", c.opt.bidirectional},
                                 {"proj", c.opt.proj_size}};
  const fs::path dir = fs::temp_directory_path() / ("seqforge_variational_" + std::string(c.name));
  fs::create_directories(dir);
  const std::string file = (dir / "run.safetensors").string();
  io::write_safetensors(
      file, out, {{"config", config.dump()}, {"tolerance", nlohmann::json(c.tolerance).dump()}});
  const std::string cmd =
      "/usr/bin/python3 " SEQFORGE_SOURCE_DIR "/tests/python/check_variational_dropout.py " + file;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove_all(dir);
}

// Inference draws no masks, and standard dropout keeps its per-step masks.
TEST(VariationalDropoutMasks, OnlyInTraining) {
  auto be = make_reference_backend();
  Rng rng(1);
  Parameters params(DType::f64);
  Recurrent rnn(params, "rnn",
                {.input_size = 3,
                 .hidden_size = 4,
                 .num_layers = 2,
                 .dropout = 0.5,
                 .variational_dropout = true});
  params.allocate(*be, rng);
  HostTensor x(*be, DType::f64, {5, 2, 3}, std::vector<double>(30, 0.5));
  rnn.forward(*be, x.t, {}, {}, false, rng);
  EXPECT_TRUE(rnn.input_dropout_mask(0).empty());
  EXPECT_TRUE(rnn.state_dropout_mask(0).empty());
  rnn.forward(*be, x.t, {}, {}, true, rng);
  EXPECT_FALSE(rnn.input_dropout_mask(0).empty());
  EXPECT_FALSE(rnn.state_dropout_mask(1).empty());
}

INSTANTIATE_TEST_SUITE_P(Cells, VariationalDropout,
                         ::testing::Values(Case{"lstm_2_layers_f64",
                                                {.input_size = 4,
                                                 .hidden_size = 6,
                                                 .num_layers = 2,
                                                 .dropout = 0.4,
                                                 .variational_dropout = true},
                                                7,
                                                5,
                                                "reference",
                                                DType::f64,
                                                1e-10},
                                           Case{"gru_bi_2_layers_f64",
                                                {.cell = CellKind::gru,
                                                 .input_size = 3,
                                                 .hidden_size = 5,
                                                 .num_layers = 2,
                                                 .bidirectional = true,
                                                 .dropout = 0.3,
                                                 .variational_dropout = true},
                                                6,
                                                4,
                                                "reference",
                                                DType::f64,
                                                1e-10},
                                           Case{"lstm_proj_bi_f64",
                                                {.input_size = 20,
                                                 .hidden_size = 8,
                                                 .num_layers = 2,
                                                 .bidirectional = true,
                                                 .dropout = 0.25,
                                                 .proj_size = 3,
                                                 .variational_dropout = true},
                                                5,
                                                3,
                                                "reference",
                                                DType::f64,
                                                1e-10},
                                           Case{"lstm_3_layers_cpu_f32",
                                                {.input_size = 24,
                                                 .hidden_size = 16,
                                                 .num_layers = 3,
                                                 .dropout = 0.3,
                                                 .variational_dropout = true},
                                                9,
                                                6,
                                                "cpu",
                                                DType::f32,
                                                1e-5},
                                           Case{"gru_bi_cpu_f32",
                                                {.cell = CellKind::gru,
                                                 .input_size = 5,
                                                 .hidden_size = 12,
                                                 .num_layers = 2,
                                                 .bidirectional = true,
                                                 .dropout = 0.5,
                                                 .variational_dropout = true},
                                                8,
                                                7,
                                                "cpu",
                                                DType::f32,
                                                1e-5}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace seqforge::variational_dropout_test
