#pragma once
// `seqforge tune`: registered on the app before parsing, run after.
#include <CLI/CLI.hpp>

namespace seqforge::cli {

struct TuneCli;
TuneCli* add_tune(CLI::App& app);  // owned by the app's lifetime (static storage)
bool tune_parsed(const TuneCli* t);
int run_tune(TuneCli* t);

}  // namespace seqforge::cli
