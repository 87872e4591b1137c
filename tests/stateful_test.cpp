// Stateful training: carried states continue a sequence exactly, streams follow the data, and a
// stateful run interrupted part-way resumes with the metrics of an uninterrupted one.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/interrupt.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/data/loader.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/train/data_options.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"
#include "train/run.hpp"

namespace seqforge::stateful_test {
namespace {

namespace fs = std::filesystem;

// Two half-length passes, the second starting from the first's final states, give the outputs
// and final states of one full-length pass: for every cell (a GRU carries h alone).
TEST(Stateful, TwoHalfStepsCarryTheStatesOfOneFullPass) {
  auto be = make_cpu_backend();
  for (const CellKind cell : {CellKind::lstm, CellKind::gru, CellKind::lnlstm})
    for (const int layers : {1, 3}) {
      ModelOptions o;
      o.rnn = {.cell = cell,
               .input_size = 3,
               .hidden_size = 9,
               .num_layers = layers,
               .batch_first = true};
      const bool cell_state = cell_type(cell).cell_state;
      o.output_size = 2;
      o.per_step = true;
      SequenceModel model(o);
      model.initialize(*be, 5);
      const int64_t B = 4, T = 10, I = 3, H = 9;
      std::vector<float> x(B * T * I);
      Rng rng(3);
      for (float& v : x) v = static_cast<float>(rng.uniform() * 2 - 1);
      std::vector<float> first(B * (T / 2) * I), second(B * (T / 2) * I);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          std::copy_n(x.data() + (b * T + t) * I, I,
                      (t < T / 2 ? first.data() + (b * (T / 2) + t) * I
                                 : second.data() + (b * (T / 2) + t - T / 2) * I));
      Tensor full_y =
          model.forward(*be, Tensor(x.data(), DType::f32, {B, T, I}), {}, {}, false, rng);
      const std::vector<float> y(static_cast<const float*>(full_y.data()),
                                 static_cast<const float*>(full_y.data()) + full_y.numel());
      const std::vector<float> h(
          static_cast<const float*>(model.rnn().h_n().data()),
          static_cast<const float*>(model.rnn().h_n().data()) + layers * B * H);
      model.forward(*be, Tensor(first.data(), DType::f32, {B, T / 2, I}), {}, {}, false, rng);
      std::vector<float> h_mid(
          static_cast<const float*>(model.rnn().h_n().data()),
          static_cast<const float*>(model.rnn().h_n().data()) + layers * B * H);
      std::vector<float> c_mid;
      if (cell_state)
        c_mid.assign(static_cast<const float*>(model.rnn().c_n().data()),
                     static_cast<const float*>(model.rnn().c_n().data()) + layers * B * H);
      Tensor half_y = model.forward(
          *be, Tensor(second.data(), DType::f32, {B, T / 2, I}),
          Tensor(h_mid.data(), DType::f32, {layers, B, H}),
          cell_state ? Tensor(c_mid.data(), DType::f32, {layers, B, H}) : Tensor(), false, rng);
      const auto* yh = static_cast<const float*>(half_y.data());
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = T / 2; t < T; ++t)
          for (int64_t k = 0; k < 2; ++k)
            EXPECT_NEAR(yh[(b * (T / 2) + t - T / 2) * 2 + k], y[(b * T + t) * 2 + k], 1e-5)
                << cell_type(cell).name << " layers " << layers << " row " << b << " step " << t;
      const auto* hn = static_cast<const float*>(model.rnn().h_n().data());
      for (int64_t i = 0; i < layers * B * H; ++i) EXPECT_NEAR(hn[i], h[i], 1e-5) << i;
    }
}

// Two series in one file: every stream walks through consecutive chunks, one lookback apart,
// and starts from zeros exactly where its chunk does not continue the previous one.
TEST(Stateful, StreamsFollowTheDataAndResetAtSeriesBoundaries) {
  const fs::path dir = test::temp_dir("streams");
  {
    std::ofstream f(dir / "two.csv");
    f << "when,cell,v\n";
    for (int cell = 0; cell < 2; ++cell)
      for (int i = 0; i < 100; ++i) {
        char date[40];
        std::snprintf(date, sizeof date, "2020-01-%02dT%02d:00:00", 1 + i / 24, i % 24);
        f << date << ",c" << cell << "," << std::sin(i * 0.2 + cell) << "\n";
      }
  }
  const Config c = Config::parse("data: {path: " + (dir / "two.csv").string() +
                                     ", date_column: when, series_column: cell, features: [v], "
                                     "targets: [v], lookback: 6}\n",
                                 "s.yaml");
  const Dataset d = load_dataset(c);
  const int64_t B = 3, T = 6;
  const StatefulStreams s = stateful_streams(d, B);
  ASSERT_GT(s.batches, 2);
  ASSERT_EQ(s.order.size(), size_t(s.batches * B));
  EXPECT_GE(s.chunks - s.batches * B, 0);
  EXPECT_LT(s.chunks - s.batches * B, B) << "fewer chunks left out than a stream would take";
  for (int64_t k = 0; k < s.batches; ++k)
    for (int64_t i = 0; i < B; ++i) {
      const int64_t at = k * B + i, start = s.order[at];
      const SeriesSpan& series = d.series.series_of(start);
      EXPECT_LE(start + T, series.end) << "a chunk crosses its series";
      if (k == 0) {
        EXPECT_EQ(s.reset[at], 1);
        continue;
      }
      const int64_t prev = s.order[at - B];
      const bool continues = prev + T == start && &d.series.series_of(prev) == &series;
      EXPECT_EQ(s.reset[at], continues ? 0 : 1) << "batch " << k << " row " << i;
    }
  // One stream crosses from the first series into the second: a reset inside the epoch.
  int resets_inside = 0;
  for (size_t at = B; at < s.reset.size(); ++at) resets_inside += s.reset[at];
  EXPECT_GE(resets_inside, 1);
}

// A gap in the dates between two chunks of a stream starts the later one from zeros, as a new
// series does; a gap inside a chunk does not (a window spans it as any window would). Dates and
// numeric times alike.
TEST(Stateful, StreamsResetAtAGapBetweenChunks) {
  const fs::path dir = test::temp_dir("gaps");
  const int64_t T = 6;
  for (const bool numeric : {false, true}) {
    {
      std::ofstream f(dir / "gaps.csv");
      f << "when,v\n";
      for (int i = 0, t = 0; i < 120; ++i, ++t) {
        if (i == 42) t += 5;  // between chunks starting at rows 36 and 42
        if (i == 75) t += 3;  // inside the chunk of rows 72 to 77
        char date[40];
        std::snprintf(date, sizeof date, "2020-01-%02dT%02d:00:00", 1 + t / 24, t % 24);
        f << (numeric ? std::to_string(t) : std::string(date)) << "," << std::sin(i * 0.2) << "\n";
      }
    }
    const Config c = Config::parse("data: {path: " + (dir / "gaps.csv").string() +
                                       ", date_column: when, features: [v], targets: [v], "
                                       "lookback: 6, split: {train: 1, val: 0}}\n",
                                   "g.yaml");
    const Dataset d = load_dataset(c);
    const StatefulStreams s = stateful_streams(d, 1);
    ASSERT_EQ(s.order.size(), size_t(s.batches));
    ASSERT_GT(s.batches, 14);
    for (int64_t k = 0; k < s.batches; ++k) {
      ASSERT_EQ(s.order[size_t(k)], k * T) << "one stream of consecutive chunks";
      EXPECT_EQ(s.reset[size_t(k)], k == 0 || k * T == 42 ? 1 : 0)
          << (numeric ? "numeric times" : "dates") << ", chunk at row " << k * T;
    }
  }
}

// With a learning rate of 0 the model stays as initialised: the logged training loss of a
// stateful epoch is the mean loss of the streams' chunks run with carried states, computed here
// by hand, and not the loss of the same chunks each started from zeros.
// With model.output every_step, every row of a chunk is a target: the loss covers each step.
TEST(Stateful, TheLoggedLossIsThatOfCarriedStates) {
  for (const std::string output : {"last", "every_step"}) {
    const fs::path dir = test::temp_dir("carried_" + output);
    {
      std::ofstream f(dir / "series.csv");
      f << "t,signal\n";
      for (int i = 0; i < 400; ++i)
        f << i << "," << std::sin(i * 0.37) * std::cos(i * 0.011) << "\n";
    }
    const Config c = Config::parse(
        "data: {path: " + (dir / "series.csv").string() +
            ", features: [signal], targets: [signal], lookback: 5}\n"
            "model: {hidden: 10, layers: 2, output: " +
            output +
            "}\noptim: {lr: 0}\n"
            "train: {epochs: 1, batch_size: 4, stateful: true, precision: fp32, run_dir: " +
            (dir / "run").string() + "}\n",
        "s.yaml");
    std::ostringstream log;
    const double logged = train(c, log).last.at("train_loss");

    auto be = make_cpu_backend();
    const Task task = load_task(Config::parse(c.resolved_yaml(), "resolved"));
    const StatefulStreams st = stateful_streams(task, 4);
    SequenceModel model(task.model);
    model.initialize(*be, 0);
    const int64_t B = 4, L = task.model.rnn.num_layers, H = task.model.rnn.hidden_size;
    auto mean_loss = [&](bool carry) {
      std::vector<float> h(L * B * H, 0.0f), cs(L * B * H, 0.0f);
      Rng rng(0);
      double sum = 0, seen = 0;
      Batch b;
      Buffer dout_buf;
      for (int64_t k = 0; k < st.batches; ++k) {
        assemble_batch(*be, task, st.order, size_t(k * B), size_t((k + 1) * B), {}, rng, &b);
        for (int64_t i = 0; i < B; ++i)
          if (!carry || st.reset[k * B + i])
            for (int64_t l = 0; l < L; ++l) {
              std::fill_n(h.begin() + (l * B + i) * H, H, 0.0f);
              std::fill_n(cs.begin() + (l * B + i) * H, H, 0.0f);
            }
        Tensor y = model.forward(*be, b.input, Tensor(h.data(), DType::f32, {L, B, H}),
                                 Tensor(cs.data(), DType::f32, {L, B, H}), true, rng);
        EXPECT_EQ(y.dim(0), output == "last" ? B : B * 5);
        Tensor dout = dout_buf.get(*be, DType::f32, y.shape());
        sum += be->mse_loss(y, b.target, Tensor(), dout) * double(b.size);
        seen += double(b.size);
        std::copy_n(static_cast<const float*>(model.rnn().h_n().data()), h.size(), h.begin());
        std::copy_n(static_cast<const float*>(model.rnn().c_n().data()), cs.size(), cs.begin());
      }
      return sum / seen;
    };
    const double carried = mean_loss(true), fresh = mean_loss(false);
    EXPECT_NEAR(logged, carried, 1e-6 * std::fabs(carried)) << output << log.str();
    EXPECT_GT(std::fabs(carried - fresh), 1e-4 * std::fabs(carried))
        << "carrying the states should change the loss on this series";
  }
}

TEST(Stateful, InterruptedStatefulRunResumesExactly) {
  const fs::path dir = test::temp_dir("resume");
  {
    std::ofstream f(dir / "series.csv");
    f << "t,signal\n";
    for (int i = 0; i < 600; ++i)
      f << i << "," << std::sin(i * 0.3) + 0.1 * std::sin(i * 0.05) << "\n";
  }
  const std::string yaml = "data: {path: " + (dir / "series.csv").string() +
                           ", features: [signal], targets: [signal], lookback: 8}\n"
                           "model: {hidden: 12, layers: 2, dropout: 0.1}\n"
                           "train: {epochs: 3, batch_size: 4, stateful: true}\n";
  std::ostringstream log;
  const TrainSummary whole =
      train(Config::parse(yaml, "s.yaml", {"train.run_dir=" + (dir / "whole").string()}), log);
  EXPECT_NE(log.str().find("stateful: 4 streams of "), std::string::npos) << log.str();
  EXPECT_TRUE(std::isfinite(whole.last.at("val_loss")));
  const fs::path run = dir / "stopped";
  TrainHooks hooks;
  hooks.on_step = [](int64_t epoch, int64_t batch, int64_t) {
    if (epoch == 2 && batch == 3) raise(SIGINT);
  };
  EXPECT_THROW(
      train(Config::parse(yaml, "s.yaml", {"train.run_dir=" + run.string()}), log, "", hooks),
      Interrupted);
  const TrainSummary resumed =
      train(Config::load((run / "config.resolved.yaml").string()), log, run.string());
  EXPECT_EQ(resumed.last, whole.last) << "the carried states were saved and restored";
  EXPECT_EQ(resumed.test, whole.test);
  // Streams that leave a real share of the data out say so.
  std::ostringstream uneven;
  train(Config::parse(yaml, "s.yaml",
                      {"train.batch_size=40", "train.epochs=1",
                       "train.run_dir=" + (dir / "uneven").string()}),
        uneven);
  EXPECT_NE(uneven.str().find("warning: train.stateful: "), std::string::npos) << uneven.str();
  EXPECT_NE(uneven.str().find(" training chunks are left out"), std::string::npos);
  // Bad settings: one line each.
  EXPECT_NE(
      test::error_of([&] {
        train(Config::parse(yaml, "s.yaml",
                            {"model.bidirectional=true", "train.run_dir=" + (dir / "bi").string()}),
              log);
      }).find("train.stateful needs a unidirectional model"),
      std::string::npos);
  EXPECT_NE(
      test::error_of([&] {
        train(Config::parse(yaml, "s.yaml",
                            {"train.batch_size=1000", "train.run_dir=" + (dir / "big").string()}),
              log);
      }).find("too few for 1000 streams"),
      std::string::npos);
  // Windows every 3 rows never start 8 after another: no state could be carried.
  EXPECT_EQ(test::error_of([&] {
              train(Config::parse(yaml, "s.yaml",
                                  {"data.stride=3", "train.run_dir=" + (dir / "s3").string()}),
                    log);
            }),
            "override 'data.stride=3': data.stride 3 does not divide data.lookback 8, so under "
            "train.stateful no "
            "window starts where another ends and no state would be carried: set it to a "
            "divisor of 8 (1 keeps every window)");
  std::ostringstream halves;
  train(
      Config::parse(yaml, "s.yaml",
                    {"data.stride=2", "train.epochs=1", "train.run_dir=" + (dir / "s2").string()}),
      halves);
  EXPECT_NE(halves.str().find("stateful: 4 streams of "), std::string::npos) << halves.str();
}

}  // namespace
}  // namespace seqforge::stateful_test
