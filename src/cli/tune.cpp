#include "tune.hpp"

#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>

#include "seqforge/core/error.hpp"
#include "seqforge/train/trainer.hpp"
#include "seqforge/tune/study.hpp"
#include "validators.hpp"

namespace seqforge::cli {

struct TuneCli {
  CLI::App* app = nullptr;
  tune::TuneCommand cmd;
  std::string report, export_format;
};

TuneCli* add_tune(CLI::App& app) {
  static TuneCli t;
  t.app = app.add_subcommand(
      "tune",
      "Search hyperparameters: a config's tune: section, trials pruned per epoch, a "
      "study database several workers can share");
  t.app->add_option("config", t.cmd.config, "config file (YAML) with a tune: section");
  t.app->add_option("overrides", t.cmd.overrides, "key.path=value overrides for every trial");
  t.app
      ->add_option("--study", t.cmd.study,
                   "study database: a SQLite file (default runs/<name>/study.db) or "
                   "postgresql://user@host[:port]/db")
      ->check(a_path());
  t.app->add_option("--name", t.cmd.name, "study name (default: tune.name or the config's name)");
  t.app
      ->add_option("--n-trials", t.cmd.n_trials,
                   "trials the study should have in total (default tune.n_trials)")
      ->check(whole_number(1, INT64_MAX));
  t.app->add_option("--timeout", t.cmd.timeout, "seconds after which no new trial starts");
  t.app
      ->add_option("--report", t.report,
                   "print the trials of this study (file or URL) and write its HTML report")
      ->check(a_path());
  t.app->add_option("--html", t.cmd.report_html, "with --report: where to write the HTML page")
      ->check(a_path());
  t.app
      ->add_option("--enqueue", t.cmd.enqueue,
                   "'key=value,...': a trial with these fixed parameters runs first (a "
                   "categorical by its choice), as optuna's enqueue_trial; repeatable")
      ->allow_extra_args(false);
  t.app->add_option("--export", t.export_format,
                    "csv or json: print every trial of the study given in place of CONFIG (file "
                    "or URL) to stdout");
  return &t;
}

bool tune_parsed(const TuneCli* t) { return t->app->parsed(); }

int run_tune(TuneCli* t) {
  if (!t->export_format.empty()) {
    if (!t->report.empty()) fail("tune: give --export or --report, not both");
    if (t->cmd.config.empty()) fail("tune: --export ", t->export_format, " needs a STUDY");
    if (!t->cmd.enqueue.empty()) fail("tune: --enqueue needs a CONFIG, not --export");
    return tune::run_tune_export(t->cmd.config, t->cmd.name, t->export_format, std::cout);
  }
  if (!t->report.empty()) {
    if (!t->cmd.config.empty())
      fail("tune: --report takes a study, not a config ('", t->cmd.config, "')");
    check_output_file(t->cmd.report_html, "tune: --html", {{t->report, "the study"}});
    return tune::run_tune_report(t->report, t->cmd.name, t->cmd.report_html, std::cout);
  }
  if (t->app->count("--timeout") && !(t->cmd.timeout > 0 && std::isfinite(t->cmd.timeout)))
    fail("tune: --timeout must be a positive, finite number of seconds, got ", t->cmd.timeout);
  std::error_code ec;
  t->cmd.executable = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  return tune::run_tune(t->cmd, std::cout);
}

}  // namespace seqforge::cli
