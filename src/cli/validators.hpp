#pragma once
// Checks of command-line values that several subcommands share.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <string>

namespace seqforge::cli {

// A file or folder named on the command line: an empty value names none (a script's unset
// variable), and is refused rather than read as "not given".
inline CLI::Validator a_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "an empty path" : ""; }, "PATH");
}

// Checks an integer option's text before CLI11 converts it, which wraps a number past 64 bits
// (18446744073709551617 became 1) rather than refusing it.
inline CLI::Validator whole_number(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec == std::errc() && end == text.data() + text.size() && v >= min && v <= max)
          return "";
        const std::string range =
            max == INT64_MAX ? (min == INT64_MIN ? "" : " from " + std::to_string(min) + " up")
                             : " from " + std::to_string(min) + " to " + std::to_string(max);
        return "'" + text + "' is not a whole number" + range;
      },
      "INT");
}

}  // namespace seqforge::cli
