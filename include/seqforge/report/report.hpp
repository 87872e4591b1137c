#pragma once
// A run's report: one self-contained HTML page (inline SVG and CSS, no scripts, no network).
#include <string>

namespace seqforge {

// The page for `run_dir`, from its metrics.jsonl (curves per epoch: losses, validation metrics,
// samples/s, learning rate, CPU and memory), config.resolved.yaml and, when present,
// val_predictions.csv (forecasting: predicted against actual values; classification: a
// confusion matrix).
std::string render_run_report(const std::string& run_dir);

// Writes render_run_report(run_dir) to run_dir/report.html atomically; returns that path.
std::string write_run_report(const std::string& run_dir);

}  // namespace seqforge
