// `seqforge diagnose CONFIG` in the library: what it finds in the data, its estimate of an epoch,
// and problems, one line each naming the key to change.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "seqforge/core/error.hpp"
#include "seqforge/train/trainer.hpp"

namespace seqforge::diagnose_test {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  fs::path dir, data;
  Fixture(const std::string& name, int rows) {
    dir = fs::temp_directory_path() / ("seqforge_diagnose_test_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    data = dir / "series.csv";
    std::ofstream f(data);
    f << "t,signal,other\n";
    for (int i = 0; i < rows; ++i) f << i << "," << std::sin(i * 0.3) << "," << i % 7 << "\n";
  }
  Config config(const std::vector<std::string>& overrides = {}) const {
    return Config::parse("data:\n  path: " + data.string() +
                             "\n  features: [signal, other]\n"
                             "  targets: [signal]\n  lookback: 12\n"
                             "model: {hidden: 16}\ntrain: {batch_size: 16, run_dir: " +
                             (dir / "run").string() + "}\n",
                         "d.yaml", overrides);
  }
};

TEST(Diagnose, DescribesTheDataAndEstimatesAnEpoch) {
  const Fixture fx("ok", 400);
  const ConfigDiagnosis d = diagnose_config(fx.config(), 4);
  EXPECT_EQ(d.task, "forecast");
  EXPECT_EQ(d.rows, 400);
  EXPECT_GT(d.train, 0);
  EXPECT_GT(d.val, 0);
  EXPECT_GT(d.test, 0);
  EXPECT_LE(d.train + d.val + d.test, 400 - 12);
  EXPECT_EQ(d.steps, 12);
  EXPECT_EQ(d.batches_per_epoch, (d.train + 15) / 16);
  EXPECT_GT(d.parameters, 4 * 16 * (2 + 16));
  EXPECT_NEAR(d.batch_input_mb * 1048576, 16 * 4.0 * (12 * 2 + 1), 1.0);
  EXPECT_GT(d.activation_mb, 0);
  EXPECT_EQ(d.timed_steps, 4);
  EXPECT_GT(d.step_seconds, 0);
  EXPECT_GT(d.validation_seconds, 0);
  EXPECT_GE(d.epoch_seconds, d.step_seconds * d.batches_per_epoch);
  EXPECT_TRUE(d.problems.empty()) << d.problems.front();
  EXPECT_FALSE(fs::exists(fx.dir / "run")) << "the measured run leaves the run directory alone";
  EXPECT_TRUE(d.notes.empty()) << d.notes.front();
  // What train notes of the data, diagnose notes too.
  const ConfigDiagnosis q =
      diagnose_config(fx.config({"train.loss=quantile", "train.quantiles=[0.1, 0.9]"}), 0);
  ASSERT_EQ(q.notes.size(), 1u);
  EXPECT_NE(q.notes[0].find("train.quantiles has no 0.5"), std::string::npos) << q.notes[0];
}

TEST(Diagnose, ReportsEachProblemOnOneLineNamingTheKey) {
  const Fixture fx("problems", 120);
  const fs::path file_in_the_way = fx.dir / "not_a_dir";
  std::ofstream(file_in_the_way) << "x";
  const ConfigDiagnosis d = diagnose_config(
      fx.config({"train.batch_size=4096", "train.threads=4096", "data.split.train=0.85",
                 "data.split.val=0.15", "train.run_dir=" + (file_in_the_way / "run").string()}),
      0);
  auto has = [&](const std::string& key) {
    for (const auto& p : d.problems)
      if (p.find(key) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has("train.batch_size")) << "larger than the training split";
  EXPECT_TRUE(has("train.threads")) << "more threads than CPUs";
  EXPECT_TRUE(has("train.run_dir")) << "not writable";
  EXPECT_TRUE(has("test split")) << "no test windows";
  for (const auto& p : d.problems) {
    EXPECT_EQ(p.find('\n'), std::string::npos) << p;
    EXPECT_NE(p.find(": "), std::string::npos) << "what to change follows a colon: " << p;
  }
  EXPECT_EQ(d.timed_steps, 0);
}

// What the training loop refuses before its first step is a problem, timed steps or not, named
// as train names it; nothing is timed then.
TEST(Diagnose, WhatTheTrainingLoopRefusesIsAProblem) {
  const Fixture fx("loop", 400);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"train.early_stopping.monitor=val_loss", "data.split.val=0"},
       "train.early_stopping.monitor is val_loss but data.split.val is 0"},
      {{"train.stateful=true", "model.bidirectional=true"},
       "override 'train.stateful=true': train.stateful needs a unidirectional model"},
      {{"train.stateful=true", "data.stride=5"},
       "override 'data.stride=5': data.stride 5 does not divide data.lookback 12"}};
  for (const auto& [overrides, problem] : cases)
    for (int steps : {0, 2}) {
      const ConfigDiagnosis d = diagnose_config(fx.config(overrides), steps);
      ASSERT_EQ(d.problems.size(), 1u) << problem;
      EXPECT_NE(d.problems[0].find(problem), std::string::npos) << d.problems[0];
      EXPECT_EQ(d.timed_steps, 0);
    }
}

// The memory figure is the measured run's peak, not the process's before it; a run directory
// the file system cannot hold is a problem, one it can is left as it was.
TEST(Diagnose, MeasuredPeakIsTheRunsAndTheRunDirectoryIsTried) {
  const Fixture fx("peak", 400);
  {
    std::vector<char> big(size_t{400} << 20);
    for (size_t i = 0; i < big.size(); i += 4096) big[i] = 1;
    volatile char keep = big[12345];
    (void)keep;
  }
  const ConfigDiagnosis d = diagnose_config(fx.config(), 2);
  EXPECT_EQ(d.timed_steps, 2);
  EXPECT_GT(d.measured_peak_mb, 0);
  EXPECT_LT(d.measured_peak_mb, 350) << "the 400 MB touched before the run are not its peak";
  EXPECT_FALSE(fs::exists(fx.dir / "run"));
  const ConfigDiagnosis proc =
      diagnose_config(fx.config({"train.run_dir=/proc/seqforge_diagnose_test"}), 0);
  ASSERT_FALSE(proc.problems.empty());
  EXPECT_NE(proc.problems[0].find("train.run_dir /proc/seqforge_diagnose_test"), std::string::npos)
      << proc.problems[0];
  const fs::path fresh = fx.dir / "new" / "run";
  EXPECT_TRUE(diagnose_config(fx.config({"train.run_dir=" + fresh.string()}), 0).problems.empty());
  EXPECT_FALSE(fs::exists(fx.dir / "new"));
}

TEST(Diagnose, DataErrorsComeOutAsTheyDoForTrain) {
  const Fixture fx("short", 10);
  std::string diagnose_error, train_error;
  try {
    diagnose_config(fx.config({"data.lookback=50"}), 0);
  } catch (const Error& e) {
    diagnose_error = e.what();
  }
  std::ostringstream log;
  try {
    train(fx.config({"data.lookback=50"}), log);
  } catch (const Error& e) {
    train_error = e.what();
  }
  EXPECT_FALSE(train_error.empty());
  EXPECT_EQ(diagnose_error, train_error);
}

}  // namespace
}  // namespace seqforge::diagnose_test
