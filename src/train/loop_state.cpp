#include "loop_state.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

namespace {

std::string exact(double x) {  // JSON has no infinity; 17 digits round-trip
  char buf[32];
  *std::to_chars(buf, buf + sizeof buf - 1, x, std::chars_format::general, 17).ptr = '\0';
  return buf;
}

}  // namespace

LoopState LoopState::start(const std::string& mode) {
  LoopState st;
  st.best = st.plateau_best = mode == "min" ? INFINITY : -INFINITY;
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
  if (loss_scale > 0) {
    j["loss_scale"] = exact(loss_scale);
    j["loss_scale_growth"] = loss_scale_growth;
  }
  if (in_epoch) {
    j["in_epoch"] = true;
    j["batch"] = batch;
    j["loss_sum"] = exact(loss_sum);
    j["seen"] = exact(seen);
    j["batch_windows"] = batch_windows;
    if (skipped_steps > 0) j["skipped_steps"] = skipped_steps;
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
    const std::optional<double> v = io::parse_double(t);
    if (!v) fail(source, ": seqforge.loop: '", key, "' is '", t, "', not a number");
    return *v;
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
    if (j.contains("loss_scale")) {
      s.loss_scale = real("loss_scale");
      s.loss_scale_growth = count("loss_scale_growth");
    }
    s.in_epoch = j.value("in_epoch", false);
    if (s.in_epoch) {
      s.batch = count("batch");
      s.loss_sum = real("loss_sum");
      s.seen = real("seen");
      if (j.contains("batch_windows")) s.batch_windows = count("batch_windows");
      if (j.contains("skipped_steps")) s.skipped_steps = count("skipped_steps");
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
        std::pair{"since_plateau", since_plateau},
        std::pair{"loss_scale_growth", loss_scale_growth}})
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
  if (!(loss_scale >= 0 && std::isfinite(loss_scale)))
    bad("loss_scale", loss_scale, "a positive number (0 without one)");
  if (!in_epoch) return;
  if (!(std::isfinite(loss_sum) && loss_sum >= 0)) bad("loss_sum", loss_sum, "a finite sum");
  if (!(std::isfinite(seen) && seen >= 0 && seen == std::floor(seen)))
    bad("seen", seen, "a count of 0 or more");
  if (skipped_steps < 0 || skipped_steps > batch)
    bad("skipped_steps", skipped_steps, "0 to 'batch'");
}

void LoopState::broadcast(dist::Communicator& comm) {
  std::array<double, 13> v = {
      double(epochs_done),      double(step),  double(optimizer_steps),    best,
      double(since_best),       plateau_best,  double(since_plateau),      lr_factor,
      double(in_epoch),         double(batch), double(param_steps.size()), loss_scale,
      double(loss_scale_growth)};
  comm.broadcast({reinterpret_cast<std::byte*>(v.data()), sizeof v});
  epochs_done = int64_t(v[0]), step = int64_t(v[1]), optimizer_steps = int64_t(v[2]);
  best = v[3], since_best = int64_t(v[4]), plateau_best = v[5], since_plateau = int64_t(v[6]);
  lr_factor = v[7], in_epoch = v[8] != 0, batch = int64_t(v[9]);
  param_steps.resize(size_t(v[10]), 0);
  loss_scale = v[11], loss_scale_growth = int64_t(v[12]);
  comm.broadcast(
      {reinterpret_cast<std::byte*>(param_steps.data()), param_steps.size() * sizeof(int64_t)});
  if (comm.rank() != 0) loss_sum = seen = 0;
}

}  // namespace seqforge
