// `seqforge diagnose CONFIG`: the data and model a config gives on this machine.
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loop.hpp"
#include "run.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/interrupt.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/core/resource_monitor.hpp"
#include "seqforge/train/trainer.hpp"

namespace seqforge {

namespace fs = std::filesystem;

namespace {

// Whether this process may write in directory `p`, or make it. The first missing level is made
// and removed again: permissions alone pass a root user where the file system takes no new
// directory (/proc, /sys).
bool writable_dir_for(const fs::path& p) {
  fs::path at = fs::absolute(p), first_missing;
  while (!at.empty() && !fs::exists(at) && at != at.parent_path()) {
    first_missing = at;
    at = at.parent_path();
  }
  if (!fs::is_directory(at) || access(at.c_str(), W_OK | X_OK) != 0) return false;
  if (first_missing.empty()) return true;
  if (::mkdir(first_missing.c_str(), 0700) != 0) return false;
  ::rmdir(first_missing.c_str());
  return true;
}

// Starts the kernel's count of this process's peak resident memory afresh (Linux's clear_refs),
// so that the peak read later is the measured run's; false where it cannot.
bool reset_peak_resident() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// Settings that do not fit this machine: threads, precision, the run directory. Returns the
// GEMM dtype the run would use.
DType machine_problems(const Config& c, std::vector<std::string>* problems) {
  const int cpus = usable_cpus();
  const int64_t threads = c.integer("train.threads");
  if (threads > cpus)
    problems->push_back("train.threads is " + std::to_string(threads) + " but " +
                        std::to_string(cpus) +
                        " CPUs are available: set train.threads: 0 (one per CPU) or at most " +
                        std::to_string(cpus));
  if (const char* env = std::getenv("OMP_NUM_THREADS");
      threads <= 0 && env && std::atoi(env) > cpus)
    problems->push_back("OMP_NUM_THREADS is " + std::string(env) + " but " + std::to_string(cpus) +
                        " CPUs are available: unset it or set it to at most " +
                        std::to_string(cpus));
  std::string notice;
  const DType gemm = cpu_gemm_precision(c.str("train.precision"), &notice);
  // A run on a GPU takes its precision from the GPU (data_problems).
  const bool gpu = c.str("train.device") != "cpu" && cuda_unavailable_reason().empty();
  if (!notice.empty() && !gpu && c.str("train.precision") != "auto")
    problems->push_back(notice +
                        ": set train.precision: fp32 (or auto, which picks bf16 only "
                        "where it pays off)");
  std::string run_dir = c.str("train.run_dir");
  if (run_dir.empty()) run_dir = (fs::path("runs") / fs::path(c.source()).stem()).string();
  if (!writable_dir_for(run_dir))
    problems->push_back(
        "train.run_dir " + run_dir +
        " cannot be made or written by this user: set train.run_dir to a writable directory");
  return gemm;
}

// The data and model: splits, parameters, memory per batch, and what does not fit. False where
// the training loop would refuse the config before its first step (said among the problems).
bool data_problems(const Config& c, DType gemm, ConfigDiagnosis* d) {
  std::vector<std::string>& problems = d->problems;
  Task task = load_task(c);
  d->task = task_name(task.kind);
  d->notes = task.notes();
  d->rows = task.is_lm()                           ? static_cast<int64_t>(task.text.ids.size())
            : task.kind == TaskKind::text_classify ? task.text.examples()
                                                   : task.series.rows;
  const Split& split = task.split();
  d->train = static_cast<int64_t>(split.train.size());
  d->val = static_cast<int64_t>(split.val.size());
  d->test = static_cast<int64_t>(split.test.size());
  d->steps = task.steps();
  d->batch_size = c.integer("train.batch_size");
  d->parameters = make_model(task.model)->parameters().count();
  const int64_t B = std::max<int64_t>(1, std::min(d->batch_size, std::max<int64_t>(1, d->train)));
  d->micro_batch = std::min(forward_rows(c), B);
  const bool micro_auto = c.str("train.micro_batch_size") == "auto";
  std::string rows_key = d->micro_batch < B ? "train.micro_batch_size" : "train.batch_size";
  d->batches_per_epoch = d->batch_size > 0 ? (d->train + d->batch_size - 1) / d->batch_size : 0;
  if (const int64_t mb = c.integer("train.max_batches"); mb > 0)
    d->batches_per_epoch = std::min(d->batches_per_epoch, mb);
  const int64_t F = task.is_text() ? 0 : task.series.num_features();
  const double in_bytes = task.is_text() ? 24.0 * d->steps
                          : task.kind == TaskKind::mae
                              ? 4.0 * d->steps * (F + task.series.num_outputs() + 1)
                              : 4.0 * (d->steps * F + task.series.num_outputs());
  d->batch_input_mb = in_bytes * B / 1048576;
  // On a GPU: the step against the device's free memory, in the GPU's precision.
  const std::unique_ptr<Backend> be = make_device_backend(c, task.model);
  size_t free = 0, total = 0;
  std::string device;
  const bool own_memory = be->device_memory(&free, &total, &device);
  std::string notice;
  const DType g = own_memory ? backend_precision(c.str("train.precision"), *be, &notice) : gemm;
  const std::unique_ptr<Model> model = make_model(task.model);
  if (micro_auto && !c.boolean("train.stateful")) {  // as training will resolve it
    const int64_t m = auto_micro_batch(*model, task.model, d->steps, B, g != DType::f32,
                                       own_memory ? double(free) : double(available_memory_bytes()),
                                       own_memory, &d->micro_batch_note);
    if (m >= 1) d->micro_batch = m;
    rows_key = d->micro_batch < B ? "train.micro_batch_size" : "train.batch_size";
  }
  d->activation_mb =
      activation_bytes(task.model, d->steps, d->micro_batch, gemm == DType::bf16) / 1048576;
  if (own_memory) {
    if (!notice.empty()) problems.push_back(notice);
    double need = 0;
    if (const std::string problem =
            step_fit_problem(double(free), device, *model, task.model, d->steps, d->micro_batch,
                             g != DType::f32, &need);
        !problem.empty())
      problems.push_back(rows_key + " " +
                         std::to_string(rows_key == "train.batch_size" ? B : d->micro_batch) +
                         ": " + problem);
    d->device = device;
    d->device_precision = gemm_precision_name(g);
    d->device_need_mb = need / 1048576;
    d->device_free_mb = double(free) / 1048576;
    d->device_total_mb = double(total) / 1048576;
  }
  if (d->train == 0)
    problems.push_back("the training split has no windows: lower data.lookback (" +
                       std::to_string(d->steps) + ") or give more rows, or raise data.split.train");
  if (d->val == 0 && c.number("data.split.val") > 0)
    problems.push_back(
        "the validation split has no windows (training would stop with an error): raise "
        "data.split.val, shorten the windows, or set data.split.val: 0 to train without "
        "validation");
  if (d->test == 0)
    problems.push_back(
        "the test split has no windows (seqforge eval needs some): leave room "
        "after data.split.train + data.split.val");
  if (d->batch_size > d->train && d->train > 0)
    problems.push_back("train.batch_size " + std::to_string(d->batch_size) +
                       " is larger than the " + std::to_string(d->train) +
                       " training windows (one short batch per epoch): " +
                       "lower train.batch_size to at most " + std::to_string(d->train));
  const double avail = double(available_memory_bytes()) / 1048576;
  if (avail > 0 && d->activation_mb + d->batch_input_mb > 0.5 * avail)
    problems.push_back("a training step needs about " + std::to_string(int(d->activation_mb)) +
                       " MB but " + std::to_string(int(avail)) +
                       " MB are available: set train.micro_batch_size (the same steps in "
                       "micro-batches), or lower data.lookback");
  // What the training loop refuses before its first step: the monitor, stateful training.
  if (d->train == 0) return false;
  try {
    const LoopSettings loop = LoopSettings::from(c, task);
    if (loop.stateful) checked_stateful_streams(c, task, loop.batch_size);
  } catch (const Error& e) {
    problems.push_back(e.what());
    return false;
  }
  return true;
}

// A short measured run: `steps` training steps (their median; the first pays for start-up) and
// one validation pass, timed by the profiler's scopes.
void measure(const Config& c, int steps, ConfigDiagnosis* d) {
  const fs::path tmp =
      fs::temp_directory_path() / ("seqforge-diagnose-" + std::to_string(getpid()));
  // The config's own keys keep naming the user's file and lines in errors.
  const Config short_run = c.with_values({{"train.epochs", "1"},
                                          {"train.max_batches", std::to_string(steps)},
                                          {"train.run_dir", yaml_string(tmp.string())},
                                          {"train.save", "last"},
                                          {"train.early_stopping.patience", "0"},
                                          {"train.test_after", "false"}},
                                         "diagnose's short run");
  const bool was_profiling = profiler::enabled();
  if (!was_profiling) profiler::start();
  if (!reset_peak_resident())
    d->notes.push_back(
        "the memory figure is this process's peak, the machine checks above included (its "
        "count could not be started afresh: /proc/self/clear_refs)");
  // However the run ends: the profiler as it was, the scratch run gone.
  const auto clean_up = [&] {
    if (!was_profiling) profiler::stop();
    std::error_code ec;
    fs::remove_all(tmp, ec);
  };
  std::ostringstream log;
  try {
    train(short_run, log, "", {}, /*overwrite=*/true);
  } catch (const Error& e) {
    clean_up();
    if (const auto* stop = dynamic_cast<const Interrupted*>(&e))  // as it stops train
      throw Interrupted(stop->signal(), "interrupted in diagnose's timed steps");
    d->problems.push_back(std::string("a short training run failed: ") + e.what());
    return;
  } catch (...) {
    clean_up();
    throw;
  }
  clean_up();
  d->measured_peak_mb = process_peak_rss_bytes() / 1048576;
  for (const auto& row : profiler::summary()) {
    if (row.name == "train step") {  // the median: robust to the first step and to noise
      d->timed_steps = static_cast<int>(row.calls);
      d->step_seconds = row.median_ms / 1e3;
    } else if (row.name == "validation") {
      d->validation_seconds = row.total_ms / row.calls / 1e3;
    }
  }
  d->epoch_seconds = d->step_seconds * d->batches_per_epoch + d->validation_seconds;
}

}  // namespace

ConfigDiagnosis diagnose_config(const Config& given, int steps) {
  std::string base_note;  // a fine-tune's shape, taken from its base model as training takes it
  const Config c = with_base_architecture(given, &base_note);
  check_settings(c);  // refused as train refuses them
  ConfigDiagnosis d;
  const DType gemm = machine_problems(c, &d.problems);
  const bool trains = data_problems(c, gemm, &d);
  if (!trains || (d.val == 0 && c.number("data.split.val") > 0) || steps <= 0) return d;
  if (const int64_t whole = (d.train + d.batch_size - 1) / std::max<int64_t>(d.batch_size, 1);
      steps > whole)
    d.notes.push_back("--steps " + std::to_string(steps) + ": an epoch has " +
                      std::to_string(whole) + " batches; those are timed");
  measure(c, steps, &d);
  return d;
}

}  // namespace seqforge
