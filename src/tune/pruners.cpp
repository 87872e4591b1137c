// Pruners with Optuna 3.1's semantics, decision for decision (tests/tune_pruner_test.cpp checks
// them against Optuna itself on random histories).
#include "seqforge/tune/pruners.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "seqforge/core/error.hpp"

namespace seqforge::tune {

double nan_percentile(std::vector<double> values, double q) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return std::isnan(v); }),
               values.end());
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double n = double(values.size());
  const double virtual_index = (n - 1) * (q / 100.0);
  if (virtual_index >= n - 1) return values.back();
  if (virtual_index < 0) return values.front();
  const double previous = std::floor(virtual_index);
  const double t = virtual_index - previous;
  const double a = values[size_t(previous)], b = values[size_t(previous) + 1];
  // numpy's _lerp: the form that is exact at each end.
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1 - t) : a + diff * t;
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// np.nanmin / np.nanmax over a trial's reports; NaN when all are NaN.
double best_intermediate(const Trial& trial, Direction d) {
  double best = kNaN;
  for (const auto& [step, v] : trial.intermediate) {
    if (std::isnan(v)) continue;
    if (std::isnan(best) || (d == Direction::minimize ? v < best : v > best)) best = v;
  }
  return best;
}

bool first_in_interval(int64_t step, const Trial& trial, int64_t warmup, int64_t interval) {
  const int64_t nearest_lower = (step - warmup) / interval * interval + warmup;
  int64_t second_last = -1;
  for (const auto& [s, v] : trial.intermediate)
    if (s > second_last && s != step) second_last = s;
  return second_last < nearest_lower;
}

class NopPruner final : public Pruner {
 public:
  bool prune(const std::vector<Trial>&, const Trial&, Direction,
             std::map<std::string, double>*) override {
    return false;
  }
};

class PercentilePruner final : public Pruner {
 public:
  explicit PercentilePruner(const PrunerSettings& s) : s_(s) {}
  bool prune(const std::vector<Trial>& trials, const Trial& trial, Direction direction,
             std::map<std::string, double>*) override {
    int64_t n_complete = 0;
    for (const auto& t : trials) n_complete += t.state == TrialState::complete;
    if (n_complete == 0 || n_complete < s_.n_startup_trials) return false;
    const std::optional<int64_t> last = trial.last_step();
    if (!last) return false;
    const int64_t step = *last;
    if (step < s_.n_warmup_steps) return false;
    if (!first_in_interval(step, trial, s_.n_warmup_steps, s_.interval_steps)) return false;
    const double best = best_intermediate(trial, direction);
    if (std::isnan(best)) return true;
    std::vector<double> at_step;
    for (const auto& t : trials) {
      if (t.state != TrialState::complete) continue;
      auto it = t.intermediate.find(step);
      if (it != t.intermediate.end()) at_step.push_back(it->second);
    }
    if (int64_t(at_step.size()) < s_.n_min_trials) return false;
    const double q = direction == Direction::maximize ? 100 - s_.percentile : s_.percentile;
    const double p = nan_percentile(std::move(at_step), q);
    if (std::isnan(p)) return false;
    return direction == Direction::maximize ? best < p : best > p;
  }

 private:
  PrunerSettings s_;
};

std::string rung_key(int64_t rung) { return "completed_rung_" + std::to_string(rung); }

class SuccessiveHalvingPruner final : public Pruner {
 public:
  explicit SuccessiveHalvingPruner(const PrunerSettings& s) : s_(s) {
    if (s.min_resource > 0) min_resource_ = s.min_resource;
  }
  bool prune(const std::vector<Trial>& trials, const Trial& trial, Direction direction,
             std::map<std::string, double>* set_attrs) override {
    const std::optional<int64_t> last = trial.last_step();
    if (!last) return false;
    const int64_t step = *last;
    int64_t rung = 0;
    while (trial.attrs.count(rung_key(rung))) ++rung;
    const double value = trial.intermediate.at(step);
    for (;;) {
      if (!min_resource_) {
        // Optuna's "auto": a hundredth of the longest complete trial, at least 1.
        std::optional<int64_t> longest;
        for (const auto& t : trials)
          if (t.state == TrialState::complete && t.last_step())
            longest = std::max(longest.value_or(*t.last_step()), *t.last_step());
        if (!longest) return false;
        min_resource_ = std::max<int64_t>(*longest / 100, 1);
      }
      double promotion_step = double(*min_resource_);
      for (int64_t k = 0; k < s_.min_early_stopping_rate + rung; ++k)
        promotion_step *= double(s_.reduction_factor);
      if (double(step) < promotion_step) return false;
      if (std::isnan(value)) return true;
      const std::string key = rung_key(rung);
      if (set_attrs) (*set_attrs)[key] = value;
      std::vector<double> competing;
      for (const auto& t : trials) {
        auto it = t.attrs.find(key);
        if (it != t.attrs.end()) competing.push_back(it->second);
      }
      competing.push_back(value);
      if (int64_t(competing.size()) <= s_.bootstrap_count) return true;
      int64_t idx = int64_t(competing.size()) / s_.reduction_factor - 1;
      if (idx == -1) idx = 0;
      std::sort(competing.begin(), competing.end());
      const bool promotable = direction == Direction::maximize
                                  ? value >= competing[competing.size() - 1 - size_t(idx)]
                                  : value <= competing[size_t(idx)];
      if (!promotable) return true;
      ++rung;
    }
  }

 private:
  PrunerSettings s_;
  std::optional<int64_t> min_resource_;
};

}  // namespace

std::unique_ptr<Pruner> make_pruner(const PrunerSettings& s) {
  if (s.kind == "none") return std::make_unique<NopPruner>();
  if (s.kind == "median" || s.kind == "percentile") return std::make_unique<PercentilePruner>(s);
  if (s.kind == "successive_halving") return std::make_unique<SuccessiveHalvingPruner>(s);
  fail("unknown pruner '", s.kind, "'");
}

}  // namespace seqforge::tune
