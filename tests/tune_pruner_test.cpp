// The pruners against Optuna itself: the same random intermediate-value histories (NaNs, gaps
// between reported steps, ties, pruned and failed trials) go through both, and every decision at
// every step must match.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "seqforge/tune/pruners.hpp"

namespace seqforge::tune::tune_pruner_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(TunePruner, NanPercentileMatchesNumpyExamples) {
  EXPECT_DOUBLE_EQ(nan_percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(nan_percentile({4, NAN, 1, 2, 3}, 50), 2.5);
  EXPECT_DOUBLE_EQ(nan_percentile({1, 2, 3, 4}, 25), 1.75);
  EXPECT_DOUBLE_EQ(nan_percentile({1, 2, 3, 4}, 100), 4);
  EXPECT_DOUBLE_EQ(nan_percentile({1, 2, 3, 4}, 0), 1);
  EXPECT_TRUE(std::isnan(nan_percentile({NAN, NAN}, 50)));
}

TEST(TunePruner, MedianWaitsForStartupAndWarmup) {
  PrunerSettings s;
  s.n_startup_trials = 2;
  s.n_warmup_steps = 1;
  auto pruner = make_pruner(s);
  std::vector<Trial> trials(2);
  for (auto& t : trials) {
    t.state = TrialState::complete;
    t.intermediate = {{0, 1.0}, {1, 1.0}};
  }
  Trial bad;
  bad.intermediate = {{0, 5.0}};
  EXPECT_FALSE(pruner->prune(trials, bad, Direction::minimize, nullptr));  // warm-up step
  bad.intermediate[1] = 5.0;
  EXPECT_TRUE(pruner->prune(trials, bad, Direction::minimize, nullptr));
  EXPECT_FALSE(pruner->prune(trials, bad, Direction::maximize, nullptr));
  trials.pop_back();  // one complete trial: still starting up
  EXPECT_FALSE(pruner->prune(trials, bad, Direction::minimize, nullptr));
}

json pruner_json(const PrunerSettings& p) {
  return {{"kind", p.kind},
          {"percentile", p.percentile},
          {"n_startup_trials", p.n_startup_trials},
          {"n_warmup_steps", p.n_warmup_steps},
          {"interval_steps", p.interval_steps},
          {"n_min_trials", p.n_min_trials},
          {"min_resource", p.min_resource},
          {"reduction_factor", p.reduction_factor},
          {"min_early_stopping_rate", p.min_early_stopping_rate},
          {"bootstrap_count", p.bootstrap_count}};
}

struct RandomStudy {
  Direction direction;
  PrunerSettings pruner;
  std::vector<std::vector<std::pair<int64_t, double>>> reports;
  std::vector<bool> fail;
};

RandomStudy random_study(std::mt19937_64& rng) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto coin = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  RandomStudy s;
  s.direction = coin(0.5) ? Direction::minimize : Direction::maximize;
  const int kind = uni(0, 3);
  PrunerSettings& p = s.pruner;
  p.kind = kind == 0 ? "median" : kind == 1 ? "percentile" : "successive_halving";
  if (kind == 3) p.kind = uni(0, 1) ? "median" : "successive_halving";
  const double percentiles[] = {0, 10, 25, 33.3, 50, 75, 90, 100};
  p.percentile = p.kind == "median" ? 50 : percentiles[uni(0, 7)];
  p.n_startup_trials = uni(0, 5);
  p.n_warmup_steps = uni(0, 4);
  p.interval_steps = uni(1, 3);
  p.n_min_trials = uni(1, 3);
  p.min_resource = uni(0, 2);  // 0: "auto"
  p.reduction_factor = uni(2, 4);
  p.min_early_stopping_rate = uni(0, 1);
  p.bootstrap_count = p.min_resource == 0 ? 0 : uni(0, 2);  // Optuna rejects both
  const int n_trials = uni(3, 25);
  const bool quantised = coin(0.4);  // ties between trials
  for (int t = 0; t < n_trials; ++t) {
    std::vector<std::pair<int64_t, double>> r;
    const int n = uni(1, 12);
    const bool all_nan = coin(0.04);
    double level = std::normal_distribution<double>(1.0, 0.3)(rng);
    int64_t step = coin(0.8) ? 0 : uni(0, 3);
    for (int i = 0; i < n; ++i) {
      level *= std::uniform_real_distribution<double>(0.8, 1.02)(rng);
      double v = quantised ? std::round(level * 10) / 10 : level;
      if (all_nan || coin(0.06)) v = NAN;
      r.emplace_back(step, v);
      step += coin(0.7) ? 1 : uni(2, 4);  // gaps between reported steps
    }
    s.reports.push_back(std::move(r));
    s.fail.push_back(coin(0.08));
  }
  return s;
}

// seqforge's decisions, replaying the study as the oracle does.
std::vector<std::vector<bool>> replay(const RandomStudy& s) {
  auto pruner = make_pruner(s.pruner);
  std::vector<Trial> trials;
  std::vector<std::vector<bool>> out;
  for (size_t i = 0; i < s.reports.size(); ++i) {
    trials.emplace_back();
    Trial& t = trials.back();
    t.number = int64_t(i);
    t.state = TrialState::running;
    std::vector<bool> got;
    for (const auto& [step, v] : s.reports[i]) {
      t.intermediate[step] = v;
      std::map<std::string, double> attrs;
      const Trial current = t;
      got.push_back(pruner->prune(trials, current, s.direction, &attrs));
      for (const auto& [k, a] : attrs) trials.back().attrs[k] = a;
      if (got.back()) break;
    }
    Trial& done = trials.back();
    done.state = got.back()  ? TrialState::pruned
                 : s.fail[i] ? TrialState::failed
                             : TrialState::complete;
    out.push_back(std::move(got));
  }
  return out;
}

TEST(TunePruner, DecisionsMatchOptunaOnRandomHistories) {
  const std::string python = "/usr/bin/python3";
  if (std::system((python + " -c 'import optuna' > /dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "python3-optuna is not installed (scripts/install-deps.sh installs it): the "
                    "pruners are not compared with Optuna";
  std::mt19937_64 rng(20240611);
  std::vector<RandomStudy> studies;
  for (int i = 0; i < 400; ++i) studies.push_back(random_study(rng));
  json in = json::array();
  for (const auto& s : studies) {
    json trials = json::array();
    for (size_t i = 0; i < s.reports.size(); ++i) {
      json reports = json::array();
      for (const auto& [step, v] : s.reports[i])
        reports.push_back({step, std::isnan(v) ? json(nullptr) : json(v)});
      trials.push_back({{"reports", reports}, {"fail", bool(s.fail[i])}});
    }
    in.push_back({{"direction", s.direction == Direction::minimize ? "minimize" : "maximize"},
                  {"pruner", pruner_json(s.pruner)},
                  {"trials", trials}});
  }
  const fs::path dir = fs::temp_directory_path() / "seqforge_tune_pruner_oracle";
  fs::create_directories(dir);
  std::ofstream(dir / "in.json") << in.dump();
  const std::string cmd = python +
                          " " SEQFORGE_SOURCE_DIR "/tests/python/optuna_pruner_oracle.py " +
                          (dir / "in.json").string() + " " + (dir / "out.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  json expected;
  std::ifstream(dir / "out.json") >> expected;
  ASSERT_EQ(expected.size(), studies.size());
  int64_t decisions = 0, prunes = 0;
  for (size_t i = 0; i < studies.size(); ++i) {
    const auto got = replay(studies[i]);
    ASSERT_EQ(got.size(), expected[i].size());
    for (size_t t = 0; t < got.size(); ++t) {
      const std::vector<bool> want = expected[i][t].get<std::vector<bool>>();
      ASSERT_EQ(got[t], want) << "study " << i << " (" << studies[i].pruner.kind << ", "
                              << pruner_json(studies[i].pruner).dump() << ") trial " << t;
      decisions += int64_t(want.size());
      for (bool b : want) prunes += b;
    }
  }
  std::printf("pruners: %lld decisions in %zu studies identical to Optuna's (%lld prunes)\n",
              (long long)decisions, studies.size(), (long long)prunes);
  EXPECT_GT(prunes, 100);  // the histories do exercise pruning
}

}  // namespace
}  // namespace seqforge::tune::tune_pruner_test
