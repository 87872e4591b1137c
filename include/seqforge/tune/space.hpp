#pragma once
// The search space: config keys and their distributions, read from a config's `tune:` section,
// with the study's other settings (direction, metric, sampler, pruner).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "seqforge/tune/trial.hpp"

namespace YAML {
class Node;
}

namespace seqforge::tune {

struct Param {
  enum class Kind { floating, integer, categorical };
  std::string name;  // a config key, "optim.lr"
  Kind kind = Kind::floating;
  double low = 0, high = 0, step = 0;  // step 0: continuous (float); int step defaults to 1
  bool log = false;
  std::vector<std::string> choices;  // categorical, as YAML text
  std::vector<double> grid;          // optional values for the grid sampler (float, int)
  std::string where;                 // file:line of its entry, for errors

  // The override value for a config ("0.0012", "32", a choice's text).
  std::string text(double value) const;
  // Clamps to the range and rounds to the step (int, stepped float).
  double snap(double value) const;
  bool contains(double value) const;
};

struct PrunerSettings {
  std::string kind = "median";  // median, percentile, successive_halving, none
  double percentile = 50;
  int64_t n_startup_trials = 5, n_warmup_steps = 0, interval_steps = 1, n_min_trials = 1;
  int64_t min_resource = 0;  // successive halving; 0: estimated as Optuna's "auto"
  int64_t reduction_factor = 4, min_early_stopping_rate = 0, bootstrap_count = 0;
};

struct SamplerSettings {
  std::string kind = "tpe";  // tpe, random, grid
  uint64_t seed = 0;
  int64_t n_startup_trials = 10, n_ei_candidates = 24;
};

struct TuneSettings {
  std::string source;  // the config file
  std::string name;    // study name (default: the config file's stem)
  Direction direction = Direction::minimize;
  std::string metric;  // default: train.early_stopping.monitor
  // A trial's value: "best" (the epoch whose checkpoint the trainer keeps: the best by `metric`,
  // an improvement counting only beyond min_delta, as early stopping counts it) or "last" (the
  // trial's last epoch, whose checkpoint is kept).
  std::string value = "best";
  double min_delta = 0;  // train.early_stopping.min_delta, set by the driver
  int64_t n_trials = 20;
  double timeout = 0;  // seconds; 0: none
  double heartbeat_interval = 10, grace_period = 60;
  // Trials trained at once on one device, each in its own worker process; auto: as many as the
  // GPU's memory holds after one trial (1 on a CPU).
  int64_t trials_per_device = 1;
  bool trials_per_device_auto = false;
  SamplerSettings sampler;
  PrunerSettings pruner;
  std::vector<Param> space;
  // The config every trial starts from, but the searched keys and where it runs (key -> value
  // as text, set by the driver): a study's trials are comparable only when it is the same.
  std::map<std::string, std::string> trial_config;
  // Settings the chosen sampler or pruner has no use for (another one's), said at start-up.
  std::vector<std::string> unused;

  const Param& param(const std::string& name) const;
  const char* direction_name() const { return tune::direction_name(direction); }
  // Identifies what makes trials comparable: direction, metric and the space.
  std::string fingerprint() const;
};

// The fields of a parameter in tune.space: type, low, high, log, step, choices, grid.
const std::vector<std::string>& param_fields();

// Reads the `tune:` section of a config file (YAML text from `source`); every key and value is
// checked, errors name source:line (source alone without `lines`: YAML rewritten by overrides,
// whose lines are not the file's) and the key. `default_metric` and `default_direction` are used
// when neither is given (a tune.metric alone takes the direction it is better in); the study is
// named after `file` (default: source) unless tune.name says otherwise.
TuneSettings parse_tune_settings(const std::string& yaml, const std::string& source,
                                 const std::string& default_metric,
                                 Direction default_direction = Direction::minimize,
                                 const std::string& file = "", bool lines = true);

// The space as JSON (stored with the study, so reports can name categorical choices) and back.
std::string space_json(const std::vector<Param>& space);
std::vector<Param> space_from_json(const std::string& json);

// The overrides that turn a trial's parameters into a config.
std::vector<std::string> param_overrides(const TuneSettings& s,
                                         const std::map<std::string, double>& params);
// "model.hidden=32 optim.lr=0.0012"
std::string describe_params(const TuneSettings& s, const std::map<std::string, double>& params);

}  // namespace seqforge::tune
