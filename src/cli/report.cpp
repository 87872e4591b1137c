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
  if (const int64_t line = read_metrics_log(metrics).cut_short)
    std::printf("note: %s:%lld is cut short (being written, or a kill): left out\n",
                metrics.c_str(), static_cast<long long>(line));
  std::printf("wrote %s\n", written.c_str());
  return 0;
}

}  // namespace seqforge::cli
