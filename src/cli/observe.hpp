#pragma once
// `seqforge report` and `seqforge diagnose`: registered on the app before parsing, run after.
#include <CLI/CLI.hpp>

namespace seqforge::cli {

CLI::App* add_report(CLI::App& app);
int run_report();

CLI::App* add_diagnose(CLI::App& app);
int run_diagnose();

}  // namespace seqforge::cli
