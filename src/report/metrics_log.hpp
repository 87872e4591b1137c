#pragma once
// A run's metrics.jsonl read back: a line per epoch (its metrics, timings and resources) and the
// test split's evaluation after training, each checked against what the trainer writes.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace seqforge {

struct MetricsLog {
  std::vector<nlohmann::json> epochs;  // in epoch order
  nlohmann::json test;                 // null where the run has no test line
  int64_t cut_short = 0;               // the line number of a last line left out, or 0
};

// Reads `path`: every line a JSON object, either an epoch's (a whole "epoch" above the line
// before's, numbers for its values, null for a NaN, true or false for "checkpoint", a text for
// "stop": why the run ended after it, "epochs", "early_stopping", "pruned" or "on_epoch") or the
// test split's ("split": "test", numbers for the rest). A last line without its newline that begins
// as such a line does is one being written or cut short by a kill, and is left out (`cut_short`).
// Anything else throws, naming the file and line.
MetricsLog read_metrics_log(const std::string& path);

// How the run ended: "finished", "stopped early after epoch 7 (train.early_stopping)", "pruned by
// the study after epoch 2", ... or "not finished after epoch 3: ..." where no line says it ended.
std::string run_end(const MetricsLog& log);

}  // namespace seqforge
