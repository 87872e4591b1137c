#pragma once
// Checks of command-line values that several subcommands share.
#include <CLI/CLI.hpp>
#include <string>

namespace seqforge::cli {

// A file or folder named on the command line: an empty value names none (a script's unset
// variable), and is refused rather than read as "not given".
inline CLI::Validator a_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "an empty path" : ""; }, "PATH");
}

}  // namespace seqforge::cli
