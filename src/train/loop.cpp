#include "loop.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "seqforge/core/error.hpp"

namespace seqforge {

namespace {

std::string exact(double x) {  // JSON has no infinity; "%.17g" round-trips
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

}  // namespace

LoopSettings LoopSettings::from(const Config& c, const Task& task) {
  LoopSettings s;
  auto bad = [&](const char* key, const auto& what, const auto& got) {
    fail(c.source(), ": ", key, " must be ", what, ", got ", got);
  };
  s.monitor = c.str("train.early_stopping.monitor");
  if (const auto names = metric_names(task.kind);
      std::find(names.begin(), names.end(), s.monitor) == names.end()) {
    std::string list;
    for (const auto& name : names) list += " " + name;
    fail(c.origin("train.early_stopping.monitor"), ": train.early_stopping.monitor: '", s.monitor,
         "' is not a metric of this task (", list, " )");
  }
  if (task.split().val.empty() && s.monitor.rfind("val_", 0) == 0)
    fail(c.origin("train.early_stopping.monitor"), ": train.early_stopping.monitor is ", s.monitor,
         " but data.split.val is 0 (no validation): monitor train_loss, or give a validation "
         "share");
  s.batch_size = c.integer("train.batch_size");
  s.epochs = c.integer("train.epochs");
  s.dist_timeout = c.number("dist.timeout_seconds");
  s.bucket_mb = c.number("dist.bucket_mb");
  if (!(s.dist_timeout > 0)) bad("dist.timeout_seconds", "positive", s.dist_timeout);
  if (!(s.bucket_mb > 0)) bad("dist.bucket_mb", "positive", s.bucket_mb);
  s.mode = c.str("train.early_stopping.mode");
  if (s.mode != "min" && s.mode != "max")
    fail(c.origin("train.early_stopping.mode"),
         ": train.early_stopping.mode must be min or max, got '", s.mode, "'");
  s.save = c.str("train.save");
  if (s.save != "best" && s.save != "last" && s.save != "every_n")
    fail(c.origin("train.save"), ": train.save must be best, last or every_n, got '", s.save, "'");
  s.schedule = c.str("train.schedule");
  if (s.schedule != "constant" && s.schedule != "step" && s.schedule != "cosine" &&
      s.schedule != "plateau")
    fail(c.origin("train.schedule"),
         ": train.schedule must be constant, step, cosine or plateau, got '", s.schedule, "'");
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
  if (s.stateful && c.str("model.family") != "recurrent")
    fail(c.origin("train.stateful"), ": train.stateful carries recurrent states; model.family ",
         c.str("model.family"), " has none");
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

LoopState LoopState::start(const LoopSettings& s) {
  LoopState st;
  st.best = st.plateau_best = s.mode == "min" ? INFINITY : -INFINITY;
  return st;
}

std::string LoopState::to_json() const {
  nlohmann::json j = {{"epoch", epochs_done},
                      {"step", step},
                      {"optimizer_steps", optimizer_steps},
                      {"param_steps", param_steps},
                      {"best", exact(best)},
                      {"since_best", since_best},
                      {"plateau_best", exact(plateau_best)},
                      {"since_plateau", since_plateau},
                      {"lr_factor", exact(lr_factor)}};
  if (in_epoch) {
    j["in_epoch"] = true;
    j["batch"] = batch;
    j["loss_sum"] = exact(loss_sum);
    j["seen"] = exact(seen);
  }
  return j.dump();
}

LoopState LoopState::from_json(const std::string& text, const std::string& source) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) fail(source, ": seqforge.loop is not a JSON object");
  // Counts must be JSON integers: a float converted to int64_t could be anything.
  auto count = [&](const char* key) {
    const auto& v = j.at(key);
    if (!v.is_number_integer())
      fail(source, ": seqforge.loop: '", key, "' is ", v.dump(), ", not an integer");
    return v.get<int64_t>();
  };
  auto real = [&](const char* key) {
    const std::string t = j.at(key).get<std::string>();
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size())
      fail(source, ": seqforge.loop: '", key, "' is '", t, "', not a number");
    return v;
  };
  LoopState s;
  try {
    s.epochs_done = count("epoch");
    s.step = count("step");
    s.optimizer_steps = count("optimizer_steps");
    for (const auto& v : j.at("param_steps")) {
      if (!v.is_number_integer())
        fail(source, ": seqforge.loop: 'param_steps' holds ", v.dump(), ", not an integer");
      s.param_steps.push_back(v.get<int64_t>());
    }
    s.best = real("best");
    s.since_best = count("since_best");
    s.plateau_best = real("plateau_best");
    s.since_plateau = count("since_plateau");
    s.lr_factor = real("lr_factor");
    s.in_epoch = j.value("in_epoch", false);
    if (s.in_epoch) {
      s.batch = count("batch");
      s.loss_sum = real("loss_sum");
      s.seen = real("seen");
    }
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": seqforge.loop: ", e.what());
  }
  return s;
}

void LoopState::check(const std::string& source, size_t parameters,
                      int64_t batches_per_epoch) const {
  auto bad = [&](const char* key, const auto& value, const char* expected) {
    fail(source, ": seqforge.loop: '", key, "' is ", value, "; expected ", expected,
         " (the training state is damaged or not this run's)");
  };
  for (const auto& [key, v] :
       {std::pair{"epoch", epochs_done}, std::pair{"step", step},
        std::pair{"optimizer_steps", optimizer_steps}, std::pair{"since_best", since_best},
        std::pair{"since_plateau", since_plateau}})
    if (v < 0) bad(key, v, "a count of 0 or more");
  if (in_epoch && (batch < 0 || batch >= batches_per_epoch))
    fail(source, ": seqforge.loop: 'batch' is ", batch, "; an epoch now has ", batches_per_epoch,
         " batches (train.batch_size or train.max_batches changed?)");
  if (param_steps.size() != parameters)
    fail(source, ": seqforge.loop: 'param_steps' counts ", param_steps.size(),
         " parameters, the model has ", parameters, " (a run of another architecture?)");
  for (int64_t v : param_steps)
    if (v < 0 || v > optimizer_steps)
      bad("param_steps", v, "a count between 0 and optimizer_steps");
  if (optimizer_steps > step) bad("optimizer_steps", optimizer_steps, "at most 'step'");
  // Every finished epoch took a step at least, as did each batch of the epoch under way.
  const int64_t done = in_epoch ? batch : 0;
  if (step < epochs_done || step - epochs_done < done)
    bad("step", step, "at least one per finished epoch and batch");
  if (since_best > epochs_done) bad("since_best", since_best, "at most 'epoch'");
  if (since_plateau > epochs_done) bad("since_plateau", since_plateau, "at most 'epoch'");
  if (std::isnan(best)) bad("best", best, "a number");
  if (std::isnan(plateau_best)) bad("plateau_best", plateau_best, "a number");
  if (!(lr_factor > 0 && std::isfinite(lr_factor)))
    bad("lr_factor", lr_factor, "a positive number");
  if (!in_epoch) return;
  if (!(std::isfinite(loss_sum) && loss_sum >= 0)) bad("loss_sum", loss_sum, "a finite sum");
  if (!(std::isfinite(seen) && seen >= 0 && seen == std::floor(seen)))
    bad("seen", seen, "a count of 0 or more");
}

void LoopState::broadcast(dist::Communicator& comm) {
  std::array<double, 11> v = {
      double(epochs_done), double(step),  double(optimizer_steps),   best,
      double(since_best),  plateau_best,  double(since_plateau),     lr_factor,
      double(in_epoch),    double(batch), double(param_steps.size())};
  comm.broadcast({reinterpret_cast<std::byte*>(v.data()), sizeof v});
  epochs_done = int64_t(v[0]), step = int64_t(v[1]), optimizer_steps = int64_t(v[2]);
  best = v[3], since_best = int64_t(v[4]), plateau_best = v[5], since_plateau = int64_t(v[6]);
  lr_factor = v[7], in_epoch = v[8] != 0, batch = int64_t(v[9]);
  param_steps.resize(size_t(v[10]), 0);
  comm.broadcast(
      {reinterpret_cast<std::byte*>(param_steps.data()), param_steps.size() * sizeof(int64_t)});
  if (comm.rank() != 0) loss_sum = seen = 0;
}

}  // namespace seqforge
