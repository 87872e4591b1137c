// Parity with PyTorch: every fixture written by tests/python/make_parity_fixtures.py (PyTorch's
// nn.LSTM or nn.GRU + Linear / Embedding, float64 on float32-representable inputs) is replayed on
// seqforge:
// outputs, final states, loss, every gradient, two AdamW steps and two clipped SGD-momentum steps.
// The CPU backend runs in f32 (max relative error <= 1e-5), the reference backend in f64
// (<= 1e-10), so f32 rounding and semantic errors are told apart. The metric is in test_util.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/optim/optimizer.hpp"
#include "test_util.hpp"

namespace seqforge::parity_test {
namespace {

using test::HostTensor;
using test::max_rel_error;
using test::step_rel_error;
using test::to_doubles;

std::string fixture_dir() {
  const char* env = std::getenv("SEQFORGE_FIXTURE_DIR");
  return env ? env : SEQFORGE_FIXTURE_DIR;
}

struct Fixture {
  io::SafetensorsFile file;
  nlohmann::json config;

  explicit Fixture(const std::string& path)
      : file(io::SafetensorsFile::read(path)),
        config(nlohmann::json::parse(file.metadata().at("config"))) {}
  bool has(const std::string& name) const { return file.find(name) != nullptr; }
  std::vector<double> values(const std::string& name) const {
    const io::SafetensorsEntry* e = file.find(name);
    SF_CHECK(e, file.source(), ": no tensor ", name);
    std::vector<double> out(static_cast<size_t>(Shape(e->shape).numel()));
    convert(file.bytes(*e).data(), e->dtype, out.data(), DType::f64, out.size());
    return out;
  }
  Shape shape(const std::string& name) const { return Shape(file.find(name)->shape); }
  HostTensor tensor(Backend& be, DType dtype, const std::string& name) const {
    return HostTensor(be, dtype, shape(name), values(name));
  }
  HostTensor ids(Backend& be, const std::string& name) const {
    HostTensor h;
    h.t = h.buffer.get(be, DType::i64, shape(name));
    be.upload(h.t, file.bytes(*file.find(name)).data());
    return h;
  }
};

// The largest error per group of checked tensors, and which tensor it was.
struct Checker {
  struct Worst {
    double error = 0;
    std::string tensor;
  };
  struct Tensor {
    std::string group, name;
    std::vector<double> got, want, before;
  };
  std::map<std::string, Worst> groups;  // forward, backward, adamw, sgd
  std::vector<Tensor> tensors;
  // With `before`, the values an optimizer step started from (see step_rel_error).
  void check(const std::string& group, const std::string& name, const std::vector<double>& got,
             const std::vector<double>& want, const std::vector<double>& before = {}) {
    const double e = before.empty() ? max_rel_error(got, want) : step_rel_error(got, want, before);
    Worst& w = groups[group];
    if (w.tensor.empty() || e > w.error) w = {e, name};
    tensors.push_back({group, name, got, want, before});
  }
  // The group's worst error when each value is also judged against `share` of the largest
  // magnitude in its group: a value that is the residue of a cancellation (the gradient of an
  // input seen only through a layer norm of its multiples) has no float32 digits of its own.
  Worst floored(const std::string& group, double share) const {
    double scale = 0;
    for (const Tensor& t : tensors)
      if (t.group == group)
        for (double v : t.want) scale = std::max(scale, std::fabs(v));
    Worst worst;
    for (const Tensor& t : tensors) {
      if (t.group != group) continue;
      double own = 0, e = 0;
      for (double v : t.want) own = std::max(own, std::fabs(v));
      for (size_t i = 0; i < t.want.size(); ++i)
        e = std::max(
            e, std::fabs(t.got[i] - t.want[i]) /
                   std::max({std::fabs(t.want[i]), t.before.empty() ? 0 : std::fabs(t.before[i]),
                             0.1 * own, share * scale, 1e-30}));
      if (std::isnan(e)) e = INFINITY;
      if (worst.tensor.empty() || e > worst.error) worst = {e, t.name};
    }
    return worst;
  }
};

// Replays one fixture. Each AdamW step starts from PyTorch's gradients (the backward pass is
// checked on its own): Adam's update divides by sqrt(v), which turns the last bits of a gradient
// near its epsilon into visible parameter differences, in float64 as in float32, so only the
// update itself is compared.
Checker run_fixture(const Fixture& fx, Backend& be, DType dt) {
  const auto& c = fx.config;
  const bool ce = c["head"] == "ce";
  ModelOptions opt;
  if (ce) {
    opt.vocab_size = c["v"];
    opt.embedding_dim = c["e"];
  } else {
    opt.rnn.input_size = c["i"];
  }
  opt.rnn.cell = cell_kind(c.value("cell", "lstm"));
  opt.rnn.hidden_size = c["h"];
  opt.rnn.proj_size = c.value("p", 0);
  opt.rnn.num_layers = c["l"];
  opt.rnn.bidirectional = c.value("bi", false);
  opt.rnn.batch_first = c.value("bf", false);
  opt.output_size = c["output_size"];
  opt.per_step = c["head"] != "last" && c["head"] != "quantile";
  SequenceModel model(opt, dt);
  model.initialize(be, 0);
  Parameters& params = model.parameters();

  // Same names, shapes and order as PyTorch's state_dict.
  std::vector<std::string> torch_names;
  for (const auto& e : fx.file.entries())
    if (e.name.rfind("param.", 0) == 0) torch_names.push_back(e.name.substr(6));
  SF_CHECK(torch_names.size() == params.size(), "parameter count ", params.size(), " vs PyTorch ",
           torch_names.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& entry = params.values().entries()[i];
    SF_CHECK(entry.name == torch_names[i], "parameter ", i, ": ", entry.name, " vs PyTorch ",
             torch_names[i]);
    SF_CHECK(entry.shape == fx.shape("param." + entry.name), entry.name, " shape ",
             entry.shape.str());
  }
  // Sets the parameters to the fixture's `<prefix>.<name>` tensors.
  auto load_fixture_params = [&](const std::string& prefix) {
    for (size_t i = 0; i < params.size(); ++i) {
      HostTensor h = fx.tensor(be, dt, prefix + "." + params.values().entries()[i].name);
      be.copy(params.value(i), h.t);
    }
  };
  load_fixture_params("param");

  HostTensor x = ce ? fx.ids(be, "input.ids") : fx.tensor(be, dt, "input.x");
  const bool states = c.value("st", false);
  HostTensor h0, c0, rh, rc;
  const bool cell_state = cell_type(opt.rnn.cell).cell_state;
  if (states) {
    h0 = fx.tensor(be, dt, "input.h0");
    rh = fx.tensor(be, dt, "input.rh");
    if (cell_state) {
      c0 = fx.tensor(be, dt, "input.c0");
      rc = fx.tensor(be, dt, "input.rc");
    }
  }
  HostTensor target, mask, target_ids, weights;
  if (ce) {
    target_ids = fx.ids(be, "input.target_ids");
    if (fx.has("input.class_weights")) weights = fx.tensor(be, dt, "input.class_weights");
  } else {
    target = fx.tensor(be, dt, "input.target");
    if (fx.has("input.mask")) mask = fx.tensor(be, dt, "input.mask");
  }
  Rng rng(1);
  Buffer dy_buf;

  // Forward, loss and backward on the current parameters; returns the loss, the sum of its terms'
  // magnitudes (the data loss and each state term, which may cancel to near zero) and the output.
  auto step = [&] {
    params.zero_grad(be);
    Tensor y = model.forward(be, x.t, h0.t, c0.t, true, rng);
    Tensor dy = dy_buf.get(be, dt, y.shape());
    double loss = 0;
    if (ce) {
      loss = be.cross_entropy_loss(y, target_ids.t.reshape({target_ids.t.numel()}), weights.t,
                                   c["ignore_index"], dy);
    } else if (c["head"] == "quantile") {  // the pinball loss of each output's quantile
      RegressionLoss pinball{LossKind::quantile};
      const std::vector<double> levels = c["q"];
      pinball.num_quantiles = static_cast<int>(levels.size());
      std::copy(levels.begin(), levels.end(), pinball.quantiles);
      loss = be.regression_loss(pinball, y, target.t, Tensor(), dy);
    } else {
      loss = be.mse_loss(y, target.t, mask.t, dy);
    }
    double terms = std::fabs(loss);
    if (states) {
      const auto hn = to_doubles(be, model.rnn().h_n()), a = to_doubles(be, rh.t);
      for (size_t i = 0; i < hn.size(); ++i) loss += hn[i] * a[i], terms += std::fabs(hn[i] * a[i]);
      if (cell_state) {
        const auto cn = to_doubles(be, model.rnn().c_n()), b = to_doubles(be, rc.t);
        for (size_t i = 0; i < cn.size(); ++i)
          loss += cn[i] * b[i], terms += std::fabs(cn[i] * b[i]);
      }
    }
    return std::tuple{loss, terms, y};
  };

  Checker ck;
  auto [loss, terms, y] = step();
  ck.check("forward", "out.y", to_doubles(be, y), fx.values("out.y"));
  ck.check("forward", "out.h_n", to_doubles(be, model.rnn().h_n()), fx.values("out.h_n"));
  if (cell_state) {
    ck.check("forward", "out.c_n", to_doubles(be, model.rnn().c_n()), fx.values("out.c_n"));
  } else {
    EXPECT_TRUE(model.rnn().c_n().empty());
    EXPECT_FALSE(fx.has("out.c_n"));
  }
  // Checked beside its terms' magnitude, so that a loss whose terms cancel to near zero is judged
  // against them (the metric's floor is a tenth of a tensor's largest value).
  ck.check("forward", "out.loss", {loss, terms}, {fx.values("out.loss")[0], terms});
  Tensor dx = model.backward(be, dy_buf.tensor(), rh.t, rc.t);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& name = params.values().entries()[i].name;
    ck.check("backward", "grad." + name, to_doubles(be, params.grad(i)), fx.values("grad." + name));
  }
  if (!ce) ck.check("backward", "grad.x", to_doubles(be, dx), fx.values("grad.x"));
  if (states) {
    ck.check("backward", "grad.h0", to_doubles(be, model.rnn().dh0()), fx.values("grad.h0"));
    if (cell_state)
      ck.check("backward", "grad.c0", to_doubles(be, model.rnn().dc0()), fx.values("grad.c0"));
  }

  {  // Two AdamW steps on the same batch (the first reuses the gradients above).
    Optimizer adamw(be, params,
                    {.kind = "adamw", .lr = c["lr_adamw"], .weight_decay = c["wd_adamw"]});
    for (int s = 1; s <= 2; ++s) {
      const std::string prefix = "adamw" + std::to_string(s);
      for (size_t i = 0; i < params.size(); ++i) {
        HostTensor g = fx.tensor(be, dt, prefix + "_grad." + params.values().entries()[i].name);
        be.copy(params.grad(i), g.t);
      }
      adamw.step();
      const std::string start = s == 1 ? "param." : "adamw1.";
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& param = params.values().entries()[i].name;
        ck.check("adamw", prefix + "." + param, to_doubles(be, params.value(i)),
                 fx.values(prefix + "." + param), fx.values(start + param));
      }
      load_fixture_params(prefix);
    }
  }
  {  // Two clipped SGD steps with momentum (Nesterov on bidirectional fixtures).
    load_fixture_params("param");
    Optimizer sgd(be, params,
                  {.kind = "sgd",
                   .lr = c["lr_sgd"],
                   .weight_decay = 0.0,
                   .momentum = c["momentum"],
                   .nesterov = c["nesterov"]});
    for (int s = 1; s <= 2; ++s) {
      step();
      model.backward(be, dy_buf.tensor(), rh.t, rc.t);
      const std::string prefix = "sgd" + std::to_string(s) + ".";
      const double total = clip_grad_norm(be, params, c["max_norm" + std::to_string(s)]);
      ck.check("sgd", prefix + "total_norm", {total}, fx.values(prefix + "total_norm"));
      sgd.step();
      const std::string start = s == 1 ? "param." : "sgd1.";
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& param = params.values().entries()[i].name;
        ck.check("sgd", prefix + param, to_doubles(be, params.value(i)), fx.values(prefix + param),
                 fx.values(start + param));
      }
    }
  }
  return ck;
}

std::vector<std::string> fixture_names() {
  std::ifstream index(fixture_dir() + "/index.txt");
  std::vector<std::string> names;
  for (std::string line; std::getline(index, line);)
    if (!line.empty()) names.push_back(line);
  return names;
}

void run_all(const char* backend_name, DType dt, double tolerance) {
  const auto names = fixture_names();
  ASSERT_GE(names.size(), 24u) << "no PyTorch fixtures in " << fixture_dir()
                               << " (run tests/python/make_parity_fixtures.py)";
  auto be = make_backend(backend_name);
  std::printf("PyTorch parity, %s backend, %s: max relative error per group\n", backend_name,
              std::string(dtype_name(dt)).c_str());
  int ill_conditioned = 0;
  std::printf("  %-52s %-9s %-9s %-9s %-9s %-12s %s\n", "configuration", "forward", "backward",
              "adamw*", "sgd", "torch-f32", "worst tensor");
  for (const auto& name : names) {
    Fixture fx(fixture_dir() + "/" + name + ".safetensors");
    const Checker ck = run_fixture(fx, *be, dt);
    Checker::Worst worst;
    for (const auto& [group, w] : ck.groups)
      if (worst.tensor.empty() || w.error > worst.error) worst = w;
    const double torch_f32 = std::max(fx.config["torch_f32_forward_error"].get<double>(),
                                      fx.config["torch_f32_backward_error"].get<double>());
    std::printf("  %-52s %-9.2e %-9.2e %-9.2e %-9.2e %-12.2e %s\n", name.c_str(),
                ck.groups.at("forward").error, ck.groups.at("backward").error,
                ck.groups.at("adamw").error, ck.groups.at("sgd").error, torch_f32,
                worst.tensor.c_str());
    if (dt != DType::f32) {
      // A layer norm over a few nearly equal features is ill-conditioned: PyTorch's own float32
      // error measures how much (up to 1e-1 seen), and float64 lands up to 30 times that error
      // scaled to its rounding (2^-53 against 2^-24). Two SGD steps compound it: there float64
      // itself spreads (the same steps with the norms written out), and another order of
      // operations lands up to 10 times that spread (5.4 seen).
      const double sgd_spread = fx.config.value("torch_f64_sgd_spread", 0.0);
      auto f32_error = [&](const std::string& group) {
        const char* key = group == "forward"    ? "torch_f32_forward_error"
                          : group == "backward" ? "torch_f32_backward_error"
                          : group == "sgd"      ? "torch_f32_sgd_error"
                                                : nullptr;
        return key ? fx.config.value(key, 0.0) : 0.0;
      };
      for (const auto& [group, w] : ck.groups) {
        double limit = std::max(tolerance, 30 * std::ldexp(f32_error(group), -29));
        if (group == "sgd") limit = std::max(limit, 10 * sgd_spread);
        EXPECT_LE(w.error, limit) << name << ": " << group << ", worst " << w.tensor;
      }
      continue;
    }
    // A cell norm over two or three values is degenerate (over two, its outputs are +-1): float32's
    // error of its backward ranges over an order of magnitude from one row to the next (7e-5 for
    // PyTorch's own kernel on random rows of two, seqforge's 6e-5), so one fixture's PyTorch error
    // is no yardstick (seed 721's lnlstm_i3_h2: 2e-6 in all six of PyTorch's forms, seqforge's
    // 3.3e-5, and its float64 within 3.2e-14). These are judged as ill-conditioned below.
    const bool tiny_norm =
        fx.config.value("cell", std::string()) == "lnlstm" && fx.config.value("h", 0) < 4;
    if (torch_f32 <= tolerance && !tiny_norm) {
      // Where PyTorch's own float32 error comes near the tolerance (a layer norm over a few
      // features), another float32 order of operations lands a few times its error; the SGD
      // steps, a few times PyTorch's own float32 error of them where that is larger (seed 561:
      // 4.7e-5 where PyTorch's is 4.6e-5).
      const double sgd_f32 = std::max(torch_f32, fx.config.value("torch_f32_sgd_error", 0.0));
      for (const auto& [group, w] : ck.groups)
        EXPECT_LE(w.error, std::max(tolerance, 4 * (group == "sgd" ? sgd_f32 : torch_f32)))
            << name << ": " << group << ", worst " << w.tensor;
      continue;
    }
    // Where float32 itself cannot hold the tolerance (layer norms of nearly constant rows:
    // PyTorch's own float32 forward and backward are off by more), seqforge's may be off by a few
    // times as much, each value judged against at least a thousandth of its group's largest;
    // the SGD steps, which compound two steps of its own gradients, are only printed. The
    // float64 run checks these fixtures at the full tolerance (the SGD steps within a few times
    // float64's own spread). A degenerate norm's yardstick is at least the tolerance.
    ++ill_conditioned;
    const double yardstick = tiny_norm ? std::max(torch_f32, tolerance) : torch_f32;
    for (const char* group : {"forward", "backward", "adamw"}) {
      const Checker::Worst w = ck.floored(group, 1e-3);
      EXPECT_LE(w.error, 10 * yardstick) << name << ": " << group << ", worst " << w.tensor;
    }
  }
  if (ill_conditioned)
    std::printf(
        "  %d fixtures where PyTorch's float32 misses the tolerance or a cell norm holds under "
        "four values: forward, backward and adamw* within 10x its error (at least the "
        "tolerance), sgd not checked\n",
        ill_conditioned);
  std::printf(
      "  error: max |got - want| / max(|want|, 0.1 max|want|) against PyTorch float64;\n"
      "  torch-f32: PyTorch's own float32 forward/backward under the same metric, the worst over "
      "the first layer's input features in five orders\n");
  std::printf(
      "  adamw*: each step from PyTorch's gradients; adamw and sgd: each value also against the "
      "one its step started from\n");
}

TEST(PyTorchParity, CpuF32) { run_all("cpu", DType::f32, 1e-5); }
TEST(PyTorchParity, CudaF32) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  // A GPU's float32 rounds otherwise than the CPU's (products fused into FMAs, its own tanh and
  // exp): the layer-normalised fixtures near PyTorch's own float32 error may land within twice
  // the CPU's tolerance.
  run_all("cuda", DType::f32, 2e-5);
}
TEST(PyTorchParity, CudaF64) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  run_all("cuda", DType::f64, 1e-10);
}
TEST(PyTorchParity, ReferenceF64) { run_all("reference", DType::f64, 1e-10); }

}  // namespace
}  // namespace seqforge::parity_test
