// Parameters saved as safetensors under PyTorch names: round trip, bad files, and PyTorch itself
// loading a seqforge checkpoint with load_state_dict(strict=True) and reproducing its output.
#include "seqforge/nn/checkpoint.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "seqforge/backend/backend.hpp"
#include "seqforge/backend/buffer.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/nn/transformer.hpp"
#include "test_util.hpp"
#include "train/checkpoint_writer.hpp"

namespace seqforge::checkpoint_test {
namespace {

namespace fs = std::filesystem;

std::vector<float> floats_of(const io::SafetensorsFile& f, const std::string& name) {
  const io::SafetensorsEntry* e = f.find(name);
  if (!e) return {};
  const std::span<const std::byte> b = f.bytes(*e);
  std::vector<float> out(b.size() / sizeof(float));
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

// A frozen base is handed to the writer as constant: every checkpoint still holds its values, as
// it holds the changing tensors' values at their submit, on a host-addressable backend (read in
// place) and on one the host cannot read (downloaded once).
TEST(CheckpointWriter, ConstantAndChangingTensorsAreWrittenAsSubmitted) {
  const fs::path dir = test::temp_dir("writer");
  for (const char* name : {"cpu", "sealed"}) {
    auto be = make_backend(name);
    Buffer base_buf, adapter_buf;
    const Tensor base = base_buf.get(*be, DType::f32, {2, 3});
    const Tensor adapter = adapter_buf.get(*be, DType::f32, {2});
    const std::vector<float> base_values = {1, 2, 3, 4, 5, 6};
    be->upload(base, base_values.data());
    std::vector<std::string> paths;
    {
      CheckpointWriter writer;
      writer.keep_constant(*be, {base});
      for (int k = 0; k < 3; ++k) {
        const std::vector<float> a = {float(k), float(10 * k)};
        be->upload(adapter, a.data());
        paths.push_back((dir / (std::string(name) + std::to_string(k))).string());
        writer.submit(paths.back(), *be, {{"base", base}, {"adapter", adapter}}, {},
                      {{"k", std::to_string(k)}});
      }
      writer.flush();
    }
    for (int k = 0; k < 3; ++k) {
      const io::SafetensorsFile f = io::SafetensorsFile::read(paths[size_t(k)]);
      EXPECT_EQ(floats_of(f, "base"), base_values) << name << " " << k;
      EXPECT_EQ(floats_of(f, "adapter"), (std::vector<float>{float(k), float(10 * k)}))
          << name << " " << k;
      EXPECT_EQ(f.metadata().at("k"), std::to_string(k));
    }
  }
}

// A failed write is reported, and nothing submitted after it is written: a training state never
// counts an epoch whose model file could not be written.
TEST(CheckpointWriter, NothingAfterAFailedWriteIsWritten) {
  const fs::path dir = test::temp_dir("writer_failed");
  auto be = make_backend("cpu");
  Buffer buf;
  const Tensor t = buf.get(*be, DType::f32, {4});
  const std::vector<float> values = {1, 2, 3, 4};
  be->upload(t, values.data());
  int errors = 0;
  {
    CheckpointWriter writer;
    writer.submit((dir / "no_such_folder" / "model.safetensors").string(), *be, {{"w", t}}, {}, {});
    for (const char* name : {"training_state.safetensors", "later.safetensors"}) try {
        writer.submit((dir / name).string(), *be, {{"w", t}}, {}, {});
      } catch (const std::exception&) {
        ++errors;
      }
    try {
      writer.flush();
    } catch (const std::exception&) {
      ++errors;
    }
  }
  EXPECT_EQ(errors, 1);
  EXPECT_FALSE(fs::exists(dir / "training_state.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "later.safetensors"));
}

ModelOptions small_model() {
  ModelOptions opt;
  opt.rnn = {.input_size = 3,
             .hidden_size = 6,
             .num_layers = 2,
             .bidirectional = true,
             .batch_first = true};
  opt.output_size = 2;
  return opt;
}

std::vector<float> values_of(const Parameters& p) {
  const Tensor flat = p.values().flat();
  return {static_cast<float*>(flat.data()), static_cast<float*>(flat.data()) + flat.numel()};
}

TEST(Checkpoint, RoundTrip) {
  auto be = make_cpu_backend();
  SequenceModel a(small_model()), b(small_model());
  a.initialize(*be, 1);
  b.initialize(*be, 2);
  const std::string path = (test::temp_dir("roundtrip") / "model.safetensors").string();
  save_parameters(path, *be, a.parameters(), {{"note", "x"}});
  EXPECT_NE(values_of(a.parameters()), values_of(b.parameters()));
  load_parameters(path, b.parameters(), *be);
  EXPECT_EQ(values_of(a.parameters()), values_of(b.parameters()));
  EXPECT_EQ(io::SafetensorsFile::read(path).metadata().at("note"), "x");
}

TEST(Checkpoint, NamesTheMissingOrMisshapedTensor) {
  auto be = make_cpu_backend();
  SequenceModel model(small_model());
  model.initialize(*be, 1);
  const fs::path dir = test::temp_dir("errors");
  std::vector<float> w(24 * 3);
  auto expect_error = [&](const std::vector<io::SafetensorsTensor>& tensors, bool allow_extra,
                          const std::string& phrase) {
    const std::string path = (dir / "bad.safetensors").string();
    io::write_safetensors(path, tensors);
    try {
      load_parameters(path, model.parameters(), *be, allow_extra);
      ADD_FAILURE() << "no error for " << phrase;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  };
  expect_error({{"lstm.weight_ih_l0", DType::f32, {24, 3}, w.data()}}, true,
               "missing tensor 'lstm.weight_hh_l0'");
  // Everything present, one tensor with the wrong shape.
  std::vector<io::SafetensorsTensor> all;
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const Tensor v = model.parameters().value(i);
    all.push_back({model.parameters().values().entries()[i].name, DType::f32, v.shape().to_vector(),
                   v.data()});
  }
  auto wrong = all;
  wrong[0].shape = {3, 24};
  expect_error(wrong, false, "'lstm.weight_ih_l0' has shape (3, 24), the model expects (24, 3)");
  auto deep = all;
  deep[0].shape = {1, 1, 1, 24, 3};
  expect_error(deep, false, "'lstm.weight_ih_l0' has 5 dimensions, the model expects (24, 3)");
  auto extra = all;
  extra.push_back({"lstm.weight_ih_l9", DType::f32, {24, 3}, w.data()});
  expect_error(extra, false, "'lstm.weight_ih_l9' is not a parameter");
}

// LSTM, GRU, and LSTM with a projection: nn.LSTM / nn.GRU load the checkpoint strictly, and the
// head reads output[:, -1] or, with final_states, torch.cat([h_n[-2], h_n[-1]], 1).
class PyTorchLoads : public ::testing::TestWithParam<std::pair<CellKind, int64_t>> {};

TEST_P(PyTorchLoads, ItAndReproducesTheOutput) {
  for (const bool final_states : {false, true}) {
    auto be = make_cpu_backend();
    ModelOptions opt = small_model();
    const auto [cell, proj] = GetParam();
    opt.rnn.cell = cell;
    opt.rnn.proj_size = proj;
    opt.final_states = final_states;
    SequenceModel model(opt);
    model.initialize(*be, 3);
    Rng rng(4);
    std::vector<float> x(5 * 7 * 3);
    for (float& v : x) v = static_cast<float>(rng.uniform(-1, 1));
    Tensor y = model.forward(*be, Tensor(x.data(), DType::f32, {5, 7, 3}), {}, {}, false, rng);
    const nlohmann::json config = {{"vocab", 0},          {"embed", 0},
                                   {"input", 3},          {"hidden", 6},
                                   {"layers", 2},         {"bidirectional", true},
                                   {"batch_first", true}, {"output", 2},
                                   {"per_step", false},   {"cell", cell_type(cell).name},
                                   {"proj", proj},        {"final_states", final_states}};
    // A directory per case: ctest runs them in parallel processes.
    const fs::path dir = test::temp_dir("torch_" + std::string(cell_type(cell).name) + "_p" +
                                        std::to_string(proj) + (final_states ? "_final" : ""));
    const std::string ckpt = (dir / "model.safetensors").string(),
                      io = (dir / "io.safetensors").string();
    save_parameters(ckpt, *be, model.parameters(), {{"config", config.dump()}});
    io::write_safetensors(io, {{"x", DType::f32, {5, 7, 3}, x.data()},
                               {"y", DType::f32, y.shape().to_vector(), y.data()}});
    const std::string cmd = "/usr/bin/python3 " SEQFORGE_SOURCE_DIR
                            "/tests/python/check_torch_loads_checkpoint.py " +
                            ckpt + " " + io;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}
// nanoGPT-style modules load a transformer's checkpoint strictly (lm_head.weight included; a
// classifier's segment embeddings and head), and give its outputs.
TEST(TransformerCheckpoint, PyTorchLoadsItAndSeqforgeLoadsItBack) {
  // A GPT, a classifier, and a GPT without biases (nanoGPT's bias=False).
  for (const auto& [classifier, bias] : {std::pair{false, true}, {true, true}, {false, false}}) {
    auto be = make_cpu_backend();
    TransformerOptions o{
        .vocab_size = 11, .block_size = 9, .n_layer = 2, .n_head = 3, .n_embd = 12};
    o.causal = !classifier;
    o.bias = bias;
    o.num_classes = classifier ? 3 : 0;
    o.segments = classifier ? 2 : 0;
    Transformer model(o);
    model.initialize(*be, 3);
    std::vector<int64_t> ids(2 * 7), lengths = {7, 4}, segments(2 * 7, 0);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 5 + 3) % 11);
    for (size_t i : {3, 4, 5, 6, 10}) segments[i] = 1;
    if (classifier)
      model.set_token_layout(Tensor(lengths.data(), DType::i64, {2}),
                             Tensor(segments.data(), DType::i64, {2, 7}));
    Rng rng(4);
    Tensor y = model.forward(*be, Tensor(ids.data(), DType::i64, {2, 7}), false, rng);
    nlohmann::json config = {
        {"family", "transformer"}, {"v", 11},       {"c", 12}, {"l", 2}, {"h", 3}, {"bs", 9},
        {"causal", o.causal},      {"bias", o.bias}};
    if (classifier) config.update({{"k", 3}, {"seg", 2}});
    const fs::path dir = test::temp_dir("torch_transformer");
    const std::string ckpt = (dir / "model.safetensors").string(),
                      io = (dir / "io.safetensors").string();
    save_parameters(ckpt, *be, model.parameters(), {{"config", config.dump()}});
    std::vector<io::SafetensorsTensor> tensors = {
        {"x", DType::i64, {2, 7}, ids.data()}, {"y", DType::f32, y.shape().to_vector(), y.data()}};
    if (classifier) {
      tensors.push_back({"lengths", DType::i64, {2}, lengths.data()});
      tensors.push_back({"segments", DType::i64, {2, 7}, segments.data()});
    }
    io::write_safetensors(io, tensors);
    const std::string cmd = "/usr/bin/python3 " SEQFORGE_SOURCE_DIR
                            "/tests/python/check_torch_loads_checkpoint.py " +
                            ckpt + " " + io;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    // And seqforge loads it back, the alias checked against its parameter.
    Transformer again(o);
    again.initialize(*be, 5);
    EXPECT_EQ(load_parameters(ckpt, again.parameters(), *be).size(), model.parameters().size());
  }
}

INSTANTIATE_TEST_SUITE_P(Cells, PyTorchLoads,
                         ::testing::Values(std::pair{CellKind::lstm, int64_t{0}},
                                           std::pair{CellKind::gru, int64_t{0}},
                                           std::pair{CellKind::lstm, int64_t{4}}),
                         [](const auto& info) {
                           return std::string(cell_type(info.param.first).name) +
                                  (info.param.second ? "_proj" : "");
                         });

}  // namespace
}  // namespace seqforge::checkpoint_test
