// `seqforge report RUN_DIR`: (re)writes the run's report.html.
#include "seqforge/report/report.hpp"

#include <cstdio>
#include <filesystem>
#include <string>

#include "observe.hpp"
#include "report/metrics_log.hpp"

namespace seqforge::cli {

namespace {
std::string report_run;
}

CLI::App* add_report(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "report", "Write a run's report.html (curves, predictions, confusion matrix) again");
  cmd->add_option("run", report_run, "run directory")->required();
  return cmd;
}

int run_report() {
  const std::string metrics = (std::filesystem::path(report_run) / "metrics.jsonl").string();
  const std::string written = write_run_report(report_run);
  const MetricsLog log = read_metrics_log(metrics);
  if (log.cut_short)
    std::printf("note: %s:%lld is cut short (being written, or a kill): left out\n",
                metrics.c_str(), static_cast<long long>(log.cut_short));
  if (log.epochs.empty())
    std::printf(
        "note: %s holds no epoch yet (a run in its first epoch, or stopped in it): the "
        "report has no curves\n",
        metrics.c_str());
  if (const std::string end = run_end(log); end.starts_with("not finished"))
    std::printf("note: the run is %s\n", end.c_str());
  std::printf("wrote %s\n", written.c_str());
  return 0;
}

}  // namespace seqforge::cli
