// The library used out of order or on empty input: each a clear error, never a crash or a step
// that changes the model on no data.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "seqforge/seqforge.hpp"

namespace seqforge::library_misuse_test {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

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
  EXPECT_NE(e.find("not allocated: initialize the model"), std::string::npos) << e;
}

TEST(LibraryMisuse, AnEmptyBatchIsRefused) {
  for (const bool per_step : {false, true}) {
    auto be = make_cpu_backend();
    SequenceModel model(small_lstm(1, per_step));
    model.initialize(*be, 1);
    Rng rng(1);
    std::vector<float> x(100, 0.5f);
    for (const Shape& shape : {Shape{0, 5, 4}, Shape{3, 0, 4}}) {
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
  for (const Shape& shape : {Shape{0, 4}, Shape{2, 0}}) {
    const std::string e = error_of(
        [&] { model->forward(*be, Tensor(ids.data(), DType::i32, shape), {}, {}, true, rng); });
    EXPECT_NE(e.find("no tokens to predict from"), std::string::npos) << e;
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
