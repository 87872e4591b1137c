// The trainer end to end on small synthetic data, and its bad-input errors.
#include "seqforge/train/trainer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "seqforge/core/error.hpp"
#include "seqforge/io/safetensors.hpp"

namespace seqforge {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("seqforge_trainer_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A sine wave with a second, noisy column; rows out of date order on purpose.
std::string write_series(const fs::path& dir, int rows) {
  const fs::path path = dir / "series.csv";
  std::ofstream f(path);
  f << "when,signal,other,label\n";
  for (int i = rows - 1; i >= 0; --i) {
    char date[32];
    std::snprintf(date, sizeof date, "2020-01-%02dT%02d:00:00", 1 + i / 24, i % 24);
    f << date << "," << std::sin(i * 0.3) << "," << std::cos(i * 0.05) << ","
      << (std::sin(i * 0.3) > 0 ? "up" : "down") << "\n";
  }
  return path.string();
}

std::string forecast_yaml(const std::string& data, const fs::path& run) {
  return "data:\n  path: " + data +
         "\n  date_column: when\n  features: [signal, other]\n  targets: [signal]\n"
         "  lookback: 12\nmodel: {hidden: 16}\noptim: {lr: 0.01}\n"
         "train: {epochs: 6, batch_size: 16, run_dir: " +
         run.string() + "}\n";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Trainer, ForecastLearnsAndWritesTheRun) {
  const fs::path dir = temp_dir("forecast");
  const std::string data = write_series(dir, 400);
  std::ostringstream log;
  const TrainSummary s = train(Config::parse(forecast_yaml(data, dir / "run"), "f.yaml"), log);
  EXPECT_EQ(s.epochs, 6);
  EXPECT_TRUE(fs::exists(dir / "run" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "run" / "config.resolved.yaml"));
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  EXPECT_EQ(lines, 6);
  // A sine is easy: the validation error falls well below the signal's spread (~0.7).
  EXPECT_LT(s.last.at("val_rmse"), 0.2) << log.str();
  const auto m = evaluate((dir / "run").string(), "test");
  EXPECT_GT(m.at("samples"), 0);
  EXPECT_LT(m.at("test_rmse"), 0.25);
  const auto meta =
      io::SafetensorsFile::read((dir / "run" / "model.safetensors").string()).metadata();
  EXPECT_TRUE(meta.count("seqforge.target_norm"));
  EXPECT_TRUE(meta.count("seqforge.config"));
}

TEST(Trainer, ClassifyAndCharlmRun) {
  const fs::path dir = temp_dir("classify");
  const std::string data = write_series(dir, 300);
  std::ostringstream log;
  const TrainSummary s =
      train(Config::parse(
                "data: {path: " + data +
                    ", task: classify, date_column: when, class_column: label, "
                    "features: [signal], lookback: 8}\n"
                    "train: {epochs: 8, batch_size: 16, run_dir: " +
                    (dir / "c").string() +
                    ", early_stopping: {monitor: val_accuracy, mode: max}}\noptim: {lr: 0.02}\n",
                "c.yaml"),
            log);
  EXPECT_GT(s.best, 0.8) << log.str();  // the next sign of a sine follows from its past

  const fs::path text = dir / "text.txt";
  std::ofstream(text) << std::string(2000, 'a') + "abcabcabc\n";
  const TrainSummary t =
      train(Config::parse("data: {path: " + text.string() +
                              ", task: charlm, seq_len: 16}\nmodel: {hidden: 16, embedding: 8}\n"
                              "train: {epochs: 1, batch_size: 8, run_dir: " +
                              (dir / "lm").string() + "}\n",
                          "lm.yaml"),
            log);
  EXPECT_EQ(t.epochs, 1);
  const std::string sample = generate((dir / "lm").string(), "ab", 20, 1.0, 0, 3);
  EXPECT_EQ(sample.size(), 22u);
  EXPECT_EQ(sample.substr(0, 2), "ab");
  EXPECT_NE(error_of([&] {
              generate((dir / "lm").string(), "xyz", 5, 1.0, 0, 0);
            }).find("not in the model's vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([&] { generate((dir / "c").string(), "a", 5, 1.0, 0, 0); }).find("charlm"),
            std::string::npos);
}

TEST(Trainer, BadInputNamesTheFileLineOrKey) {
  const fs::path dir = temp_dir("bad");
  const std::string data = write_series(dir, 100);
  const fs::path run = dir / "run";
  std::ostringstream log;
  auto train_with = [&](const std::string& yaml, std::vector<std::string> overrides = {}) {
    return error_of([&] { train(Config::parse(yaml, "bad.yaml", overrides), log); });
  };
  const std::string base = forecast_yaml(data, run);
  EXPECT_NE(train_with(base, {"data.path=" + (dir / "missing.csv").string()}).find("missing.csv"),
            std::string::npos);
  EXPECT_NE(train_with(base, {"data.targets=[nope]"}).find("no column 'nope'"), std::string::npos);
  EXPECT_NE(train_with(base, {"data.lookback=0"}).find("data.lookback must be positive"),
            std::string::npos);
  EXPECT_NE(train_with(base, {"model.hidden=-3"}).find("model.hidden must be positive"),
            std::string::npos);
  EXPECT_NE(train_with(base, {"train.batch_size=0"}).find("train.batch_size"), std::string::npos);
  EXPECT_NE(train_with(base, {"data.lookback=500"}).find("shorter than data.lookback"),
            std::string::npos);
  EXPECT_NE(train_with(base, {"data.task=regress"}).find("data.task"), std::string::npos);
  EXPECT_NE(train_with(base, {"train.early_stopping.monitor=val_accuracy"}).find("not a metric"),
            std::string::npos);
  // A ragged row and a non-numeric cell name the line.
  const fs::path bad_csv = dir / "bad.csv";
  std::ofstream(bad_csv) << "when,signal,other,label\n2020-01-01,1,2,up\n2020-01-02,x,2,up\n";
  EXPECT_NE(train_with(base, {"data.path=" + bad_csv.string()}).find("bad.csv:3"),
            std::string::npos);
  // Weights of another architecture given to init_from.
  train(Config::parse(base, "ok.yaml", {"train.epochs=1"}), log);
  const std::string other =
      train_with(base, {"model.hidden=8", "model.init_from=" + (run / "model.safetensors").string(),
                        "train.run_dir=" + (dir / "run2").string()});
  EXPECT_NE(other.find("model.safetensors"), std::string::npos) << other;
  EXPECT_NE(other.find("shape"), std::string::npos) << other;
}

}  // namespace
}  // namespace seqforge

namespace seqforge {
namespace {

std::vector<std::string> metric_lines(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    // Timings differ from run to run; everything else must not.
    for (const char* key : {"\"epoch_seconds\"", "\"train_seconds\"", "\"samples_per_second\""}) {
      const size_t at = line.find(key);
      if (at != std::string::npos) line.erase(at, line.find_first_of(",}", at) - at);
    }
    out.push_back(line);
  }
  return out;
}

TEST(Trainer, ResumedRunEqualsUninterruptedRun) {
  const fs::path dir = temp_dir("resume");
  const std::string data = write_series(dir, 300);
  std::ostringstream log;
  auto config = [&](const fs::path& run, int epochs) {
    return Config::parse(
        forecast_yaml(data, run), "r.yaml",
        {"model.layers=2", "model.dropout=0.2", "train.epochs=" + std::to_string(epochs)});
  };
  train(config(dir / "whole", 4), log);
  train(config(dir / "split", 2), log);
  const Config resumed =
      Config::load((dir / "split" / "config.resolved.yaml").string(), {"train.epochs=4"});
  const TrainSummary s = train(resumed, log, (dir / "split").string());
  EXPECT_EQ(s.epochs, 4);
  const auto whole = metric_lines(dir / "whole"), split = metric_lines(dir / "split");
  ASSERT_EQ(whole.size(), 4u);
  EXPECT_EQ(split, whole);
}

TEST(Trainer, ResumeRefusesAnotherArchitectureAndTouchesNothing) {
  const fs::path dir = temp_dir("resume_bad");
  const std::string data = write_series(dir, 200);
  std::ostringstream log;
  train(Config::parse(forecast_yaml(data, dir / "run"), "r.yaml", {"train.epochs=1"}), log);
  const auto before = fs::last_write_time(dir / "run" / "model.safetensors");
  const std::string e = error_of([&] {
    train(Config::load((dir / "run" / "config.resolved.yaml").string(), {"model.hidden=8"}), log,
          (dir / "run").string());
  });
  EXPECT_NE(e.find("training_state.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("another architecture"), std::string::npos) << e;
  EXPECT_EQ(fs::last_write_time(dir / "run" / "model.safetensors"), before);
  EXPECT_NE(error_of([&] {
              train(Config::parse(forecast_yaml(data, dir / "fresh"), "r.yaml"), log,
                    (dir / "nothing").string());
            }).find("nothing to resume"),
            std::string::npos);
}

}  // namespace
}  // namespace seqforge

namespace seqforge {
namespace {

TEST(Trainer, PretrainThenFineTuneWithAFrozenEncoder) {
  const fs::path dir = temp_dir("mae");
  const std::string data = write_series(dir, 300);
  std::ostringstream log;
  const std::string common = "  date_column: when\n  features: [signal, other]\n  lookback: 10\n";
  const TrainSummary pre = train(
      Config::parse("data:\n  path: " + data + "\n  task: mae\n  mask_ratio: 0.3\n" + common +
                        "model: {hidden: 12, bidirectional: true}\ntrain: {epochs: 3, run_dir: " +
                        (dir / "pre").string() + "}\n",
                    "pre.yaml"),
      log);
  EXPECT_TRUE(pre.last.count("val_loss"));
  EXPECT_FALSE(pre.last.count("val_bpc"));
  const io::SafetensorsFile encoder = io::SafetensorsFile::read(pre.checkpoint);
  // Fine-tune: only lstm.* comes from the pre-trained file (its head has another shape), and
  // the encoder stays exactly as loaded while frozen.
  const std::string fine =
      "data:\n  path: " + data +
      "\n  task: classify\n  label: direction\n  label_column: signal\n  horizon: 3\n"
      "  label_fraction: 0.3\n" +
      common + "model: {hidden: 12, bidirectional: true, init_from: " + pre.checkpoint +
      ", init_from_modules: [lstm]}\ntrain: {epochs: 2, freeze_modules: [lstm], freeze_epochs: 2, "
      "save: last, run_dir: " +
      (dir / "fine").string() + "}\n";
  const TrainSummary ft = train(Config::parse(fine, "fine.yaml"), log);
  const io::SafetensorsFile tuned = io::SafetensorsFile::read(ft.checkpoint);
  for (const auto& e : tuned.entries()) {
    const auto got = tuned.bytes(e);
    if (e.name.rfind("lstm.", 0) == 0) {
      const auto want = encoder.bytes(*encoder.find(e.name));
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end())) << e.name;
    }
  }
  EXPECT_EQ(tuned.find("head.weight")->shape, (std::vector<int64_t>{2, 24}));
  // Unfrozen after freeze_epochs: the encoder moves.
  const TrainSummary ft2 =
      train(Config::parse(fine, "fine.yaml",
                          {"train.freeze_epochs=1", "train.run_dir=" + (dir / "fine2").string()}),
            log);
  const io::SafetensorsFile moved = io::SafetensorsFile::read(ft2.checkpoint);
  const auto a = moved.bytes(*moved.find("lstm.weight_hh_l0"));
  const auto b = encoder.bytes(*encoder.find("lstm.weight_hh_l0"));
  EXPECT_FALSE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  EXPECT_NE(error_of([&] {
              train(Config::parse(fine, "fine.yaml", {"train.freeze_modules=[encoder]"}), log);
            }).find("no module 'encoder'"),
            std::string::npos);
}

}  // namespace
}  // namespace seqforge
