#include "report/metrics_log.hpp"

#include <cmath>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

namespace {

// A value as JSON text, fit for one line of an error message.
std::string shown(const nlohmann::json& value) { return io::printable(value.dump(), 60); }

}  // namespace

MetricsLog read_metrics_log(const std::string& path) {
  const std::string text = io::read_file(path);
  MetricsLog log;
  size_t begin = 0;
  for (int64_t line = 1; begin < text.size(); ++line) {
    const size_t end = text.find('\n', begin);
    const auto where = [&] { return path + ":" + std::to_string(line) + ": "; };
    if (end == std::string::npos) {  // being written, or cut short by a kill
      const size_t first = text.find_first_not_of(" \t\r", begin);
      if (first == std::string::npos) break;
      if (text[first] != '{') fail(where(), "not a JSON object, as the trainer writes a line");
      log.cut_short = line;
      break;
    }
    const std::string_view row(text.data() + begin, end - begin);
    begin = end + 1;
    if (row.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json j = nlohmann::json::parse(row, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) fail(where(), "not a JSON object, as the trainer writes a line");
    const bool test = j.contains("split");
    if (test && j["split"] != "test")
      fail(where(), "\"split\" is ", shown(j["split"]), ", not \"test\"");
    if (!test) {
      const auto e = j.find("epoch");
      if (e == j.end())
        fail(where(), "neither an epoch's line (no \"epoch\") nor the test split's");
      const double epoch = e->is_number() ? e->get<double>() : 0;
      const double before = log.epochs.empty() ? 0 : log.epochs.back()["epoch"].get<double>();
      if (!(epoch >= 1 && epoch < 1e15 && std::floor(epoch) == epoch))
        fail(where(), "\"epoch\" is ", shown(*e), ", not a whole number of 1 or more");
      if (epoch <= before)
        fail(where(), "epoch ", shown(*e), " follows epoch ", before,
             ": a line out of order, or two runs' lines in one file");
    }
    for (const auto& [key, value] : j.items()) {
      const bool fits = key == "split"        ? true
                        : key == "checkpoint" ? value.is_boolean()
                        : key == "stop"       ? value.is_string() && !test
                                              : value.is_number() || value.is_null();
      if (!fits)
        fail(where(), "\"", io::printable(key, 60), "\" is ", shown(value), ", not ",
             key == "checkpoint" ? "true or false"
             : key == "stop"     ? "a text (why the run ended after the epoch)"
                                 : "a number");
    }
    (test ? log.test : log.epochs.emplace_back()) = std::move(j);
  }
  return log;
}

// How the run ended, from its last epoch's "stop": a run without one is not over (a signal,
// a kill, or still training); one of an older seqforge without it that ran its test split is.
std::string run_end(const MetricsLog& log) {
  if (log.epochs.empty()) return "no epoch finished";
  const nlohmann::json& last = log.epochs.back();
  const std::string after = " after epoch " + last["epoch"].dump();
  const std::string stop = last.value("stop", "");
  if (stop == "epochs") return "finished";
  if (stop == "early_stopping") return "stopped early" + after + " (train.early_stopping)";
  if (stop == "pruned") return "pruned by the study" + after;
  if (stop == "on_epoch") return "stopped by on_epoch" + after;
  if (!stop.empty()) return "ended" + after + " (" + stop + ")";
  if (log.test.is_object()) return "finished";
  return "not finished" + after +
         ": still training, or stopped by a signal, a kill or an error (seqforge train "
         "--resume continues it)";
}

}  // namespace seqforge
