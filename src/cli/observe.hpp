#pragma once
// `seqforge report`, `diagnose`, `tokenize` and `tokenizer`: registered on the app before parsing,
// run after.
#include <CLI/CLI.hpp>

namespace seqforge::cli {

CLI::App* add_report(CLI::App& app);
int run_report();

CLI::App* add_diagnose(CLI::App& app);
int run_diagnose();

CLI::App* add_tokenize(CLI::App& app);
int run_tokenize();
CLI::App* add_tokenizer(CLI::App& app);
int run_tokenizer();

}  // namespace seqforge::cli
