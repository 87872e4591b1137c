#pragma once
// The study driver behind `seqforge tune`: workers claim trials from the storage, sample their
// parameters, train, report the metric every epoch and stop when the pruner says so.
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "seqforge/core/error.hpp"
#include "seqforge/tune/pruners.hpp"
#include "seqforge/tune/samplers.hpp"
#include "seqforge/tune/space.hpp"
#include "seqforge/tune/storage.hpp"

namespace seqforge::tune {

// What a trial's objective sees: its number and parameters, and a report call that returns false
// when the trial should stop (pruned).
class TrialContext {
 public:
  virtual ~TrialContext() = default;
  virtual int64_t number() const = 0;
  virtual const std::map<std::string, double>& params() const = 0;
  virtual bool report(int64_t step, double value) = 0;
};

// Thrown by an objective when no trial of the study can succeed (e.g. the metric does not exist):
// the trial is marked failed and the study stops instead of failing every trial in turn.
class StudyError : public Error {
 public:
  using Error::Error;
};

// Runs a trial; throws on failure. Returns the number of epochs run.
using Objective = std::function<int64_t(TrialContext&)>;

struct OptimizeOptions {
  int64_t n_trials = 20;     // the study's total (complete, pruned and running)
  double timeout = 0;        // seconds; 0: none. No trial starts after it.
  int64_t max_failures = 0;  // this worker gives up after so many failed trials; 0: n_trials
};

struct OptimizeStats {
  int64_t trials = 0, complete = 0, pruned = 0, failed = 0;
  int64_t discarded = 0;                 // trials another worker failed while this one ran them
  std::string last_failure;              // the message of the last trial that failed
  std::vector<double> overhead_seconds;  // per trial: everything but the objective's training
};

class Study {
 public:
  Study(std::unique_ptr<Storage> storage, TuneSettings settings, std::string storage_where);
  // Runs trials until the study has n_trials or the timeout passes. One line per trial to
  // `console`.
  OptimizeStats optimize(const Objective& objective, const OptimizeOptions& options,
                         std::ostream& console);
  std::vector<Trial> trials() { return storage_->trials(); }
  // A waiting trial with these fixed parameters (checked against the space); its number.
  int64_t enqueue(const std::map<std::string, std::string>& fixed) {
    return storage_->enqueue(fixed);
  }
  const TuneSettings& settings() const { return settings_; }

  // Time spent in the objective's training (excluded from the overhead); set by the objective.
  void add_training_seconds(double s) { training_seconds_ += s; }

 private:
  std::unique_ptr<Storage> storage_;
  TuneSettings settings_;
  std::string where_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<Pruner> pruner_;
  double training_seconds_ = 0;
};

// A finished (not pruned) trial's value under tune.value; nullopt with `why` set when there is
// none: no report, or the metric was not finite at the epoch that counts (the trial fails).
std::optional<double> trial_value(const Trial& trial, const TuneSettings& settings,
                                  std::string* why);
// The best complete trial; nullopt if none.
std::optional<Trial> best_trial(const std::vector<Trial>& trials, Direction direction);
// A text table: number, state, value, parameters, epochs, time.
std::string trials_table(const std::vector<Trial>& trials, const TuneSettings* settings);
// A self-contained HTML page: the table, the optimisation history and each parameter's effect;
// `metric` ("" where unknown) names the value.
std::string html_report(const std::string& study_name, const std::string& metric,
                        const std::vector<Trial>& trials, Direction direction,
                        const std::vector<Param>& space);

// `seqforge tune CONFIG`: the study in `study` (a SQLite path or postgresql:// URL; default
// runs/<name>/study.db), trials under runs/<name>/trial-N. Returns the process exit code.
struct TuneCommand {
  std::string config, study, name, report_html;
  std::vector<std::string> overrides;
  std::vector<std::string> enqueue;  // "key=value,key=value": waiting trials with fixed params
  int64_t n_trials = -1;
  double timeout = -1;
  std::string executable;  // the seqforge command, for more workers (tune.trials_per_device)
};
int run_tune(const TuneCommand& cmd, std::ostream& console);
// `seqforge tune --report STUDY`: prints the table, writes the HTML page (default: next to a
// SQLite study file, report.html).
int run_tune_report(const std::string& study, const std::string& name, const std::string& html,
                    std::ostream& console);
// `seqforge tune --export csv|json STUDY`: every trial (number, state, value, datetimes, params
// by value, intermediate values, seqforge's attributes) to `out`.
int run_tune_export(const std::string& study, const std::string& name, const std::string& format,
                    std::ostream& out);
// "optim.lr=0.01,optim.kind=sgd" -> {optim.lr: 0.01, optim.kind: sgd}; throws on a malformed item.
std::map<std::string, std::string> parse_enqueue(const std::string& spec);

}  // namespace seqforge::tune
