#include "loop.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "seqforge/core/error.hpp"

namespace seqforge {

LoopSettings LoopSettings::from(const Config& c, const Task& task) {
  LoopSettings s;
  auto bad = [&](const char* key, const auto& what, const auto& got) {
    fail(c.origin(key), ": ", key, " must be ", what, ", got ", got);
  };
  s.monitor = c.str("train.early_stopping.monitor");
  if (const auto names = metric_names(task);
      std::find(names.begin(), names.end(), s.monitor) == names.end()) {
    std::string list;
    for (const auto& name : names) list += (list.empty() ? "" : ", ") + name;
    fail(c.origin("train.early_stopping.monitor"), ": train.early_stopping.monitor: '", s.monitor,
         "' is not a metric of this task (", list, ")");
  }
  if (const std::string why = metric_absent(task, s.monitor); !why.empty())
    fail(c.origin("train.early_stopping.monitor"), ": train.early_stopping.monitor is ", s.monitor,
         ", which has no value on this data: ", why);
  if (task.split().val.empty() && s.monitor.rfind("val_", 0) == 0)
    fail(c.origin("train.early_stopping.monitor"), ": train.early_stopping.monitor is ", s.monitor,
         " but data.split.val is 0 (no validation): monitor train_loss, or give a validation "
         "share");
  s.batch_size = c.integer("train.batch_size");
  s.epochs = c.integer("train.epochs");
  s.micro_batch = forward_rows(c);
  s.dist_timeout = c.number("dist.timeout_seconds");
  s.bucket_mb = c.number("dist.bucket_mb");
  if (!(s.dist_timeout > 0)) bad("dist.timeout_seconds", "positive", s.dist_timeout);
  if (!(s.bucket_mb > 0)) bad("dist.bucket_mb", "positive", s.bucket_mb);
  s.mode = c.str("train.early_stopping.mode");
  if (s.mode != "min" && s.mode != "max")
    fail(c.origin("train.early_stopping.mode"),
         ": train.early_stopping.mode must be min or max, got '", s.mode, "'");
  s.save = c.str("train.save");          // a word Config checked
  s.schedule = c.str("train.schedule");  // a word Config checked
  s.max_batches = c.integer("train.max_batches");
  s.warmup_steps = c.integer("train.warmup_steps");
  s.gamma = c.number("train.gamma");
  s.step_epochs = c.integer("train.step_epochs");
  s.plateau_patience = c.integer("train.plateau_patience");
  s.min_delta = c.number("train.early_stopping.min_delta");
  s.patience = c.integer("train.early_stopping.patience");
  s.save_every = c.integer("train.save_every");
  s.clip = c.number("train.clip_grad_norm");
  s.freeze_modules = c.list("train.freeze_modules");
  s.freeze_epochs = c.integer("train.freeze_epochs");
  s.progress_seconds = c.number("train.progress_seconds");
  s.test_after = c.boolean("train.test_after");
  s.stateful = c.boolean("train.stateful");
  const auto at_least = [&](const char* key, double value, double lo, bool open) {
    if (!(open ? value > lo : value >= lo) || !std::isfinite(value))
      fail(c.origin(key), ": ", key, " must be a finite number ", open ? "> " : ">= ", lo, ", got ",
           value);
  };
  at_least("train.clip_grad_norm", s.clip, 0, false);  // 0: no clipping
  at_least("train.gamma", s.gamma, 0, true);
  if (s.schedule == "plateau" && !(s.gamma < 1))  // as Keras and PyTorch: a reduction
    fail(c.origin("train.gamma"),
         ": train.gamma must be below 1 with train.schedule plateau (the "
         "factor that lowers the learning rate), got ",
         s.gamma);
  at_least("train.early_stopping.min_delta", s.min_delta, 0, false);
  at_least("train.progress_seconds", s.progress_seconds, 0, false);
  if (s.stateful && c.str("model.family") != "recurrent")
    fail(c.origin("train.stateful"), ": train.stateful carries recurrent states; model.family ",
         c.str("model.family"), " has none");
  if (s.stateful && s.micro_batch < s.batch_size)
    fail(c.origin("train.micro_batch_size"),
         ": train.micro_batch_size splits a batch's streams, which train.stateful carries whole "
         "from batch to batch: lower train.batch_size instead");
  if (s.stateful && c.boolean("model.bidirectional"))
    fail(c.origin("train.stateful"),
         ": train.stateful needs a unidirectional model (model.bidirectional: false)");
  if (s.stateful && c.str("data.split.mode") != "time")
    fail(c.source(),
         ": train.stateful needs data.split.mode: time (streams follow the data's order)");
  return s;
}

double learning_rate(const LoopSettings& s, double base, int64_t step, int64_t epoch,
                     int64_t total_steps, double lr_factor) {
  if (step < s.warmup_steps) return base * double(step + 1) / double(s.warmup_steps);
  if (s.schedule == "step")
    return base * std::pow(s.gamma, double((epoch - 1) / std::max<int64_t>(1, s.step_epochs)));
  if (s.schedule == "cosine") {
    const double p =
        double(step - s.warmup_steps) / double(std::max<int64_t>(1, total_steps - s.warmup_steps));
    return 0.5 * base * (1.0 + std::cos(M_PI * std::min(1.0, p)));
  }
  return base * lr_factor;
}

}  // namespace seqforge
