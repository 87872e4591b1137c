#pragma once
// A run's report: one self-contained HTML page (inline SVG and CSS, no scripts, no network).
#include <string>

namespace seqforge {

// The page for `run_dir`, from its metrics.jsonl (curves per epoch: losses, validation metrics,
// samples/s, learning rate, CPU and memory), config.resolved.yaml and, when present,
// val_predictions.csv (forecasting: predicted against actual values; classification: a
// confusion matrix). The saved model's epoch is the one model.safetensors records (a kill may
// come between an epoch's line and its checkpoint's write); with `while_training`, the run's own
// report after an epoch whose checkpoint may still be being written, the lines'.
std::string render_run_report(const std::string& run_dir, bool while_training = false);

// Writes render_run_report(run_dir, while_training) to run_dir/report.html atomically; returns
// that path.
std::string write_run_report(const std::string& run_dir, bool while_training = false);

// A direct multi-step forecast's metric of one step ahead (val_mae_h3, test_rmse_h12): the step;
// else 0.
int metric_step(const std::string& key);
// Metric names in reading order: by name, a metric's steps ahead in their numeric order.
bool metric_order(const std::string& a, const std::string& b);

}  // namespace seqforge
