// Gradient accumulation: a batch run as micro-batches (train.micro_batch_size) takes the whole
// batch's step, for every task and model family.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/file_util.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"

namespace seqforge::micro_batch_test {
namespace {

namespace fs = std::filesystem;

double last_val_loss(const fs::path& run) {
  std::ifstream f(run / "metrics.jsonl");
  double value = NAN;
  for (std::string line; std::getline(f, line);)
    if (const auto j = nlohmann::json::parse(line); j.contains("val_loss")) value = j["val_loss"];
  return value;
}

struct Case {
  std::string name, config;
  std::vector<std::string> overrides;
};

// Batches of 16 as micro-batches of 6 (6, 6 and 4 examples, weighed 6/16, 6/16 and 4/16 of the
// step; mae by the masked steps each holds) reach the whole batches' parameters after 8 steps
// of Adam, within float32 rounding of the sums' order; a run at batch 6 does not (the
// comparison can fail). Adam divides each gradient by its own scale, so a gradient that is the
// small residue of a cancellation moves its parameter by its relative rounding times the
// learning rate: 1e-4 apart at most (1.5e-5 seen where the GEMMs of 16 and 6 rows were raced to
// different libraries), against more than 1e-3 for the other batch size. fp32 GEMMs (precision
// auto may time bf16 faster for one batch size and not another), and no dropout: micro-batches
// draw their own masks.
TEST(MicroBatches, TakeTheWholeBatchStepForEveryTask) {
  const fs::path dir = test::temp_dir("tasks");
  const std::string source = SEQFORGE_SOURCE_DIR;
  const std::string text = (dir / "head.txt").string();
  std::ofstream(text, std::ios::binary)
      << io::read_file(source + "/data/tinyshakespeare.txt").substr(0, 100000);
  const std::string pairs = test::write_text_pairs(dir / "pairs.csv", 400, 7);
  const std::vector<Case> cases = {
      {"forecast",
       "weather_forecast.yaml",
       {"data.path=" + source + "/data/seattle-weather-hourly-normals.csv", "data.lookback=24",
        "model.hidden=24"}},
      {"classify_gru",
       "weather_classify.yaml",
       {"data.path=" + source + "/data/seattle-weather.csv", "model.cell=gru", "model.hidden=24"}},
      {"mae",
       "sp500_pretrain.yaml",
       {"data.path=" + source + "/data/sp500-2000.csv", "model.hidden=16"}},
      {"charlm_gpt",
       "shakespeare_gpt.yaml",
       {"data.path=" + text, "model.embedding=32", "model.layers=2", "model.heads=2",
        "data.seq_len=32"}},
      {"text_pairs",
       "shakespeare_pairs_dora.yaml",
       {"data.path=" + pairs, "data.text_columns=[first, second]",
        "model.init_from=", "adapter.kind=none", "model.embedding=32", "model.layers=2",
        "model.heads=2", "model.block_size=24", "data.seq_len=24"}},
  };
  for (const Case& c : cases) {
    auto run = [&](const std::string& name, const std::vector<std::string>& extra) {
      std::vector<std::string> o = {"train.epochs=1",      "train.max_batches=8",
                                    "train.batch_size=16", "train.warmup_steps=0",
                                    "model.dropout=0",     "train.test_after=false",
                                    "train.precision=fp32"};
      o.insert(o.end(), c.overrides.begin(), c.overrides.end());
      o.insert(o.end(), extra.begin(), extra.end());
      o.push_back("train.run_dir=" + (dir / (c.name + "_" + name)).string());
      std::ostringstream log;
      train(Config::load(source + "/examples/configs/" + c.config, o), log);
      return dir / (c.name + "_" + name);
    };
    const fs::path whole = run("whole", {});
    const fs::path micro = run("micro", {"train.micro_batch_size=6"});
    EXPECT_LT(test::max_checkpoint_difference(whole, micro), 1e-4) << c.name;
    // Validation runs in micro-batches too, and scores the same (mae: the same masked steps).
    EXPECT_NEAR(last_val_loss(micro), last_val_loss(whole), 1e-5 * last_val_loss(whole)) << c.name;
    if (test::sanitized) continue;  // that the comparison can fail is the release build's check
    const fs::path small = run("small", {"train.batch_size=6"});
    EXPECT_GT(test::max_checkpoint_difference(whole, small), 1e-3) << c.name;
  }
}

// train.micro_batch_size auto on a CPU with room: the whole batch, said at start-up and stored as
// 0; `auto` on another integer key, or with a stateful run's streams, is handled by name.
TEST(MicroBatches, AutoTakesTheWholeBatchWhereItFits) {
  const fs::path dir = test::temp_dir("auto");
  const std::string source = SEQFORGE_SOURCE_DIR;
  auto config = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> o = {
        "data.path=" + source + "/data/seattle-weather-hourly-normals.csv",
        "data.lookback=24",
        "model.hidden=24",
        "train.epochs=1",
        "train.max_batches=2",
        "train.batch_size=16",
        "train.run_dir=" + (dir / "run").string()};
    o.insert(o.end(), extra.begin(), extra.end());
    return Config::load(source + "/examples/configs/weather_forecast.yaml", o);
  };
  std::ostringstream log;
  train(config({"train.micro_batch_size=auto"}), log, "", {}, true);
  EXPECT_NE(log.str().find("note: train.micro_batch_size auto: the whole batch of 16 at once ("),
            std::string::npos)
      << log.str();
  EXPECT_EQ(log.str().find("micro-batches: each batch"), std::string::npos) << log.str();
  EXPECT_NE(io::read_file((dir / "run" / "config.resolved.yaml").string())
                .find("  micro_batch_size: 0\n"),
            std::string::npos);
  std::ostringstream stateful;
  train(config({"train.micro_batch_size=auto", "train.stateful=true", "data.split.mode=time"}),
        stateful, "", {}, true);
  EXPECT_NE(stateful.str().find("note: train.micro_batch_size auto: the whole batch "
                                "(train.stateful carries its streams whole)"),
            std::string::npos)
      << stateful.str();
  EXPECT_EQ(test::error_of([&] { config({"train.batch_size=auto"}); }),
            "override 'train.batch_size=auto': train.batch_size: expected an integer, got 'auto'");
}

// Adapters on a frozen LSTM take their gradients through the recurrence's weight gradients:
// those of every micro-batch add up too.
TEST(MicroBatches, AdaptersOnARecurrentLayerAccumulate) {
  const fs::path dir = test::temp_dir("adapters");
  const std::string source = SEQFORGE_SOURCE_DIR;
  const std::vector<std::string> common = {
      "data.path=" + source + "/data/seattle-weather-hourly-normals.csv",
      "data.lookback=24",
      "model.hidden=24",
      "model.dropout=0",
      "train.epochs=1",
      "train.max_batches=8",
      "train.batch_size=16",
      "train.warmup_steps=0",
      "train.test_after=false",
      "train.precision=fp32"};
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    extra.push_back("train.run_dir=" + (dir / name).string());
    std::ostringstream log;
    train(Config::load(source + "/examples/configs/weather_forecast.yaml", extra), log);
    return dir / name;
  };
  const fs::path base = run("base", {});
  for (const char* kind : {"lora", "dora"}) {
    const std::vector<std::string> tune = {"model.init_from=" + base.string(),
                                           std::string("adapter.kind=") + kind, "adapter.rank=2"};
    std::vector<std::string> micro = tune;
    micro.push_back("train.micro_batch_size=5");
    EXPECT_LT(test::max_checkpoint_difference(run(std::string(kind) + "_whole", tune),
                                              run(std::string(kind) + "_micro", micro)),
              1e-5)
        << kind;
  }
}

TEST(MicroBatches, BadSettingsNameTheKey) {
  const fs::path dir = test::temp_dir("bad");
  const std::string source = SEQFORGE_SOURCE_DIR;
  auto error_with = [&](std::vector<std::string> overrides) {
    overrides.push_back("data.path=" + source + "/data/seattle-weather-hourly-normals.csv");
    overrides.push_back("train.run_dir=" + (dir / "run").string());
    return test::error_of([&] {
      std::ostringstream quiet;
      train(Config::load(source + "/examples/configs/weather_forecast.yaml", overrides), quiet);
    });
  };
  EXPECT_NE(error_with({"train.micro_batch_size=-1"}).find("train.micro_batch_size"),
            std::string::npos);
  EXPECT_NE(error_with({"train.micro_batch_size=8", "train.stateful=true", "data.split.mode=time",
                        "model.bidirectional=false"})
                .find("train.micro_batch_size splits a batch's streams"),
            std::string::npos);
}

}  // namespace
}  // namespace seqforge::micro_batch_test
