// The tune: section: a good search space, and a clear error for each kind of bad one.
#include <gtest/gtest.h>

#include <cmath>

#include "seqforge/core/error.hpp"
#include "seqforge/train/config.hpp"
#include "seqforge/tune/samplers.hpp"
#include "seqforge/tune/space.hpp"
#include "seqforge/tune/study.hpp"

namespace seqforge::tune::tune_space_test {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_tune_settings(yaml, "t.yaml", "val_loss");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kGood = R"(data: {path: x.csv}
tune:
  direction: minimize
  n_trials: 7
  sampler: {kind: tpe, seed: 3}
  pruner: {kind: percentile, percentile: 25, n_warmup_steps: 2}
  space:
    optim.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
    model.hidden: {type: int, low: 16, high: 70, step: 16}
    optim.kind: {type: categorical, choices: [adamw, sgd]}
    model.dropout: {type: float, low: 0.0, high: 0.5, step: 0.1}
)";

// A setting only another sampler or pruner reads is said to go unused, naming its line.
TEST(TuneSpace, SettingsTheChosenSamplerOrPrunerDoesNotReadAreNamed) {
  const std::string space = "  space:\n    optim.lr: {type: float, low: 0.001, high: 0.1}\n";
  auto unused = [&](const std::string& lines) {
    return parse_tune_settings("tune:\n" + lines + space, "t.yaml", "val_loss").unused;
  };
  EXPECT_TRUE(unused("  sampler: {kind: tpe, n_startup_trials: 3}\n  pruner: {kind: median, "
                     "n_startup_trials: 2}\n")
                  .empty());
  EXPECT_EQ(unused("  sampler: {kind: random, seed: 1, n_startup_trials: 3}\n"),
            std::vector<std::string>{"t.yaml:2: tune.sampler.n_startup_trials: the random "
                                     "sampler has no use for it (a tpe sampler's setting)"});
  EXPECT_EQ(unused("  pruner: {kind: median,\n    percentile: 30}\n"),
            std::vector<std::string>{
                "t.yaml:3: tune.pruner.percentile: the median pruner has no use for it"});
  EXPECT_EQ(unused("  pruner: {kind: none, n_warmup_steps: 3}\n").size(), 1u);
  EXPECT_NE(error_of("tune:\n  sampler: {kind: tpe, seed: -1}\n" + space)
                .find("tune.sampler.seed: must be 0 or more"),
            std::string::npos);
}

// A study's direction: tune.direction; else, with a tune.metric of its own, the way that metric is
// better (an accuracy is maximized whatever early stopping watched); else the default (from
// train.early_stopping.mode).
TEST(TuneSpace, TheDirectionFollowsTheStudysMetric) {
  const std::string space = "  space:\n    optim.lr: {type: float, low: 0.001, high: 0.1}\n";
  auto settings = [&](const std::string& lines, Direction fallback) {
    return parse_tune_settings("tune:\n" + lines + space, "t.yaml", "val_loss", fallback);
  };
  EXPECT_EQ(settings("  metric: val_accuracy\n", Direction::minimize).direction,
            Direction::maximize);
  EXPECT_EQ(settings("  metric: val_skill\n", Direction::minimize).direction, Direction::maximize);
  EXPECT_EQ(settings("  metric: val_mae\n", Direction::maximize).direction, Direction::minimize);
  EXPECT_EQ(settings("  metric: val_f1\n  direction: minimize\n", Direction::maximize).direction,
            Direction::minimize);
  EXPECT_EQ(settings("", Direction::maximize).direction, Direction::maximize);
  EXPECT_EQ(settings("", Direction::minimize).direction, Direction::minimize);
  EXPECT_TRUE(higher_is_better("val_accuracy"));
  EXPECT_TRUE(higher_is_better("val_skill"));
  EXPECT_FALSE(higher_is_better("val_loss"));
  EXPECT_FALSE(higher_is_better("val_perplexity"));
  EXPECT_EQ(
      Config::parse("data: {path: x.csv}\n", "c.yaml", {"train.early_stopping.monitor=val_skill"})
          .str("train.early_stopping.mode"),
      "max");
}

TEST(TuneSpace, ParsesTheTuneSection) {
  const TuneSettings s = parse_tune_settings(kGood, "t.yaml", "val_loss");
  EXPECT_EQ(s.name, "t");
  EXPECT_EQ(s.n_trials, 7);
  EXPECT_EQ(s.metric, "val_loss");
  EXPECT_EQ(s.pruner.kind, "percentile");
  EXPECT_EQ(s.pruner.percentile, 25);
  EXPECT_EQ(s.pruner.n_warmup_steps, 2);
  ASSERT_EQ(s.space.size(), 4u);
  const Param& hidden = s.param("model.hidden");
  EXPECT_EQ(hidden.high, 64);  // lowered onto the last step, as Optuna does
  EXPECT_EQ(hidden.text(hidden.snap(37)), "32");
  EXPECT_EQ(s.param("optim.kind").text(1), "sgd");
  EXPECT_EQ(s.param("model.dropout").text(s.param("model.dropout").snap(0.26)), "0.3");
  // The trial config accepts every override the space makes.
  std::map<std::string, double> params{
      {"optim.lr", 0.01}, {"model.hidden", 48}, {"optim.kind", 1}, {"model.dropout", 0.2}};
  const auto overrides = param_overrides(s, params);
  const Config c = Config::parse("data: {path: x.csv}\n", "c.yaml", overrides);
  EXPECT_EQ(c.integer("model.hidden"), 48);
  EXPECT_EQ(c.str("optim.kind"), "sgd");
  EXPECT_DOUBLE_EQ(c.number("optim.lr"), 0.01);
  // A training run ignores the section.
  EXPECT_EQ(Config::parse(kGood, "t.yaml").str("data.path"), "x.csv");
}

TEST(TuneSpace, BadSpacesGetOneClearError) {
  const std::string head = "tune:\n  space:\n";
  const std::pair<std::string, std::string> cases[] = {
      {"data: {}\n", "no `tune:` section"},
      {"tune: {space: {}}\n", "tune.space: expected a map"},
      {head + "    model.hiden: {type: int, low: 1, high: 4}\n",
       "'model.hiden' is not a config key"},
      {head + "    model.hidden: {type: int, low: 8, high: 4}\n", "must not exceed high"},
      {head + "    optim.lr: {type: float, low: 0, high: 1, log: true}\n", "log needs low > 0"},
      {head + "    optim.lr: {type: flot, low: 0, high: 1}\n",
       "expected float, int or categorical"},
      {head + "    optim.lr: {type: float, low: a, high: 1}\n",
       "tune.space.optim.lr.low: expected a number"},
      {head + "    optim.lr: {type: float, low: 0.1}\n", "give low and high"},
      {head + "    model.hidden: {type: float, low: 1, high: 4}\n",
       "'model.hidden' takes whole numbers: search it with type: int"},
      {head + "    optim.kind: {type: float, low: 1, high: 4}\n", "needs a numeric config key"},
      {head + "    model: {type: int, low: 4, high: 12}\n",
       "'model' is not a config key (a section: name one of its keys, such as 'model."},
      {head + "    optim.lrr: {type: float, low: 0.1, high: 1}\n",
       "'optim.lrr' is not a config key (did you mean 'optim.lr'?)"},
      {"tune:\n  n_trails: 5\n  space: {optim.lr: {type: float, low: 0.1, high: 1}}\n",
       "unknown key 'tune.n_trails' (did you mean 'tune.n_trials'? known:"},
      {head + "    optim.kind: {type: categorical, choices: []}\n", "expected a non-empty list"},
      {head + "    optim.lr: {type: categorical, choices: [0.1, fast]}\n", "'fast' is not a valid"},
      {head + "    train.save: {type: categorical, choices: [best, last]}\n",
       "'train.save' cannot be searched: the study sets it in every trial"},
      {head + "    train.early_stopping.mode: {type: categorical, choices: [min, max]}\n",
       "'train.early_stopping.mode' cannot be searched"},
      {head + "    optim.lr: {type: float, low: 0.1, high: 1, stride: 2}\n",
       "unknown key 'tune.space.optim.lr.stride'"},
      {"tune:\n  sampler: bayes\n  space: {optim.lr: {type: float, low: 0.1, high: 1}}\n",
       "expected tpe, random or grid"},
      {"tune:\n  pruner: {kind: median, n_warmup_steps: -1}\n  space: {optim.lr: {type: float, "
       "low: 0.1, high: 1}}\n",
       "n_warmup_steps: must be at least 0"},
      {"tune:\n  pruner: percentile\n  space: {optim.lr: {type: float, low: 0.1, high: 1}}\n",
       "percentile: required"},
      {"tune:\n  direction: down\n  space: {optim.lr: {type: float, low: 0.1, high: 1}}\n",
       "expected minimize or maximize"},
      {"tune:\n  sampler: grid\n  space: {optim.lr: {type: float, low: 0.1, high: 1}}\n",
       "grid sampler needs"},
      {"tune:\n  trials: 5\n  space: {optim.lr: {type: float, low: 0.1, high: 1}}\n",
       "unknown key 'tune.trials'"},
      {"tune: [1\n", "not valid YAML"},
      {head + "    train.seed: {type: int, low: 0, high: 9223372036854775807}\n",
       "tune.space.train.seed.high: 9223372036854775807 is beyond 2^53 = 9007199254740992"},
      {head + "    train.seed: {type: int, low: -9007199254740993, high: 0}\n",
       "train.seed.low: -9007199254740993 is beyond 2^53"},
      {head + "    optim.lr: {type: float, low: -1e308, high: 1e308}\n",
       "tune.space.optim.lr: the range from -1e+308 to 1e+308 is wider than a double holds"},
  };
  for (const auto& [yaml, want] : cases) {
    const std::string e = error_of(yaml);
    EXPECT_NE(e.find(want), std::string::npos) << yaml << "\n-> " << e;
    EXPECT_EQ(e.rfind("t.yaml", 0), 0u) << e;  // names the file (and line)
  }
}

TEST(TuneSampler, RandomStaysInTheSpaceAndDependsOnlyOnSeedAndNumber) {
  TuneSettings s = parse_tune_settings(kGood, "t.yaml", "val_loss");
  s.sampler.kind = "random";
  auto a = make_sampler(s), b = make_sampler(s);
  for (int64_t n = 0; n < 200; ++n) {
    Trial t;
    t.number = n;
    const auto p = a->sample({}, t);
    EXPECT_EQ(p, b->sample({}, t));
    for (const auto& param : s.space) EXPECT_TRUE(param.contains(p.at(param.name))) << param.name;
  }
  Trial t0, t1;
  t1.number = 1;
  EXPECT_NE(a->sample({}, t0), a->sample({}, t1));
}

TEST(TuneSampler, GridVisitsEveryPointOnce) {
  const TuneSettings s = parse_tune_settings(
      "tune:\n  sampler: grid\n  space:\n    model.hidden: {type: int, low: 8, high: 32, step: 8}\n"
      "    optim.kind: {type: categorical, choices: [adamw, adam, sgd]}\n"
      "    optim.lr: {type: float, low: 0.001, high: 0.1, grid: [0.001, 0.01]}\n",
      "g.yaml", "val_loss");
  auto sampler = make_sampler(s);
  const Grid* g = sampler->grid();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->size(), 4 * 3 * 2);
  // Numbered as Optuna's GridSampler: itertools.product of the values, parameters in name order.
  EXPECT_EQ(g->point(0), (std::map<std::string, double>{
                             {"model.hidden", 8}, {"optim.kind", 0}, {"optim.lr", 0.001}}));
  EXPECT_EQ(g->point(1), (std::map<std::string, double>{
                             {"model.hidden", 8}, {"optim.kind", 0}, {"optim.lr", 0.01}}));
  EXPECT_EQ(g->point(2), (std::map<std::string, double>{
                             {"model.hidden", 8}, {"optim.kind", 1}, {"optim.lr", 0.001}}));
  EXPECT_EQ(g->point(23), (std::map<std::string, double>{
                              {"model.hidden", 32}, {"optim.kind", 2}, {"optim.lr", 0.01}}));
  std::set<std::map<std::string, double>> seen;
  for (int64_t id : g->order()) {
    Trial t;
    t.attrs["grid_id"] = double(id);
    const auto point = sampler->sample({}, t);
    EXPECT_EQ(g->id_of(point), id);
    seen.insert(point);
  }
  EXPECT_EQ(int64_t(seen.size()), g->size());
  EXPECT_EQ(g->id_of({{"model.hidden", 8}, {"optim.kind", 0}, {"optim.lr", 0.002}}), std::nullopt);
  EXPECT_EQ(g->id_of({{"model.hidden", 8}, {"optim.kind", 0}}), std::nullopt);
}

// A grid too large to enumerate is named by its entry's line and key, with the way out.
TEST(TuneSampler, GridTooLargeNamesTheParameter) {
  const auto grid_error = [](const std::string& space) {
    try {
      make_sampler(
          parse_tune_settings("tune:\n  sampler: grid\n  space:\n" + space, "g.yaml", "val_loss"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(grid_error("    model.hidden: {type: int, low: 8, high: 32}\n"
                       "    train.batch_size: {type: int, low: 1, high: 1000000}\n"),
            "g.yaml:5: tune.space.train.batch_size: 1000000 grid values from low to high by "
            "step; at most 100000: give a larger step or the values in grid");
  EXPECT_EQ(grid_error("    model.hidden: {type: int, low: 1, high: 2000}\n"
                       "    train.batch_size: {type: int, low: 1, high: 1000}\n"),
            "g.yaml:5: tune.space: with tune.space.train.batch_size the grid has over a million "
            "points (2000000 so far): search fewer values or use the tpe or random sampler");
  EXPECT_EQ(grid_error("    model.hidden: {type: int, low: 8, high: 32}\n"
                       "    optim.lr: {type: float, low: 0.001, high: 0.1}\n"),
            "g.yaml:5: tune.space.optim.lr: the grid sampler needs a list of values (grid: [...]) "
            "or a step");
}

// A stepped float's range ends on its last step in decimal, as Optuna's: 0 to 0.9 by 0.3 is
// 0, 0.3, 0.6, 0.9 (not 0.8999999999999999).
TEST(TuneSampler, SteppedFloatGridEndsOnItsDecimalLastStep) {
  const TuneSettings s = parse_tune_settings(
      "tune:\n  sampler: grid\n  space:\n"
      "    optim.weight_decay: {type: float, low: 0.0, high: 0.9, step: 0.3}\n"
      "    optim.lr: {type: float, low: 0.1, high: 0.35, step: 0.1}\n",
      "g.yaml", "val_loss");
  EXPECT_EQ(s.param("optim.weight_decay").high, 0.9);
  EXPECT_EQ(s.param("optim.lr").high, 0.3);
  const auto sampler = make_sampler(s);
  const Grid* g = sampler->grid();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->axes()[0].second, (std::vector<double>{0.1, 0.2, 0.3}));
  EXPECT_EQ(g->axes()[1].second, (std::vector<double>{0.0, 0.3, 0.6, 0.9}));
}

// A known function with its optimum at lr = 10^-2.5, dropout = 0.3, hidden = 48.
double objective(const std::map<std::string, double>& p) {
  const double a = std::log10(p.at("optim.lr")) + 2.5, b = (p.at("model.dropout") - 0.3) * 4,
               c = (p.at("model.hidden") - 48) / 32;
  return a * a + b * b + c * c;
}

int64_t trials_to_reach(const std::string& kind, uint64_t seed, double threshold, int64_t cap) {
  TuneSettings s = parse_tune_settings(
      "tune:\n  space:\n    optim.lr: {type: float, low: 1.0e-5, high: 1.0, log: true}\n"
      "    model.dropout: {type: float, low: 0.0, high: 0.9}\n"
      "    model.hidden: {type: int, low: 8, high: 256}\n",
      "f.yaml", "val_loss");
  s.sampler.kind = kind;
  s.sampler.seed = seed;
  auto sampler = make_sampler(s);
  std::vector<Trial> trials;
  for (int64_t n = 0; n < cap; ++n) {
    Trial t;
    t.number = n;
    t.params = sampler->sample(trials, t);
    t.value = objective(t.params);
    t.state = TrialState::complete;
    if (*t.value < threshold) return n + 1;
    trials.push_back(t);
  }
  return cap;
}

TEST(TuneSampler, TpeReachesTheOptimumInFewerTrialsThanRandom) {
  const int seeds = 12;
  const int64_t cap = 150;
  int64_t tpe = 0, random = 0, tpe_wins = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    const int64_t t = trials_to_reach("tpe", seed, 0.15, cap);
    const int64_t r = trials_to_reach("random", seed, 0.15, cap);
    tpe += t;
    random += r;
    tpe_wins += t < r;
  }
  std::printf(
      "trials to reach f < 0.15 (mean of %d seeds): TPE %.1f, random %.1f; TPE first in %lld\n",
      seeds, double(tpe) / seeds, double(random) / seeds, (long long)tpe_wins);
  EXPECT_LT(tpe * 10, random * 7);  // at least 30% fewer trials on average
  EXPECT_GE(tpe_wins, seeds / 2);
}

}  // namespace
}  // namespace seqforge::tune::tune_space_test

namespace seqforge::tune::tune_space_test {
namespace {

TEST(TuneValue, BestFollowsTheTrainersCheckpointRuleAndLastTheLastEpoch) {
  TuneSettings s = parse_tune_settings(
      "tune:\n  value: best\n  space:\n    optim.lr: {type: float, low: 0.001, high: 0.1}\n",
      "v.yaml", "val_loss");
  Trial t;
  std::string why;
  t.intermediate = {{0, 1.0}, {1, 0.5}, {2, 0.45}, {3, std::nan("")}, {4, 0.7}};
  EXPECT_EQ(*trial_value(t, s, &why), 0.45);
  s.min_delta = 0.1;  // 0.45 is no improvement on 0.5 by more than 0.1: epoch 2's checkpoint stays
  EXPECT_EQ(*trial_value(t, s, &why), 0.5);
  s.min_delta = 0;
  t.intermediate[5] = -INFINITY;  // the epoch that counts is not finite: the trial fails
  EXPECT_FALSE(trial_value(t, s, &why));
  EXPECT_EQ(why, "val_loss was -inf at epoch 6");
  t.intermediate = {{0, std::nan("")}, {1, INFINITY}};
  EXPECT_FALSE(trial_value(t, s, &why));
  EXPECT_NE(why.find("never finite"), std::string::npos) << why;
  s.direction = Direction::maximize;
  t.intermediate = {{0, 0.5}, {1, 0.9}, {2, 0.8}};
  EXPECT_EQ(*trial_value(t, s, &why), 0.9);
  const std::string fp = s.fingerprint();
  s.value = "last";
  EXPECT_NE(s.fingerprint(), fp);
  EXPECT_EQ(*trial_value(t, s, &why), 0.8);
  t.intermediate[3] = std::nan("");
  EXPECT_FALSE(trial_value(t, s, &why));
  EXPECT_EQ(why, "val_loss was nan at its last epoch (epoch 4)");
  EXPECT_EQ(parse_tune_settings("tune:\n  value: last\n  space:\n    optim.lr: {type: float, "
                                "low: 0.001, high: 0.1}\n",
                                "v.yaml", "val_loss")
                .value,
            "last");
  // A searched min_delta is each trial's own, as its trainer applies it.
  for (const char* space :
       {"{type: float, low: 0, high: 0.2}", "{type: categorical, choices: [0, 0.1]}"}) {
    TuneSettings searched = parse_tune_settings(
        std::string("tune:\n  space:\n    train.early_stopping.min_delta: ") + space + "\n",
        "v.yaml", "val_loss");
    searched.min_delta = 0;  // the base config's
    Trial u;
    u.intermediate = {{0, 1.0}, {1, 0.5}, {2, 0.45}};
    u.params["train.early_stopping.min_delta"] =
        searched.space[0].kind == Param::Kind::categorical ? 1 : 0.1;
    EXPECT_EQ(*trial_value(u, searched, &why), 0.5) << space;
    u.params["train.early_stopping.min_delta"] = 0;
    EXPECT_EQ(*trial_value(u, searched, &why), 0.45) << space;
  }
  try {
    parse_tune_settings(
        "tune:\n  value: median\n  space:\n    optim.lr: {type: float, low: 0.001, high: 0.1}\n",
        "v.yaml", "val_loss");
    ADD_FAILURE() << "tune.value: median accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v.yaml:2: tune.value: expected best or last"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace seqforge::tune::tune_space_test
