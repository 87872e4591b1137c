// The library used out of order or on empty input: each a clear error, never a crash or a step
// that changes the model on no data.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "seqforge/nn/decoder.hpp"
#include "seqforge/seqforge.hpp"
#include "test_util.hpp"

namespace seqforge::library_misuse_test {
namespace {

using test::error_of;

ModelOptions small_lstm(int64_t outputs = 1, bool per_step = false) {
  ModelOptions o;
  o.rnn = {.input_size = 4, .hidden_size = 8, .num_layers = 1, .batch_first = true};
  o.output_size = outputs;
  o.per_step = per_step;
  return o;
}

TEST(LibraryMisuse, AnOptimizerBeforeTheModelIsInitializedIsAnError) {
  auto be = make_cpu_backend();
  SequenceModel model(small_lstm());
  const std::string e =
      error_of([&] { Optimizer opt(*be, model.parameters(), {.kind = "adamw", .lr = 1e-3}); });
  EXPECT_NE(e.find("not allocated: initialize the model first"), std::string::npos) << e;
  // Nor can a checkpoint be loaded into it.
  SequenceModel trained(small_lstm());
  trained.initialize(*be, 1);
  const std::string path = (test::temp_dir("uninitialized") / "m.safetensors").string();
  save_parameters(path, *be, trained.parameters());
  const std::string load = error_of([&] { load_parameters(path, model.parameters(), *be); });
  EXPECT_NE(load.find("the model to load it into is not initialized"), std::string::npos) << load;
}

TEST(LibraryMisuse, AnEmptyBatchIsRefused) {
  for (const bool per_step : {false, true}) {
    auto be = make_cpu_backend();
    SequenceModel model(small_lstm(1, per_step));
    model.initialize(*be, 1);
    Rng rng(1);
    std::vector<float> x(100, 0.5f);
    for (const Shape& shape : {Shape{0, 5, 4}, Shape{3, 0, 4}}) {
      // Time-major too: (T, B, F).
      ModelOptions time_major = small_lstm(1, per_step);
      time_major.rnn.batch_first = false;
      SequenceModel by_time(time_major);
      by_time.initialize(*be, 1);
      const Shape swapped = {shape[1], shape[0], shape[2]};
      const std::string t = error_of(
          [&] { by_time.forward(*be, Tensor(x.data(), DType::f32, swapped), {}, {}, true, rng); });
      EXPECT_NE(t.find(shape[0] == 0 ? "a batch of 0 sequences" : "sequence length is 0"),
                std::string::npos)
          << t;
      const std::string e = error_of(
          [&] { model.forward(*be, Tensor(x.data(), DType::f32, shape), {}, {}, true, rng); });
      EXPECT_NE(e.find(shape[0] == 0 ? "a batch of 0 sequences" : "sequence length is 0"),
                std::string::npos)
          << e;
      EXPECT_NE(e.find(shape.str()), std::string::npos) << e;
    }
  }
  ModelOptions gpt;
  gpt.family = ModelFamily::transformer;
  gpt.vocab_size = 11;
  gpt.output_size = 11;
  gpt.per_step = true;
  gpt.transformer = {.vocab_size = 11, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8};
  auto be = make_cpu_backend();
  auto model = make_model(gpt);
  model->initialize(*be, 1);
  Rng rng(1);
  std::vector<int32_t> ids(16, 3);
  DecoderOptions llama;
  llama.vocab_size = 11, llama.hidden_size = 8, llama.intermediate_size = 8, llama.num_layers = 1;
  llama.num_heads = 2, llama.num_kv_heads = 1, llama.head_dim = 4;
  Decoder decoder(llama);
  decoder.initialize(*be, 1);
  for (const Shape& shape : {Shape{0, 4}, Shape{2, 0}}) {
    std::string e = error_of(
        [&] { model->forward(*be, Tensor(ids.data(), DType::i32, shape), {}, {}, true, rng); });
    EXPECT_NE(e.find("transformer input " + shape.str() + ": no tokens to predict from"),
              std::string::npos)
        << e;
    e = error_of([&] { decoder.forward(*be, Tensor(ids.data(), DType::i32, shape), true, rng); });
    EXPECT_NE(e.find("decoder input " + shape.str() + ": no tokens to predict from"),
              std::string::npos)
        << e;
  }
}

TEST(LibraryMisuse, BackwardNamesTheForwardItNeeds) {
  auto be = make_cpu_backend();
  SequenceModel model(small_lstm(2));
  model.initialize(*be, 1);
  Rng rng(1);
  std::vector<float> x(100, 0.5f), dy(100, 0.01f);
  std::string e = error_of([&] { model.backward(*be, Tensor(dy.data(), DType::f32, {3, 2})); });
  EXPECT_NE(e.find("backward before any forward"), std::string::npos) << e;
  model.forward(*be, Tensor(x.data(), DType::f32, {3, 5, 4}), {}, {}, true, rng);
  model.forward(*be, Tensor(x.data(), DType::f32, {2, 5, 4}), {}, {}, true, rng);
  e = error_of([&] { model.backward(*be, Tensor(dy.data(), DType::f32, {3, 2})); });
  EXPECT_NE(e.find("dy is (3, 2) but the last forward's output is (2, 2)"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { model.backward(*be, Tensor(dy.data(), DType::f32, {2, 2})); }), "");
}

}  // namespace
}  // namespace seqforge::library_misuse_test
