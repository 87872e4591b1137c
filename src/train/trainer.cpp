#include "seqforge/train/trainer.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <thread>

#include "io/file_util.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/core/interrupt.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/core/resource_monitor.hpp"
#include "seqforge/core/threads.hpp"
#include "seqforge/data/augment.hpp"
#include "seqforge/data/datasets.hpp"
#include "seqforge/data/loader.hpp"
#include "seqforge/dist/communicator.hpp"
#include "seqforge/dist/gradient_sync.hpp"
#include "seqforge/io/checkpoint.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/optim/optimizer.hpp"
#include "seqforge/report/report.hpp"

namespace seqforge {

namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Writes checkpoints on a thread of its own, so the training loop never waits for the disk.
// Each write is atomic (write_safetensors: temporary file, fsync, rename).
class CheckpointWriter {
 public:
  CheckpointWriter() : thread_([this] { run(); }) {}
  ~CheckpointWriter() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Snapshots the tensors now; writes them later.
  void submit(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
              std::map<std::string, std::string> metadata) {
    SF_PROFILE_SCOPE("checkpoint submit");
    Job job;
    job.path = path;
    job.metadata = std::move(metadata);
    for (const auto& [name, v] : tensors) {
      job.names.push_back(name);
      job.data.emplace_back(static_cast<const char*>(v.data()),
                            static_cast<const char*>(v.data()) + v.nbytes());
      job.shapes.push_back(v.shape().to_vector());
      job.dtypes.push_back(v.dtype());
    }
    {
      std::lock_guard lock(mutex_);
      rethrow_locked();
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }
  // Waits until everything submitted is on disk; rethrows a failed write.
  void flush() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return jobs_.empty() && !busy_; });
    rethrow_locked();
  }

 private:
  struct Job {
    std::string path;
    std::vector<std::string> names;
    std::vector<std::vector<char>> data;
    std::map<std::string, std::string> metadata;
    std::vector<std::vector<int64_t>> shapes;
    std::vector<DType> dtypes;
  };
  void rethrow_locked() {
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  void run() {
    profiler::set_thread_name("checkpoint writer");
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
      lock.unlock();
      try {
        SF_PROFILE_SCOPE("checkpoint write");
        std::vector<io::SafetensorsTensor> tensors;
        for (size_t i = 0; i < job.names.size(); ++i)
          tensors.push_back({job.names[i], job.dtypes[i], job.shapes[i], job.data[i].data()});
        io::write_safetensors(job.path, tensors, job.metadata);
      } catch (...) {
        lock.lock();
        error_ = std::current_exception();
        lock.unlock();
      }
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false, busy_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// A task: its data and the model it needs.
struct Task : Dataset {
  ModelOptions model;
};

ModelOptions model_options(const Config& c, const Task& t) {
  ModelOptions m;
  auto positive = [&](const char* key) {
    const int64_t v = c.integer(key);
    if (v <= 0) fail(c.source(), ": ", key, " must be positive, got ", v);
    return v;
  };
  m.lstm.hidden_size = positive("model.hidden");
  m.lstm.num_layers = positive("model.layers");
  m.lstm.bidirectional = c.boolean("model.bidirectional");
  m.lstm.dropout = c.number("model.dropout");
  if (!(m.lstm.dropout >= 0 && m.lstm.dropout < 1))
    fail(c.source(), ": model.dropout must be in [0, 1), got ", m.lstm.dropout);
  m.lstm.batch_first = true;
  if (t.kind == "charlm") {
    m.vocab_size = static_cast<int64_t>(t.text.vocab.size());
    m.embedding_dim = positive("model.embedding");
    m.output_size = m.vocab_size;
    m.per_step = true;
  } else {
    m.lstm.input_size = t.series.num_features();
    m.output_size = t.series.num_outputs();
    m.per_step = t.kind == "mae";
  }
  return m;
}

// Loads the task's data per the config; with `from`, reuses its normalisation and vocabulary.
Task load_task(const Config& c, const Task* from = nullptr) {
  Task t;
  static_cast<Dataset&>(t) = load_dataset(c, from);
  t.model = model_options(c, t);
  return t;
}

// Bytes of one batch's buffers, for the loader's memory budget.
int64_t batch_bytes(const Task& t, int64_t batch_size) {
  const int64_t per_step = t.kind == "charlm" ? 16 : 4 * (2 * t.series.num_features() + 1);
  return batch_size * t.steps() * per_step;
}

// The loss and its gradient for a batch; returns the mean loss.
double loss_of(Backend& be, const Task& t, Tensor out, const Batch& b, Tensor dout) {
  if (t.kind == "forecast") return be.mse_loss(out, b.target, Tensor(), dout);
  if (t.kind == "mae") return be.mse_loss(out, b.target, b.mask, dout);
  return be.cross_entropy_loss(out, b.labels, Tensor(), -100, dout);
}

}  // namespace

double macro_f1(const std::vector<int64_t>& tp, const std::vector<int64_t>& fp,
                const std::vector<int64_t>& fn) {
  double sum = 0;
  int64_t present = 0;
  for (size_t k = 0; k < tp.size(); ++k) {
    const double denom = 2.0 * tp[k] + fp[k] + fn[k];
    if (denom == 0) continue;  // in neither the truth nor the predictions
    sum += 2.0 * tp[k] / denom;
    ++present;
  }
  return present > 0 ? sum / present : 0.0;
}

namespace {

// Metrics over a split (no training, no dropout).
std::map<std::string, double> evaluate_split(Backend& be, SequenceModel& model, const Task& t,
                                             const std::vector<int64_t>& starts, Loader& loader) {
  SF_PROFILE_SCOPE("validation");
  std::map<std::string, double> m;
  if (starts.empty()) return m;
  Buffer dout_buf;
  Rng rng(0);
  double loss_sum = 0, abs_sum = 0, sq_sum = 0;
  int64_t count = 0, values = 0;
  const int64_t C = t.kind == "classify" ? t.series.num_outputs() : 0;
  std::vector<int64_t> tp(C), fp(C), fn(C);
  int64_t correct = 0;
  loader.start(starts, INT64_MAX, {}, 0);
  for (size_t done = 0; done < starts.size();) {
    const Batch& b = loader.next();
    const int64_t* window = starts.data() + done;  // (b.size) the batch's window starts
    done += b.size;
    Tensor out = model.forward(be, b.input, {}, {}, false, rng);
    Tensor dout = dout_buf.get(be, DType::f32, out.shape());
    const auto* mask = static_cast<const float*>(b.mask.data());
    const int64_t n = t.kind == "charlm" ? b.size * t.text.seq_len
                      : t.kind == "mae"
                          ? static_cast<int64_t>(std::count(mask, mask + b.mask.numel(), 1.0f))
                          : b.size;
    const auto* labels = static_cast<const int64_t*>(b.labels.data());
    loss_sum += loss_of(be, t, out, b, dout) * n;
    count += n;
    const float* o = static_cast<const float*>(out.data());
    if (t.kind == "forecast") {  // errors in the targets' own units, transforms undone
      const int64_t O = t.series.num_outputs();
      for (int64_t r = 0; r < b.size; ++r)
        for (int64_t j = 0; j < O; ++j) {
          const double e =
              t.series.prediction(window[r], j, o[r * O + j]) - t.series.actual(window[r], j);
          abs_sum += std::fabs(e);
          sq_sum += e * e;
          ++values;
        }
    } else if (t.kind == "classify") {
      for (int64_t r = 0; r < b.size; ++r) {
        const int64_t pred = std::max_element(o + r * C, o + (r + 1) * C) - (o + r * C);
        const int64_t truth = labels[r];
        if (pred == truth) {
          ++correct;
          ++tp[truth];
        } else {
          ++fp[pred];
          ++fn[truth];
        }
      }
    }
  }
  m["val_loss"] = loss_sum / count;
  if (t.kind == "forecast") {
    m["val_mse"] = sq_sum / values;
    m["val_rmse"] = std::sqrt(sq_sum / values);
    m["val_mae"] = abs_sum / values;
  } else if (t.kind == "classify") {
    m["val_accuracy"] = double(correct) / count;
    m["val_f1"] = macro_f1(tp, fp, fn);
  } else if (t.kind == "charlm") {
    m["val_bpc"] = m["val_loss"] / std::log(2.0);
    m["val_perplexity"] = std::exp(m["val_loss"]);
  }
  return m;
}

// The shortest text that reads back as the same number.
template <typename Real>
std::string shortest(Real x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

std::string format_metrics(const std::map<std::string, double>& m) {
  std::string out;
  char buf[64];
  for (const auto& [k, v] : m) {
    std::snprintf(buf, sizeof buf, "  %s %.5g", k.c_str(), v);
    out += buf;
  }
  return out;
}

// Metadata stored with the weights: what eval, predict and generate need to rebuild the task.
std::map<std::string, std::string> checkpoint_metadata(const Config& c, const Task& t,
                                                       int64_t epoch,
                                                       const std::map<std::string, double>& m) {
  std::map<std::string, std::string> meta = {
      {"format", "seqforge"},
      {"seqforge.version", SEQFORGE_VERSION},
      {"seqforge.layout",
       "PyTorch names: embedding (nn.Embedding), lstm (nn.LSTM, batch_first=True, gate order "
       "i, f, g, o), head (nn.Linear on the last step, or on every step for charlm)"},
      {"seqforge.config", c.resolved_yaml()},
      {"seqforge.epoch", std::to_string(epoch)},
      {"seqforge.metrics", nlohmann::json(m).dump()},
  };
  if (t.kind == "charlm") {
    meta["seqforge.vocab"] = nlohmann::json(encode_utf8(t.text.vocab)).dump();
  } else {
    meta["seqforge.feature_norm"] = t.series.feature_norm.to_json();
    meta["seqforge.target_norm"] = t.series.target_norm.to_json();
    meta["seqforge.classes"] = nlohmann::json(t.series.class_names).dump();
    if (c.str("data.label") == "volatility" && t.kind == "classify")
      meta["seqforge.label_threshold"] = shortest(t.series.label_threshold);
  }
  return meta;
}

std::vector<std::pair<std::string, Tensor>> named(const Parameters& params, const Arena& arena,
                                                  const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.emplace_back(prefix + params.values().entries()[i].name, arena.view(i));
  return out;
}

// Copies a tensor of `file` into `dst`, checking its shape; errors name the file and tensor.
void load_tensor(const io::SafetensorsFile& file, const std::string& name, Tensor dst,
                 Backend& be) {
  const io::SafetensorsEntry* e = file.find(name);
  if (!e) fail(file.source(), ": missing tensor '", name, "' (a run of another architecture?)");
  if (Shape(e->shape) != dst.shape() || e->dtype != dst.dtype())
    fail(file.source(), ": tensor '", name, "' is ", dtype_safetensors_name(e->dtype), " ",
         Shape(e->shape).str(), ", this run has ", dtype_safetensors_name(dst.dtype()), " ",
         dst.shape().str(), " (a run of another architecture?)");
  const auto bytes = file.bytes(*e);
  std::vector<std::byte> aligned(bytes.begin(), bytes.end());
  be.copy(dst, Tensor(aligned.data(), dst.dtype(), dst.shape()));
}

// A run's checkpoint: `run` is a run directory or a .safetensors file.
struct LoadedRun {
  io::SafetensorsFile file;
  Config config;
  Task task;
};

LoadedRun load_run(const std::string& run, const std::string& data_override,
                   WindowSet windows = WindowSet::splits) {
  const std::string path =
      fs::is_directory(run) ? (fs::path(run) / "model.safetensors").string() : run;
  if (!fs::exists(run)) fail(run, ": no such run directory or model.safetensors");
  if (fs::is_directory(run) && !fs::exists(path)) {
    if (fs::exists(fs::path(run) / "study.db") || fs::exists(fs::path(run) / "best.yaml"))
      fail(run, ": a tune study's directory, not a run: give one of its trials (", run,
           "/trial-N; `seqforge tune --report` names the best)");
    if (fs::exists(fs::path(run) / "metrics.jsonl"))
      fail(run,
           ": the run saved no model yet (model.safetensors is written at its first saved "
           "epoch)");
    fail(run, ": no model.safetensors here (not a run directory)");
  }
  io::SafetensorsFile file = io::SafetensorsFile::read(path);
  const auto& meta = file.metadata();
  if (!meta.count("seqforge.config"))
    fail(path, ": not a seqforge checkpoint (no seqforge.config metadata)");
  std::vector<std::string> overrides;
  if (!data_override.empty()) overrides.push_back("data.path=" + data_override);
  Config config = Config::parse(meta.at("seqforge.config"), path + " (stored config)", overrides);
  Task stored;
  stored.kind = config.str("data.task");
  if (stored.kind == "charlm") {
    stored.text.vocab =
        decode_utf8(nlohmann::json::parse(meta.at("seqforge.vocab")).get<std::string>(),
                    path + ": seqforge.vocab");
  } else {
    stored.series.feature_norm = Normalizer::from_json(meta.at("seqforge.feature_norm"));
    stored.series.target_norm = Normalizer::from_json(meta.at("seqforge.target_norm"));
    stored.series.class_names =
        nlohmann::json::parse(meta.at("seqforge.classes")).get<std::vector<std::string>>();
    if (meta.count("seqforge.label_threshold"))
      stored.series.label_threshold =
          std::strtod(meta.at("seqforge.label_threshold").c_str(), nullptr);
  }
  Task task;
  if (stored.kind == "charlm" && data_override.empty() && !fs::exists(config.str("data.path"))) {
    task = stored;  // generation needs only the vocabulary
    task.model = model_options(config, task);
  } else {
    static_cast<Dataset&>(task) = load_dataset(config, &stored, windows);
    task.model = model_options(config, task);
  }
  return {std::move(file), std::move(config), std::move(task)};
}

// The model of a loaded run, its weights loaded, computing in the run's precision.
std::unique_ptr<SequenceModel> load_model(Backend& be, const LoadedRun& r, std::ostream* notes) {
  auto model = std::make_unique<SequenceModel>(r.task.model);
  model->initialize(be, 0);
  io::load_parameters(r.file.source(), model->parameters(), be);
  std::string notice;
  model->set_gemm_dtype(resolve_precision(r.config.str("train.precision"), &notice));
  if (!notice.empty() && notes) *notes << "note: " << notice << "\n";
  return model;
}

// Compute threads of one of `local` processes on this machine: an unbound process (mpirun
// --bind-to none) shares the machine's CPUs with the others.
ThreadConfig configure_rank_threads(const Config& c, int local) {
  const int64_t requested = c.integer("train.threads");
  if (requested < 0)
    fail(c.source(), ": train.threads must be 0 (one per CPU) or a count, got ", requested);
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  ThreadConfig t;
  if (local <= 1 || requested > 0 || std::getenv("OMP_NUM_THREADS") || cpus < online) {
    t = configure_threads(static_cast<int>(requested));  // alone, or bound by the launcher
  } else {
    t = configure_threads(std::max(1, cpus / local));
    t.reason = std::to_string(cpus) + " CPUs shared by " + std::to_string(local) +
               " processes on this machine";
  }
  if (t.threads > cpus)
    t.warning = std::to_string(t.threads) + " threads (" + t.reason + ") on " +
                std::to_string(cpus) +
                " CPUs this process may use: threads will wait for each "
                "other; set train.threads to " +
                std::to_string(cpus) + " or fewer";
  return t;
}

// The files a training run writes into its directory.
const char* const kRunFiles[] = {"config.resolved.yaml",
                                 "metrics.jsonl",
                                 "model.safetensors",
                                 "training_state.safetensors",
                                 "report.html",
                                 "val_predictions.csv",
                                 "trace.json"};

// Whether `dir` holds a run with something to lose: a finished epoch's metrics, a model or a
// training state (a run stopped before its first epoch ended left nothing of value).
bool holds_a_run(const fs::path& dir) {
  std::error_code ec;
  const auto metrics = fs::file_size(dir / "metrics.jsonl", ec);
  return (!ec && metrics > 0) || fs::exists(dir / "model.safetensors") ||
         fs::exists(dir / "training_state.safetensors");
}

// The run directory of a new run: train.run_dir, which must not hold another run unless
// `overwrite`; by default runs/<config name>, or the first of runs/<name>-2, -3, ... that holds
// no run.
std::string new_run_dir(const Config& c, bool overwrite) {
  std::string dir = c.str("train.run_dir");
  if (!dir.empty()) {
    if (!overwrite && holds_a_run(dir))
      fail(dir, ": holds another run's files; pass --overwrite to replace them, or --resume ", dir,
           " to continue that run");
    return dir;
  }
  const fs::path base = fs::path("runs") / fs::path(c.source()).stem();
  if (overwrite) return base.string();
  for (int version = 1;; ++version) {
    const fs::path p =
        version == 1 ? base : fs::path(base.string() + "-" + std::to_string(version));
    if (!holds_a_run(p)) return p.string();
  }
}

// The metrics an epoch of this task reports.
std::vector<std::string> metric_names(const std::string& kind) {
  std::vector<std::string> out = {"train_loss", "val_loss"};
  if (kind == "forecast") out.insert(out.end(), {"val_mse", "val_rmse", "val_mae"});
  if (kind == "classify") out.insert(out.end(), {"val_accuracy", "val_f1"});
  if (kind == "charlm") out.insert(out.end(), {"val_bpc", "val_perplexity"});
  return out;
}

// The validation split, checked before training: empty only when data.split.val is 0.
void check_validation_split(const Config& c, const Task& t) {
  const Split& s = t.split();
  const double share = c.number("data.split.val");
  if (share == 0 || !s.val.empty()) return;
  const char* what = t.kind == "charlm" ? "sequences" : "windows";
  const std::string size = t.kind == "charlm"
                               ? "data.seq_len + 1 = " + std::to_string(t.text.seq_len + 1)
                               : "data.lookback + data.horizon = " +
                                     std::to_string(t.series.lookback + t.series.horizon);
  fail(c.source(), ": data.split.val: the validation split has no ", what, " (train ",
       s.train.size(), ", validation 0, test ", s.test.size(), "): each series' validation part ",
       "is shorter than ", size,
       "; raise data.split.val, shorten the windows, or set "
       "data.split.val: 0 to train without validation");
}

// Throws when a parameter is not finite: no checkpoint may hold such a model.
void check_finite_parameters(const Parameters& p, int64_t epoch, const std::string& checkpoint) {
  const Tensor flat = p.values().flat();
  const auto* v = static_cast<const float*>(flat.data());
  for (int64_t i = 0; i < flat.numel(); ++i)
    if (!std::isfinite(v[i]))
      fail("epoch ", epoch, ": the model's parameters are not finite (", v[i],
           "); lower optim.lr or set train.clip_grad_norm. Nothing was saved: ", checkpoint,
           " holds the last finite model");
}

TrainSummary train_rank(const Config& c, std::ostream& out, const std::string& resume_dir,
                        const TrainHooks& hooks, bool overwrite, dist::Communicator& comm) {
  const int ranks = comm.size(), rank = comm.rank();
  const ThreadConfig threads = configure_rank_threads(c, comm.local_size());
  std::string notice;
  const DType gemm_dtype = resolve_precision(c.str("train.precision"), &notice);
  Task task = load_task(c);
  check_validation_split(c, task);
  const std::string monitor = c.str("train.early_stopping.monitor");
  if (const auto names = metric_names(task.kind);
      std::find(names.begin(), names.end(), monitor) == names.end()) {
    std::string list;
    for (const auto& name : names) list += " " + name;
    fail(c.source(), ": train.early_stopping.monitor: '", monitor,
         "' is not a metric of this task (", list, " )");
  }
  if (task.split().val.empty() && monitor.rfind("val_", 0) == 0)
    fail(c.source(), ": train.early_stopping.monitor is ", monitor,
         " but data.split.val is 0 (no validation): monitor train_loss, or give a validation "
         "share");
  const int64_t batch_size = c.integer("train.batch_size"), epochs = c.integer("train.epochs");
  if (batch_size <= 0) fail(c.source(), ": train.batch_size must be positive, got ", batch_size);
  if (epochs <= 0) fail(c.source(), ": train.epochs must be positive, got ", epochs);
  const double dist_timeout = c.number("dist.timeout_seconds"),
               bucket_mb = c.number("dist.bucket_mb");
  if (!(dist_timeout > 0))
    fail(c.source(), ": dist.timeout_seconds must be positive, got ", dist_timeout);
  if (!(bucket_mb > 0)) fail(c.source(), ": dist.bucket_mb must be positive, got ", bucket_mb);
  const std::string mode = c.str("train.early_stopping.mode");
  if (mode != "min" && mode != "max")
    fail(c.source(), ": train.early_stopping.mode must be min or max, got '", mode, "'");
  const std::string save = c.str("train.save"), schedule = c.str("train.schedule");
  if (save != "best" && save != "last" && save != "every_n")
    fail(c.source(), ": train.save must be best, last or every_n, got '", save, "'");
  if (schedule != "constant" && schedule != "step" && schedule != "cosine" && schedule != "plateau")
    fail(c.source(), ": train.schedule must be constant, step, cosine or plateau, got '", schedule,
         "'");
  const std::string run_dir = !resume_dir.empty() ? resume_dir
                              : rank == 0         ? new_run_dir(c, overwrite)
                                                  : "";

  comm.set_timeout(dist_timeout, "the last checkpoint in " + run_dir + " is intact");

  auto be = make_cpu_backend();
  const uint64_t seed = static_cast<uint64_t>(c.integer("train.seed"));
  SequenceModel model(task.model);
  model.initialize(*be, seed);
  model.set_gemm_dtype(gemm_dtype);
  model.set_input_grad(false);
  std::vector<std::string> initialized;  // parameters loaded from model.init_from
  if (const std::string init = c.str("model.init_from");
      !init.empty() && resume_dir.empty() && rank == 0)  // the others get rank 0's
    initialized = io::load_parameters(init, model.parameters(), *be, false,
                                      c.list("model.init_from_modules"));
  OptimizerOptions oo;
  oo.kind = c.str("optim.kind");
  oo.lr = c.number("optim.lr");
  oo.weight_decay = c.number("optim.weight_decay");
  oo.beta1 = c.number("optim.beta1");
  oo.beta2 = c.number("optim.beta2");
  oo.eps = c.number("optim.eps");
  oo.momentum = c.number("optim.momentum");
  oo.nesterov = c.boolean("optim.nesterov");
  Optimizer optimizer(*be, model.parameters(), oo);

  const Split& split = task.split();
  const int64_t max_batches = c.integer("train.max_batches");
  // Each rank takes batch_size windows of every global batch of ranks * batch_size.
  const int64_t global_batch = ranks * batch_size;
  int64_t batches_per_epoch =
      (static_cast<int64_t>(split.train.size()) + global_batch - 1) / global_batch;
  if (max_batches > 0) batches_per_epoch = std::min(batches_per_epoch, max_batches);
  const int64_t total_steps = batches_per_epoch * epochs, warmup = c.integer("train.warmup_steps");
  out << "seqforge " << SEQFORGE_VERSION << ": " << task.kind << ", " << split.train.size()
      << " training / " << split.val.size() << " validation / " << split.test.size() << " test "
      << (task.kind == "charlm" ? "sequences" : "windows") << ", " << model.parameters().count()
      << " parameters, " << threads.threads << " threads (" << threads.reason << "), "
      << (gemm_dtype == DType::bf16 ? "bf16" : "fp32") << " GEMMs (" << be->description() << ")\n";
  if (ranks > 1)
    out << "data-parallel: " << ranks << " processes (" << comm.name() << "), batch " << batch_size
        << " per process, " << global_batch << " per step\n";
  if (!notice.empty()) out << "note: " << notice << "\n";
  if (!threads.warning.empty()) out << "warning: " << threads.warning << "\n";
  if (task.kind != "charlm")
    for (const std::string& note : task.series.notes) out << "note: " << note << "\n";
  if (task.kind != "charlm" && task.series.series.size() > 1)
    out << "series: " << task.series.series.size() << " in " << task.path << " ("
        << c.str("data.series_column") << "), split "
        << (c.str("data.split.by") == "date" ? "at shared dates" : "at the same fractions of each")
        << "\n";
  if (!initialized.empty()) {
    std::vector<std::string> modules;
    int64_t values = 0;
    for (const std::string& name : initialized) {
      const std::string module = name.substr(0, name.find('.'));
      if (std::find(modules.begin(), modules.end(), module) == modules.end())
        modules.push_back(module);
      values += model.parameters().values().find(name)->shape.numel();
    }
    std::string list;
    for (const std::string& m : modules) list += (list.empty() ? "" : ", ") + m;
    out << "init_from: " << initialized.size() << " tensors (" << values << " values) of " << list
        << " from " << c.str("model.init_from") << "\n";
  }
  if (split.val.empty())
    out << "no validation (data.split.val is 0): no val_* metrics; " << monitor
        << " decides early stopping and the best checkpoint\n";
  // The loader, and the augmentation cache (built now: a failure leaves the run directory as it
  // was).
  const AugmentOptions augment = AugmentOptions::from_config(c);
  std::unique_ptr<AugmentCache> augment_cache;
  if (augment.cache)
    augment_cache = AugmentCache::open(task, augment, seed ^ 0xa06e47ull, threads.threads, out);
  const BatchRecipe recipe{augment.any() ? &augment : nullptr, augment_cache.get()};
  Loader loader(*be, task, batch_size, loader_options(c, batch_bytes(task, batch_size)));
  out << "loader: " << loader.options().workers << " worker"
      << (loader.options().workers == 1 ? "" : "s") << " (" << loader.options().reason
      << "), prefetch " << loader.options().prefetch_factor << " batches per worker"
      << (augment.any()
              ? augment.cache ? ", augmentations from the cache" : ", augmentations on the fly"
              : "")
      << "\n";
  const std::string default_dir = (fs::path("runs") / fs::path(c.source()).stem()).string();
  out << "run directory: " << run_dir
      << (resume_dir.empty() && c.str("train.run_dir").empty() && run_dir != default_dir
              ? " (" + default_dir + " holds another run)"
              : "")
      << "\n"
      << std::flush;

  Rng rng(seed ^ 0x5eed5eedull);
  double best = mode == "min" ? INFINITY : -INFINITY, plateau_best = best, lr_factor = 1.0;
  int64_t since_best = 0, since_plateau = 0, step = 0, first_epoch = 1;
  // A run stopped part-way through an epoch (a signal) resumes at its next batch, its windows
  // already shuffled: resume_batch batches done, their loss summed over resume_seen windows.
  int64_t resume_batch = 0;
  bool resume_in_epoch = false;
  double resume_loss_sum = 0, resume_seen = 0;
  std::vector<int64_t> order = split.train;
  const std::string state_path = (fs::path(run_dir) / "training_state.safetensors").string();
  if (!resume_dir.empty() && rank == 0) {  // everything the loop carries from epoch to epoch
    if (!fs::exists(state_path)) fail(state_path, ": missing: this run has nothing to resume from");
    const io::SafetensorsFile state = io::SafetensorsFile::read(state_path);
    const auto& p = model.parameters();
    auto tensors = named(p, p.values(), "param.");
    for (int k = 0; k < (oo.kind == "sgd" ? 1 : 2); ++k)
      for (auto& t : named(p, optimizer.state(k), "optim." + std::to_string(k) + "."))
        tensors.push_back(t);
    for (const auto& [name, t] : tensors) load_tensor(state, name, t, *be);
    const io::SafetensorsEntry* o = state.find("order");
    if (!o || o->shape != std::vector<int64_t>{static_cast<int64_t>(order.size())})
      fail(state_path, ": the training split has ", order.size(),
           " windows now; the saved run had a different number (data changed?)");
    load_tensor(state, "order",
                Tensor(order.data(), DType::i64, {static_cast<int64_t>(order.size())}), *be);
    std::array<uint64_t, 4> words{};
    load_tensor(state, "rng", Tensor(words.data(), DType::i64, {4}), *be);
    rng.set_state(words);
    const auto j = nlohmann::json::parse(state.metadata().at("seqforge.loop"));
    first_epoch = j.at("epoch").get<int64_t>() + 1;
    step = j.at("step").get<int64_t>();
    optimizer.set_steps(j.at("optimizer_steps").get<int64_t>(),
                        j.at("param_steps").get<std::vector<int64_t>>());
    auto real = [&](const char* key) {
      return std::strtod(j.at(key).get<std::string>().c_str(), nullptr);
    };
    best = real("best");
    since_best = j.at("since_best").get<int64_t>();
    plateau_best = real("plateau_best");
    since_plateau = j.at("since_plateau").get<int64_t>();
    lr_factor = real("lr_factor");
    resume_in_epoch = j.value("in_epoch", false);
    if (resume_in_epoch) {
      resume_batch = j.at("batch").get<int64_t>();
      resume_loss_sum = real("loss_sum");
      resume_seen = real("seen");
      out << "resuming " << run_dir << " in epoch " << first_epoch << " after batch "
          << resume_batch << "\n";
    } else {
      out << "resuming " << run_dir << " after epoch " << first_epoch - 1 << "\n";
    }
  }
  if (ranks > 1) {  // every rank starts from rank 0's parameters and loop state (init, resume)
    auto bytes = [&](void* p, size_t n) { comm.broadcast({static_cast<std::byte*>(p), n}); };
    int64_t windows = static_cast<int64_t>(order.size());
    bytes(&windows, sizeof windows);
    if (windows != static_cast<int64_t>(order.size()))
      fail("rank ", rank, " has ", order.size(), " training windows, rank 0 has ", windows,
           " (different data on this machine?)");
    Parameters& p = model.parameters();
    bytes(p.values().flat().data(), p.values().flat().nbytes());
    for (int k = 0; k < (oo.kind == "sgd" ? 1 : 2); ++k)
      bytes(optimizer.state(k).flat().data(), optimizer.state(k).flat().nbytes());
    bytes(order.data(), order.size() * sizeof(int64_t));
    std::array<uint64_t, 4> words = rng.state();
    bytes(words.data(), sizeof words);
    rng.set_state(words);
    std::array<double, 10> loop = {
        double(first_epoch),     double(step),        double(optimizer.steps()), best,
        double(since_best),      plateau_best,        double(since_plateau),     lr_factor,
        double(resume_in_epoch), double(resume_batch)};
    bytes(loop.data(), sizeof loop);
    std::vector<int64_t> param_steps = optimizer.param_steps();
    param_steps.resize(p.size(), 0);
    bytes(param_steps.data(), param_steps.size() * sizeof(int64_t));
    first_epoch = static_cast<int64_t>(loop[0]);
    step = static_cast<int64_t>(loop[1]);
    optimizer.set_steps(static_cast<int64_t>(loop[2]), param_steps);
    best = loop[3];
    since_best = static_cast<int64_t>(loop[4]);
    plateau_best = loop[5];
    since_plateau = static_cast<int64_t>(loop[6]);
    lr_factor = loop[7];
    resume_in_epoch = loop[8] != 0;
    resume_batch = static_cast<int64_t>(loop[9]);
    // Rank 0's saved sums are the whole batches'; the others add their own from here.
    if (rank != 0) resume_loss_sum = resume_seen = 0;
  }

  // The run directory is touched only now that everything above has been checked, by rank 0.
  if (rank == 0 && resume_dir.empty())  // --overwrite: the old run's files go first
    for (const char* name : kRunFiles) fs::remove(fs::path(run_dir) / name);
  if (rank == 0) fs::create_directories(run_dir);
  if (rank == 0) {
    const std::string yaml = c.resolved_yaml();
    io::write_file_atomically((fs::path(run_dir) / "config.resolved.yaml").string(),
                              {{yaml.data(), yaml.size()}});
  }
  // metrics.jsonl keeps a resumed run's epochs before first_epoch (a line cut short by a kill is
  // dropped); it is replaced atomically, then appended to, a flushed line per epoch.
  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  std::string kept;
  if (!resume_dir.empty() && rank == 0) {
    std::ifstream old(metrics_path);
    for (std::string line; std::getline(old, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("epoch") && j.value("epoch", int64_t{0}) < first_epoch)
        kept += line + "\n";
    }
  }
  std::ofstream metrics_log;
  if (rank == 0) {
    io::write_file_atomically(metrics_path, {{kept.data(), kept.size()}});
    metrics_log.open(metrics_path, std::ios::app);
  }
  CheckpointWriter writer;
  ResourceMonitor resources;  // cpu_percent, rss_mb, peak_rss_mb per epoch; counters in the trace
  const std::string checkpoint = (fs::path(run_dir) / "model.safetensors").string();
  const double clip = c.number("train.clip_grad_norm");
  const double min_delta = c.number("train.early_stopping.min_delta");
  const int64_t patience = c.integer("train.early_stopping.patience");
  const bool tty = isatty(STDOUT_FILENO) && &out == &std::cout;
  TrainSummary summary;
  summary.run_dir = run_dir;
  summary.checkpoint = checkpoint;
  summary.monitor = monitor;
  Buffer dout_buf;
  model.parameters().zero_grad(*be);
  // Modules held fixed for the first freeze_epochs epochs (a pre-trained encoder, say).
  std::vector<bool> frozen(model.parameters().size(), false);
  for (const std::string& module : c.list("train.freeze_modules")) {
    bool any = false;
    for (size_t i = 0; i < frozen.size(); ++i)
      if (model.parameters().values().entries()[i].name.rfind(module + ".", 0) == 0)
        frozen[i] = any = true;
    if (!any)
      fail(c.source(), ": train.freeze_modules: the model has no module '", module,
           "' (modules: embedding, lstm, head)");
  }
  const int64_t freeze_epochs = c.integer("train.freeze_epochs");
  if (const auto modules = c.list("train.freeze_modules");
      !modules.empty() && freeze_epochs >= first_epoch) {
    std::string list;
    for (const std::string& m : modules) list += (list.empty() ? "" : ", ") + m;
    out << "frozen: " << list << " for epochs 1-" << freeze_epochs;
    if (freeze_epochs < epochs) out << ", trained from epoch " << freeze_epochs + 1;
    out << "\n";
  }
  // Data parallel: gradients summed across ranks in buckets while backward runs; dropout draws
  // differ per rank.
  std::unique_ptr<dist::GradientSync> sync;
  if (ranks > 1) {
    sync = std::make_unique<dist::GradientSync>(comm, model.parameters(),
                                                static_cast<size_t>(bucket_mb * (1 << 20)));
    model.set_grad_ready_hook([&](size_t first, size_t end) { sync->ready(first, end); });
  }
  Rng rank_rng(0);
  Rng& forward_rng = ranks > 1 ? rank_rng : rng;
  // The loop's state for --resume (rank 0): after `epochs_done` epochs or, `in_epoch`, after
  // `batch` batches of the next one (its windows shuffled, their loss summed over `seen`).
  auto save_state = [&](int64_t epochs_done, bool in_epoch, int64_t batch, double loss_sum,
                        double seen) {
    const Parameters& p = model.parameters();
    auto tensors = named(p, p.values(), "param.");
    for (int k = 0; k < (oo.kind == "sgd" ? 1 : 2); ++k)
      for (auto& t : named(p, optimizer.state(k), "optim." + std::to_string(k) + "."))
        tensors.push_back(t);
    tensors.emplace_back("order",
                         Tensor(order.data(), DType::i64, {static_cast<int64_t>(order.size())}));
    std::array<uint64_t, 4> words = rng.state();
    tensors.emplace_back("rng", Tensor(words.data(), DType::i64, {4}));
    // Reals as text: JSON has no infinity, and "%.17g" round-trips exactly.
    auto real = [](double x) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", x);
      return std::string(buf);
    };
    nlohmann::json loop = {{"epoch", epochs_done},
                           {"step", step},
                           {"optimizer_steps", optimizer.steps()},
                           {"param_steps", optimizer.param_steps()},
                           {"best", real(best)},
                           {"since_best", since_best},
                           {"plateau_best", real(plateau_best)},
                           {"since_plateau", since_plateau},
                           {"lr_factor", real(lr_factor)}};
    if (in_epoch) {
      loop["in_epoch"] = true;
      loop["batch"] = batch;
      loop["loss_sum"] = real(loss_sum);
      loop["seen"] = real(seen);
    }
    writer.submit(state_path, tensors,
                  {{"seqforge.loop", loop.dump()}, {"seqforge.config", c.resolved_yaml()}});
  };
  // A signal stops the run before its next step, once every rank has seen it: the state is
  // saved and Interrupted thrown for the CLI to exit 130 (SIGINT) or 143 (SIGTERM).
  auto agreed_signal = [&] {
    int sig = interrupt_requested();
    if (ranks > 1) {
      std::array<double, 2> seen = {double(sig == SIGINT), double(sig == SIGTERM)};
      comm.all_reduce_sum(seen);
      sig = seen[1] > 0 ? SIGTERM : seen[0] > 0 ? SIGINT : 0;
    }
    return sig;
  };
  const double progress_seconds = c.number("train.progress_seconds");
  bool stepped = false;       // a step has run in this process
  std::vector<int64_t> mine;  // this rank's windows of the epoch

  for (int64_t epoch = first_epoch; epoch <= epochs; ++epoch) {
    SF_PROFILE_SCOPE("epoch");
    const double t0 = now_s();
    optimizer.set_frozen(epoch <= freeze_epochs ? frozen : std::vector<bool>(frozen.size(), false));
    const bool resumed_part_way = epoch == first_epoch && resume_in_epoch;
    const int64_t first_batch = resumed_part_way ? resume_batch : 0;
    if (!resumed_part_way)
      for (int64_t i = static_cast<int64_t>(order.size()) - 1; i > 0; --i)
        std::swap(order[i], order[rng.next() % (i + 1)]);
    double loss_sum = resumed_part_way ? resume_loss_sum : 0;
    int64_t seen = resumed_part_way ? static_cast<int64_t>(resume_seen) : 0;
    const int64_t seen_before = seen;
    double last_progress = t0;
    const uint64_t epoch_seed = mix_seed(seed, static_cast<uint64_t>(epoch));
    // Rank r's k-th batch is order[(k * ranks + r) * b, + b); the last ones may be short or empty.
    const int64_t used =
        std::min<int64_t>(static_cast<int64_t>(order.size()), batches_per_epoch * global_batch);
    int64_t local_batches = batches_per_epoch;
    if (ranks > 1) {
      mine.clear();
      for (int64_t k = 0; k < batches_per_epoch; ++k) {
        const int64_t begin = std::min(used, (k * ranks + rank) * batch_size);
        mine.insert(mine.end(), order.begin() + begin,
                    order.begin() + std::min(used, begin + batch_size));
      }
      local_batches = (static_cast<int64_t>(mine.size()) + batch_size - 1) / batch_size;
      rank_rng = Rng(mix_seed(epoch_seed, 0x72616e6b00ull + static_cast<uint64_t>(rank)));
    }
    loader.start(ranks > 1 ? mine : order, local_batches, recipe,
                 ranks > 1 ? mix_seed(epoch_seed, static_cast<uint64_t>(rank)) : epoch_seed,
                 first_batch);
    for (int64_t bi = first_batch; bi < batches_per_epoch; ++bi, ++step) {
      if (stepped) {
        if (const int sig = agreed_signal()) {
          std::array<double, 2> sums = {loss_sum, double(seen)};
          if (ranks > 1) comm.all_reduce_sum(sums);
          if (rank != 0) throw Interrupted(sig, "");
          save_state(epoch - 1, true, bi, sums[0], sums[1]);
          writer.flush();
          throw Interrupted(
              sig,
              detail::concat("interrupted (", sig == SIGINT ? "SIGINT" : "SIGTERM", ") in epoch ",
                             epoch, " after batch ", bi, " of ", batches_per_epoch,
                             ": the training state is saved in ", state_path,
                             "; continue with: seqforge train --resume ", run_dir));
        }
      }
      stepped = true;
      SF_PROFILE_SCOPE("train step");
      const Batch* batch_ptr = nullptr;  // null: this rank has no windows in this step
      if (bi < local_batches) {
        SF_PROFILE_SCOPE("data wait");
        batch_ptr = &loader.next();
      }
      // Learning rate: linear warm-up, then the schedule.
      double lr = oo.lr * lr_factor;
      if (step < warmup) {
        lr = oo.lr * double(step + 1) / double(warmup);
      } else if (schedule == "step") {
        lr = oo.lr *
             std::pow(c.number("train.gamma"),
                      double((epoch - 1) / std::max<int64_t>(1, c.integer("train.step_epochs"))));
      } else if (schedule == "cosine") {
        const double p = double(step - warmup) / double(std::max<int64_t>(1, total_steps - warmup));
        lr = 0.5 * oo.lr * (1.0 + std::cos(M_PI * std::min(1.0, p)));
      }
      optimizer.set_lr(lr);
      if (!batch_ptr) {
        if (task.kind == "mae") {  // the others count masked steps
          std::array<double, 1> none{};
          comm.all_reduce_sum(none);
        }
        sync->begin_step();
        sync->finish();
        fused_step(*be, model.parameters(), optimizer, clip, nullptr);
        continue;
      }
      const Batch& batch = *batch_ptr;
      Tensor y = model.forward(*be, batch.input, {}, {}, true, forward_rng);
      Tensor dout = dout_buf.get(*be, DType::f32, y.shape());
      const double loss = [&] {
        SF_PROFILE_SCOPE("loss");
        return loss_of(*be, task, y, batch, dout);
      }();
      if (!std::isfinite(loss))
        fail("epoch ", epoch, ", step ", step + 1, " (batch ", bi + 1, " of ", batches_per_epoch,
             "): the training loss is ", loss, "; lower optim.lr or set train.clip_grad_norm ",
             "(e.g. 1.0). Nothing was saved from this epoch: ", checkpoint,
             " holds the last finite model");
      if (ranks > 1) {
        // The summed gradients are the mean over the global batch: each rank's mean gradient
        // weighted by its share of the loss's terms (windows, or masked steps for mae).
        std::array<double, 1> terms = {double(batch.size)};
        double total = double(std::min(global_batch, used - bi * global_batch));
        if (task.kind == "mae") {
          const auto* mask = static_cast<const float*>(batch.mask.data());
          terms[0] = double(std::count(mask, mask + batch.mask.numel(), 1.0f));
          std::array<double, 1> all = terms;
          comm.all_reduce_sum(all);
          total = all[0];
        }
        be->scale(dout, total > 0 ? terms[0] / total : 0.0);
        sync->begin_step();
      }
      model.backward(*be, dout);
      if (sync) sync->finish();
      {
        SF_PROFILE_SCOPE("optimizer");
        fused_step(*be, model.parameters(), optimizer, clip, nullptr);
      }
      loss_sum += loss * batch.size;
      seen += batch.size;
      if (hooks.on_step) hooks.on_step(epoch, bi + 1);
      // Progress: redrawn in place on a terminal, else a line every progress_seconds.
      const double now = now_s();
      if (tty ? bi % 10 == 9 || bi + 1 == batches_per_epoch
              : progress_seconds > 0 && now - last_progress >= progress_seconds) {
        last_progress = now;
        const double el = now - t0, done = double(bi + 1 - first_batch);
        const double eta = el / done * double(batches_per_epoch - bi - 1);
        char line[160];
        std::snprintf(
            line, sizeof line,
            "%sepoch %lld/%lld  %lld/%lld batches  loss %.5g  %.0f samples/s  ETA %.0f s%s",
            tty ? "\r" : "", (long long)epoch, (long long)epochs, (long long)(bi + 1),
            (long long)batches_per_epoch, loss_sum / std::max<int64_t>(seen, 1),
            double(seen - seen_before) / std::max(el, 1e-9), eta, tty ? "  " : "\n");
        out << line << std::flush;
      }
    }
    if (ranks > 1) {  // the global training loss
      std::array<double, 2> sums = {loss_sum, double(seen)};
      comm.all_reduce_sum(sums);
      loss_sum = sums[0];
      seen = static_cast<int64_t>(sums[1]);
    }
    const double train_s = now_s() - t0, wait_s = loader.wait_seconds();
    if (rank != 0) {  // rank 0 validates, saves and decides; the others follow
      std::array<double, 2> next{};
      comm.broadcast({reinterpret_cast<std::byte*>(next.data()), sizeof next});
      lr_factor = next[1];
      summary.epochs = epoch;
      if (next[0] != 0) break;
      continue;
    }
    std::map<std::string, double> m = evaluate_split(*be, model, task, split.val, loader);
    m["train_loss"] = loss_sum / seen;
    check_finite_parameters(model.parameters(), epoch, checkpoint);
    const double epoch_s = now_s() - t0;
    if (!m.count(monitor))
      fail(c.source(), ": train.early_stopping.monitor: '", monitor,
           "' is not a metric of this task (", format_metrics(m), " )");
    const double value = m.at(monitor);
    const bool improved = mode == "min" ? value < best - min_delta : value > best + min_delta;
    if (improved) {
      best = value;
      since_best = 0;
    } else {
      ++since_best;
    }
    if (schedule == "plateau" && step >= warmup) {
      if (mode == "min" ? value < plateau_best - min_delta : value > plateau_best + min_delta) {
        plateau_best = value;
        since_plateau = 0;
      } else if (++since_plateau >= c.integer("train.plateau_patience")) {
        lr_factor *= c.number("train.gamma");
        since_plateau = 0;
      }
    }
    const bool hook_stop = hooks.on_epoch && !hooks.on_epoch(epoch, m);
    const bool last_epoch =
        epoch == epochs || (patience > 0 && since_best >= patience) || hook_stop;
    const bool write =
        (save == "best" && improved) || (save == "last" && last_epoch) ||
        (save == "every_n" &&
         (epoch % std::max<int64_t>(1, c.integer("train.save_every")) == 0 || last_epoch));
    const Parameters& p = model.parameters();
    if (write)
      writer.submit(checkpoint, named(p, p.values(), ""), checkpoint_metadata(c, task, epoch, m));
    save_state(epoch, false, 0, 0, 0);  // after every epoch, for --resume
    nlohmann::json j = m;
    j["epoch"] = epoch;
    j["lr"] = optimizer.options().lr;
    j["epoch_seconds"] = epoch_s;
    j["train_seconds"] = train_s;
    j["samples_per_second"] = double(seen - seen_before) / std::max(train_s, 1e-9);
    j["data_wait_seconds"] = wait_s;
    j["data_wait_share"] = wait_s / std::max(train_s, 1e-9);
    j["checkpoint"] = write;
    for (const auto& [k, v] : resources.interval_summary()) j[k] = v;
    metrics_log << j.dump() << "\n" << std::flush;
    write_run_report(run_dir);
    char head[96];
    std::snprintf(head, sizeof head, "epoch %lld/%lld", (long long)epoch, (long long)epochs);
    char tail[160];
    std::snprintf(tail, sizeof tail, "  lr %.3g  %.1f s  %.0f samples/s  data wait %.1f%%%s",
                  optimizer.options().lr, epoch_s,
                  double(seen - seen_before) / std::max(train_s, 1e-9),
                  100 * wait_s / std::max(train_s, 1e-9), write ? "  [saved]" : "");
    out << (tty ? "\r" : "") << head << format_metrics(m) << tail << "\n" << std::flush;
    summary.epochs = epoch;
    summary.last = m;
    if (ranks > 1) {
      std::array<double, 2> next = {double(hook_stop || (patience > 0 && since_best >= patience)),
                                    lr_factor};
      comm.broadcast({reinterpret_cast<std::byte*>(next.data()), sizeof next});
    }
    if (hook_stop) {
      summary.stopped = true;
      break;
    }
    if (patience > 0 && since_best >= patience) {
      out << "early stopping: " << monitor << " did not improve for " << patience << " epochs\n";
      break;
    }
  }
  if (rank != 0) return summary;
  writer.flush();
  if (fs::exists(checkpoint))  // the saved model's predictions on the validation split
    write_validation_outputs(run_dir);
  if (c.boolean("train.test_after") && !split.test.empty() && fs::exists(checkpoint)) {
    // The saved model on the held-out test split, once, after training.
    summary.test = evaluate(run_dir, "test");
    const io::SafetensorsFile saved = io::SafetensorsFile::read(checkpoint);
    const int64_t model_epoch = std::stoll(saved.metadata().at("seqforge.epoch"));
    nlohmann::json j = summary.test;
    j["split"] = "test";
    j["model_epoch"] = model_epoch;
    metrics_log << j.dump() << "\n" << std::flush;
    std::map<std::string, double> shown;
    for (const auto& [k, v] : summary.test)
      if (k != "samples") shown[k] = v;
    out << "test (the saved model, epoch " << model_epoch << ", " << split.test.size() << " "
        << (task.kind == "charlm" ? "sequences" : "windows") << "):" << format_metrics(shown)
        << "\n";
  }
  const std::string report = write_run_report(run_dir);
  summary.best = best;
  out << "best " << monitor << " " << best << "; model: " << checkpoint
      << "; metrics: " << (fs::path(run_dir) / "metrics.jsonl").string() << "; report: " << report
      << "\n";
  return summary;
}

}  // namespace

TrainSummary train(const Config& config, std::ostream& out, const std::string& resume_dir,
                   const TrainHooks& hooks, bool overwrite) {
  // Paths made absolute, so eval, predict and --resume work from any directory.
  const Config c = config.with_absolute_paths(fs::current_path().string());
  const InterruptScope interrupts;  // SIGINT, SIGTERM: stop after the current step
  dist::Communicator& comm = dist::world();
  if (comm.size() == 1) return train_rank(c, out, resume_dir, hooks, overwrite, comm);
  std::ostream quiet(nullptr);  // rank 0 alone prints
  try {
    return train_rank(c, comm.rank() == 0 ? out : quiet, resume_dir, hooks, overwrite, comm);
  } catch (const Interrupted&) {
    throw;  // every rank stopped at the same step
  } catch (const std::exception& e) {
    comm.abort(e.what());  // the other ranks would otherwise wait for this one until the timeout
  }
  return {};  // not reached: abort ends the process
}

namespace {

// Accuracy on `starts` of always predicting the training split's most frequent class.
double majority_accuracy(const SeriesData& d, const std::vector<int64_t>& starts) {
  std::vector<int64_t> count(d.class_names.size(), 0);
  for (int64_t s : d.split.train)
    if (const int64_t k = d.classes[d.target_row(s)]; k >= 0) ++count[k];
  const int64_t majority = std::max_element(count.begin(), count.end()) - count.begin();
  int64_t hits = 0;
  for (int64_t s : starts) hits += d.classes[d.target_row(s)] == majority;
  return starts.empty() ? 0.0 : double(hits) / double(starts.size());
}

}  // namespace

std::map<std::string, double> evaluate(const std::string& run, const std::string& split,
                                       const std::string& data) {
  if (data.empty() && split != "val" && split != "test")
    fail("--split: expected val or test, got '", split, "'");
  LoadedRun r = load_run(run, data, data.empty() ? WindowSet::splits : WindowSet::with_targets);
  if (r.task.kind == "charlm" && !data.empty())
    fail("--data: evaluating a character model on another file is not supported; use --split");
  configure_threads(static_cast<int>(r.config.integer("train.threads")));
  auto be = make_cpu_backend();
  auto model = load_model(*be, r, &std::cerr);
  const Split& s = r.task.split();
  const std::vector<int64_t>& starts = !data.empty() ? s.test : split == "val" ? s.val : s.test;
  if (starts.empty()) {
    if (!data.empty())
      fail(data, ": ", r.task.series.rows, " rows give no window with a target (data.lookback ",
           r.task.series.lookback, " + data.horizon ", r.task.series.horizon, " rows, within one ",
           "series)");
    fail(run, ": the ", split, " split has no windows");
  }
  const int64_t batch_size = r.config.integer("train.batch_size");
  Loader loader(*be, r.task, batch_size, loader_options(r.config, batch_bytes(r.task, batch_size)));
  const auto m = evaluate_split(*be, *model, r.task, starts, loader);
  // Named for what was evaluated: test_*, val_*, or data_* for another file's every window.
  const std::string prefix = data.empty() ? split : "data";
  std::map<std::string, double> out;
  for (const auto& [k, v] : m) out[k.rfind("val_", 0) == 0 ? prefix + k.substr(3) : k] = v;
  out["samples"] = static_cast<double>(starts.size());
  if (r.task.kind == "classify" && data.empty())  // the baseline a classifier has to beat
    out[prefix + "_majority_accuracy"] = majority_accuracy(r.task.series, starts);
  return out;
}

namespace {

// The row's label for a predictions file: its date, else its 1-based data row in the file.
std::string row_label(const SeriesData& d, int64_t row) {
  if (!d.dates.empty()) return d.dates[row];
  return std::to_string((d.file_rows.empty() ? row : d.file_rows[row]) + 1);
}

// When a window's forecast is for: the target row's label when it is in the file, else the last
// date plus horizon steps where the series' dates are regular; "" when unknown (no dates).
std::string forecast_time(const SeriesData& d, int64_t start) {
  const int64_t last = d.last_row(start), target = d.target_row(start);
  const SeriesSpan& s = d.series_of(last);
  if (target < s.end) return row_label(d, target);
  if (d.dates.empty() || !s.regular || s.step <= 0) return "";
  const bool date_only = d.dates[last].size() <= 10;
  return io::format_datetime(d.times[last] + d.horizon * s.step, date_only);
}

// Windows per forward pass of predict: large batches run the GEMMs fastest (512-1024 rows ran
// 1.5x the windows/s of 256 for a 2-layer LSTM of hidden 256), within about 512 MB of the
// activations a forward pass keeps, (T, B, 4H) gates per layer and direction.
int64_t prediction_batch(const ModelOptions& m, int64_t T) {
  const LstmOptions& o = m.lstm;
  const int64_t per_window =
      T * 4 * o.hidden_size * o.num_layers * (o.bidirectional ? 2 : 1) * int64_t{sizeof(float)};
  return std::clamp<int64_t>((int64_t{512} << 20) / std::max<int64_t>(1, per_window), 64, 1024);
}

// The windows predict writes: every window, or the last of each series.
std::vector<int64_t> prediction_windows(const SeriesData& d, bool last_only) {
  if (!last_only) return d.split.test;
  std::vector<int64_t> out;
  for (int64_t start : d.split.test)
    if (!out.empty() && d.series_of(out.back()).begin == d.series_of(start).begin)
      out.back() = start;
    else
      out.push_back(start);
  return out;
}

// The header of a predictions file.
std::string predictions_header(const SeriesData& d, bool multi) {
  std::string csv = multi ? "series," : "";
  csv += "window_end,forecast_for";
  if (d.task == "forecast") {
    for (const auto& name : d.target_names)
      csv +=
          "," + io::csv_field(name) + (d.has_targets ? "," + io::csv_field(name + "_actual") : "");
  } else {
    csv += ",class";
    for (const auto& name : d.class_names) csv += "," + io::csv_field("p_" + name);
    if (d.has_targets) csv += ",actual";
  }
  return csv + "\n";
}

// One window's row of a predictions file from the model's output `o` (O); returns the number of
// predictions left empty (a target transform undone from a value missing in the file).
int64_t append_prediction(const SeriesData& d, int64_t start, const float* o, bool multi,
                          std::string* csv) {
  const int64_t O = d.num_outputs(), target = d.target_row(start);
  const bool known = d.has_targets && target < d.series_of(d.last_row(start)).end;
  if (multi) *csv += io::csv_field(d.series_of(start).name) + ",";
  *csv += row_label(d, d.last_row(start)) + "," + forecast_time(d, start);
  int64_t unknown = 0;
  if (d.task == "forecast") {
    for (int64_t j = 0; j < O; ++j) {
      // The model computes in f32: the prediction's shortest f32 text reads back exactly.
      const double y = d.prediction(start, j, o[j]);
      unknown += std::isnan(y);
      *csv += "," + (std::isnan(y) ? "" : shortest(static_cast<float>(y)));
      const double actual = known ? d.actual(start, j) : NAN;
      if (d.has_targets) *csv += "," + (std::isnan(actual) ? "" : shortest(actual));
    }
  } else {
    const double top = *std::max_element(o, o + O);
    std::vector<double> p(O);
    double total = 0;
    for (int64_t k = 0; k < O; ++k) total += p[k] = std::exp(o[k] - top);
    *csv += "," + io::csv_field(d.class_names[std::max_element(o, o + O) - o]);
    for (int64_t k = 0; k < O; ++k) *csv += "," + shortest(static_cast<float>(p[k] / total));
    if (d.has_targets)
      *csv +=
          "," +
          (known && d.classes[target] >= 0 ? io::csv_field(d.class_names[d.classes[target]]) : "");
  }
  *csv += "\n";
  return unknown;
}

}  // namespace

int64_t predict(const std::string& run, const PredictOptions& options, std::ostream& log) {
  LoadedRun r = load_run(run, options.input, WindowSet::every_window);
  if (r.task.kind != "forecast" && r.task.kind != "classify")
    fail(run, ": predict needs a forecast or classify run; this is a ", r.task.kind, " run",
         r.task.kind == "charlm" ? " (sample from it with seqforge generate)" : "");
  configure_threads(static_cast<int>(r.config.integer("train.threads")));
  const SeriesData& d = r.task.series;
  for (const SeriesSpan& s : d.series)
    if (s.end - s.begin < d.lookback && d.series.size() > 1)
      log << "note: series '" << s.name << "' has " << s.end - s.begin
          << " rows, fewer than data.lookback = " << d.lookback << ": no prediction for it\n";
  const std::vector<int64_t> windows = prediction_windows(d, options.last_only);
  if (windows.empty())
    fail(options.input, ": ", d.rows, " rows", d.series.size() > 1 ? " in every series" : "",
         " are fewer than data.lookback = ", d.lookback, ": no complete window to predict from");
  auto be = make_cpu_backend();
  auto model = load_model(*be, r, &log);
  const bool multi = d.series.size() > 1 || !r.config.str("data.series_column").empty();
  std::string csv = predictions_header(d, multi);
  const int64_t B = prediction_batch(r.task.model, d.lookback);
  const int64_t T = d.lookback, F = d.num_features(), O = d.num_outputs();
  Buffer input_buf;  // (B, T, F) normalised windows
  Rng rng(0);
  double compute_s = 0;
  int64_t unknown = 0;
  for (size_t first = 0; first < windows.size(); first += B) {
    const int64_t n = std::min<int64_t>(B, static_cast<int64_t>(windows.size() - first));
    const double t0 = now_s();
    Tensor x = input_buf.get(*be, DType::f32, {n, T, F});
    for (int64_t i = 0; i < n; ++i)
      d.copy_window(windows[first + i], static_cast<float*>(x.data()) + i * T * F);
    Tensor out = model->forward(*be, x, {}, {}, false, rng);  // (n, O)
    compute_s += now_s() - t0;
    const float* o = static_cast<const float*>(out.data());
    for (int64_t i = 0; i < n; ++i)
      unknown += append_prediction(d, windows[first + i], o + i * O, multi, &csv);
  }
  if (options.output == "-") {
    std::fwrite(csv.data(), 1, csv.size(), stdout);
    std::fflush(stdout);
  } else {
    io::write_file_atomically(options.output, {{csv.data(), csv.size()}});
  }
  char line[160];
  std::snprintf(line, sizeof line,
                "predict: %zu windows in %.3f s (%.0f windows/s, inference only; batch %lld)\n",
                windows.size(), compute_s, windows.size() / std::max(compute_s, 1e-9),
                static_cast<long long>(B));
  log << line << std::flush;
  if (unknown > 0)
    log << "note: " << unknown << " predictions are empty: data.transform of the target is undone "
        << "from the window's last value of it, which is empty in " << options.input << "\n";
  return static_cast<int64_t>(windows.size());
}

std::string generate(const std::string& run, const std::string& prompt, int64_t length,
                     double temperature, int64_t top_k, uint64_t seed) {
  configure_threads();
  LoadedRun r = load_run(run, "");
  if (r.task.kind != "charlm")
    fail(run, ": generate needs a character model (data.task charlm); this is a ", r.task.kind,
         " run", r.task.kind == "mae" ? "" : " (use seqforge predict)");
  if (!(temperature >= 0))
    fail("--temperature must be 0 (always the likeliest character) or more, got ", temperature);
  if (top_k < 0) fail("--top-k must be positive, got ", top_k);
  if (length < 0) fail("--length must be >= 0, got ", length);
  auto be = make_cpu_backend();
  SequenceModel model(r.task.model);
  model.initialize(*be, 0);
  io::load_parameters(r.file.source(), model.parameters(), *be);
  const std::u32string& vocab = r.task.text.vocab;
  std::vector<int64_t> ids;
  const std::u32string start = prompt.empty() ? U"\n" : decode_utf8(prompt, "--prompt");
  for (size_t i = 0; i < start.size(); ++i) {
    const size_t at = vocab.find(start[i]);
    if (at == std::u32string::npos)
      fail("--prompt: character ", i + 1, " ('", encode_utf8(start.substr(i, 1)),
           "') is not in the model's vocabulary");
    ids.push_back(static_cast<int64_t>(at));
  }
  const int64_t D = model.lstm().directions(), L = model.options().lstm.num_layers;
  const int64_t H = model.options().lstm.hidden_size, V = static_cast<int64_t>(vocab.size());
  if (D != 1) fail(run, ": generating needs a unidirectional model");
  std::vector<float> h(D * L * H), cst(D * L * H);
  Rng rng(seed);
  std::string text = prompt;
  // The prompt in one pass, then one character at a time, carrying the LSTM state.
  Tensor input(ids.data(), DType::i64, {1, static_cast<int64_t>(ids.size())});
  Tensor logits = model.forward(*be, input, {}, {}, false, rng);
  int64_t next = 0;
  std::vector<double> p(V);
  for (int64_t n = 0; n < length; ++n) {
    const float* row = static_cast<const float*>(logits.data()) + (logits.dim(0) - 1) * V;
    std::vector<int64_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    next = idx[0];  // temperature 0: the likeliest (the first of equals)
    if (temperature > 0) {
      double total = 0;
      for (int64_t i = 0; i < k; ++i)
        total += p[i] = std::exp((row[idx[i]] - row[idx[0]]) / temperature);
      double u = rng.uniform() * total;
      next = idx[k - 1];
      for (int64_t i = 0; i < k; ++i)
        if ((u -= p[i]) <= 0) {
          next = idx[i];
          break;
        }
    }
    text += encode_utf8(vocab.substr(next, 1));
    std::copy_n(static_cast<const float*>(model.lstm().h_n().data()), h.size(), h.begin());
    std::copy_n(static_cast<const float*>(model.lstm().c_n().data()), cst.size(), cst.begin());
    Tensor one(&next, DType::i64, {1, 1});
    logits = model.forward(*be, one, Tensor(h.data(), DType::f32, {D * L, 1, H}),
                           Tensor(cst.data(), DType::f32, {D * L, 1, H}), false, rng);
  }
  return text;
}

}  // namespace seqforge

// ---- validation predictions and diagnosis (the report and `seqforge diagnose`) -----------------

namespace seqforge {

int64_t write_validation_outputs(const std::string& run) {
  LoadedRun r = load_run(run, "");
  if (r.task.kind == "charlm") return 0;
  const SeriesData& d = r.task.series;
  std::vector<int64_t> starts = d.split.val;
  if (starts.empty()) return 0;
  const bool mae = r.task.kind == "mae";
  if (mae) {  // a few windows spread over the split
    std::vector<int64_t> few;
    for (size_t k = 0; k < 4 && k < starts.size(); ++k)
      few.push_back(starts[k * starts.size() / std::min<size_t>(4, starts.size())]);
    starts = few;
  }
  auto be = make_cpu_backend();
  auto model = load_model(*be, r, nullptr);
  const int64_t batch_size = r.config.integer("train.batch_size"), O = d.num_outputs();
  const int64_t T = d.lookback, F = d.num_features();
  Loader loader(*be, r.task, batch_size, loader_options(r.config, batch_bytes(r.task, batch_size)));
  loader.start(starts, INT64_MAX, {}, 0);
  Rng rng(0);
  const bool dates = !d.dates.empty(), multi = d.series.size() > 1;
  std::string csv = mae ? "window,step,feature,original,reconstructed,masked\n"
                        : std::string("row") + (dates ? ",time" : "") + (multi ? ",series" : "") +
                              ",actual,predicted\n";
  char cells[96];
  for (size_t i = 0; i < starts.size(); i += batch_size) {
    const Batch& b = loader.next();
    Tensor out = model->forward(*be, b.input, {}, {}, false, rng);
    const float* o = static_cast<const float*>(out.data());
    const auto* labels = static_cast<const int64_t*>(b.labels.data());
    for (int64_t k = 0; k < b.size; ++k) {
      const int64_t start = starts[i + k];
      if (mae) {  // (B*T, F) reconstructions and originals, normalised
        const auto* original = static_cast<const float*>(b.target.data());
        const auto* mask = static_cast<const float*>(b.mask.data());
        for (int64_t u = 0; u < T; ++u)
          for (int64_t f = 0; f < F; ++f) {
            const int64_t at = (k * T + u) * F + f;
            std::snprintf(cells, sizeof cells, ",%lld,", static_cast<long long>(u + 1));
            csv += std::to_string(i + k + 1) + cells + io::csv_field(d.feature_names[f]);
            std::snprintf(cells, sizeof cells, ",%.7g,%.7g,%d\n", original[at], o[at],
                          mask[k * T + u] != 0.0f ? 1 : 0);
            csv += cells;
          }
        continue;
      }
      const int64_t row = d.target_row(start);
      csv += std::to_string((d.file_rows.empty() ? row : d.file_rows[row]) + 1);  // 1-based
      if (dates) csv += "," + forecast_time(d, start);
      if (multi) csv += "," + io::csv_field(d.series_of(d.last_row(start)).name);
      if (d.task == "forecast") {  // the first target, in its own units
        std::snprintf(cells, sizeof cells, ",%.7g,%.7g\n", d.actual(start, 0),
                      d.prediction(start, 0, o[k * O]));
        csv += cells;
      } else {
        const int64_t pred = std::max_element(o + k * O, o + (k + 1) * O) - (o + k * O);
        csv += "," + io::csv_field(d.class_names[labels[k]]) + "," +
               io::csv_field(d.class_names[pred]) + "\n";
      }
    }
  }
  const fs::path output = fs::path(run) / (mae ? "val_reconstructions.csv" : "val_predictions.csv");
  io::write_file_atomically(output.string(), {{csv.data(), csv.size()}});
  return static_cast<int64_t>(starts.size());
}

namespace {

// Floats a training step keeps per batch: per layer and direction the gates (T, B, 4H), cell
// state and tanh(c) (T, B, H), the layer output (T, B, D*H), its input gradient (T, B, I_l),
// dropout masks and masked copies; bf16 GEMMs add half-size copies of gates and outputs.
double activation_bytes(const ModelOptions& m, int64_t T, int64_t B, bool bf16) {
  const LstmOptions& o = m.lstm;
  const double D = o.bidirectional ? 2 : 1, H = static_cast<double>(o.hidden_size);
  double floats = 0;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const double I = l == 0 ? static_cast<double>(o.input_size) : D * H;
    double layer = D * (4 * H + 2 * H) + D * H + I;
    if (o.dropout > 0 && l + 1 < o.num_layers) layer += 2 * D * H;
    if (bf16) layer += 0.5 * (D * 4 * H + D * H);
    floats += layer * T * B;
  }
  const double head_rows = m.per_step ? static_cast<double>(T * B) : static_cast<double>(B);
  floats += 2 * head_rows * (D * H + static_cast<double>(m.output_size));
  if (m.vocab_size > 0) floats += 2.0 * T * B * m.embedding_dim;
  return floats * 4;
}

// The nearest existing directory at or above `p`, and whether this process may write there.
bool writable_dir_for(const fs::path& p) {
  fs::path at = fs::absolute(p);
  while (!at.empty() && !fs::exists(at) && at != at.parent_path()) at = at.parent_path();
  return fs::is_directory(at) && access(at.c_str(), W_OK | X_OK) == 0;
}

double available_memory_mb() {
  std::ifstream f("/proc/meminfo");
  for (std::string key; f >> key;) {
    double kb = 0;
    f >> kb;
    if (key == "MemAvailable:") return kb / 1024;
    f.ignore(1 << 10, '\n');
  }
  return 0;
}

}  // namespace

ConfigDiagnosis diagnose_config(const Config& c, int steps) {
  ConfigDiagnosis d;
  std::vector<std::string>& problems = d.problems;
  const int cpus = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  }();
  const int64_t threads = c.integer("train.threads");
  if (threads > cpus)
    problems.push_back("train.threads is " + std::to_string(threads) + " but " +
                       std::to_string(cpus) +
                       " CPUs are available: set train.threads: 0 (one per CPU) or at most " +
                       std::to_string(cpus));
  if (const char* env = std::getenv("OMP_NUM_THREADS");
      threads <= 0 && env && std::atoi(env) > cpus)
    problems.push_back("OMP_NUM_THREADS is " + std::string(env) + " but " + std::to_string(cpus) +
                       " CPUs are available: unset it or set it to at most " +
                       std::to_string(cpus));
  std::string notice;
  const DType gemm = resolve_precision(c.str("train.precision"), &notice);
  if (!notice.empty())
    problems.push_back(notice +
                       ": set train.precision: fp32 (or auto, which picks bf16 only "
                       "where the CPU has it)");
  std::string run_dir = c.str("train.run_dir");
  if (run_dir.empty()) run_dir = (fs::path("runs") / fs::path(c.source()).stem()).string();
  if (!writable_dir_for(run_dir))
    problems.push_back("train.run_dir " + run_dir +
                       " is not writable by this user: set train.run_dir to a writable directory");

  Task task = load_task(c);
  d.task = task.kind;
  d.rows = task.kind == "charlm" ? static_cast<int64_t>(task.text.ids.size()) : task.series.rows;
  const Split& split = task.split();
  d.train = static_cast<int64_t>(split.train.size());
  d.val = static_cast<int64_t>(split.val.size());
  d.test = static_cast<int64_t>(split.test.size());
  d.steps = task.steps();
  d.batch_size = c.integer("train.batch_size");
  {
    SequenceModel model(task.model);
    d.parameters = model.parameters().count();
  }
  const int64_t B = std::max<int64_t>(1, std::min(d.batch_size, std::max<int64_t>(1, d.train)));
  d.batches_per_epoch = d.batch_size > 0 ? (d.train + d.batch_size - 1) / d.batch_size : 0;
  if (const int64_t mb = c.integer("train.max_batches"); mb > 0)
    d.batches_per_epoch = std::min(d.batches_per_epoch, mb);
  const int64_t F = task.kind == "charlm" ? 0 : task.series.num_features();
  const double in_bytes = task.kind == "charlm" ? 16.0 * d.steps
                          : task.kind == "mae"  ? 4.0 * d.steps * (2 * F + 1)
                                                : 4.0 * (d.steps * F + task.series.num_outputs());
  d.batch_input_mb = in_bytes * B / 1048576;
  d.activation_mb = activation_bytes(task.model, d.steps, B, gemm == DType::bf16) / 1048576;

  if (d.train == 0)
    problems.push_back("the training split has no windows: lower data.lookback (" +
                       std::to_string(d.steps) + ") or give more rows, or raise data.split.train");
  if (d.val == 0 && c.number("data.split.val") > 0)
    problems.push_back(
        "the validation split has no windows (training would stop with an error): raise "
        "data.split.val, shorten the windows, or set data.split.val: 0 to train without "
        "validation");
  if (d.test == 0)
    problems.push_back(
        "the test split has no windows (seqforge eval needs some): leave room "
        "after data.split.train + data.split.val");
  if (d.batch_size > d.train && d.train > 0)
    problems.push_back("train.batch_size " + std::to_string(d.batch_size) + " is larger than the " +
                       std::to_string(d.train) + " training windows (one short batch per epoch): " +
                       "lower train.batch_size to at most " + std::to_string(d.train));
  const double avail = available_memory_mb();
  if (avail > 0 && d.activation_mb + d.batch_input_mb > 0.5 * avail)
    problems.push_back("a training step needs about " + std::to_string(int(d.activation_mb)) +
                       " MB but " + std::to_string(int(avail)) +
                       " MB are available: lower train.batch_size or data.lookback");
  if (d.train == 0 || (d.val == 0 && c.number("data.split.val") > 0) || steps <= 0) return d;

  // A short measured run: `steps` training steps (their median; the first pays for start-up) and
  // one validation pass, timed by the profiler's scopes.
  const fs::path tmp =
      fs::temp_directory_path() / ("seqforge-diagnose-" + std::to_string(getpid()));
  const Config short_run = Config::parse(
      c.resolved_yaml(), c.source(),
      {"train.epochs=1", "train.max_batches=" + std::to_string(steps),
       "train.run_dir=" + tmp.string(), "train.save=last", "train.early_stopping.patience=0"});
  const bool was_profiling = profiler::enabled();
  if (!was_profiling) profiler::start();
  std::ostringstream log;
  try {
    train(short_run, log);
  } catch (...) {
    if (!was_profiling) profiler::stop();
    fs::remove_all(tmp);
    throw;
  }
  if (!was_profiling) profiler::stop();
  fs::remove_all(tmp);
  d.measured_peak_mb = process_peak_rss_bytes() / 1048576;
  for (const auto& row : profiler::summary()) {
    if (row.name == "train step") {  // the median: robust to the first step and to noise
      d.timed_steps = static_cast<int>(row.calls);
      d.step_seconds = row.median_ms / 1e3;
    } else if (row.name == "validation") {
      d.validation_seconds = row.total_ms / row.calls / 1e3;
    }
  }
  d.epoch_seconds = d.step_seconds * d.batches_per_epoch + d.validation_seconds;
  return d;
}

}  // namespace seqforge
