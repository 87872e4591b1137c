// `seqforge report RUN_DIR`: (re)writes the run's report.html.
#include "seqforge/report/report.hpp"

#include <cstdio>
#include <string>

#include "observe.hpp"

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
  std::printf("wrote %s\n", write_run_report(report_run).c_str());
  return 0;
}

}  // namespace seqforge::cli
