#include "seqforge/train/trainer.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "checkpoint_writer.hpp"
#include "device_check.hpp"
#include "io/file_util.hpp"
#include "loop.hpp"
#include "report/metrics_log.hpp"
#include "run.hpp"
#include "run_dir.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/core/interrupt.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/core/resource_monitor.hpp"
#include "seqforge/data/augment.hpp"
#include "seqforge/dist/communicator.hpp"
#include "seqforge/dist/gradient_sync.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/checkpoint.hpp"
#include "seqforge/nn/decoder.hpp"
#include "seqforge/optim/optimizer.hpp"
#include "seqforge/report/report.hpp"
#include "seqforge/train/data_options.hpp"
#include "startup_checks.hpp"
#include "step_graphs.hpp"
#include "task_type.hpp"

namespace seqforge {

namespace fs = std::filesystem;

namespace {

// PEFT's prefix of the names in an adapter file.
constexpr const char* kPeftPrefix = "base_model.model.";

// Throws when a parameter is not finite: no checkpoint may hold such a model. The epoch's steps
// [first_step, last_step] are those that may have made it so; kept_model() says what was saved.
void check_finite_parameters(Backend& be, const Parameters& p, int64_t epoch, int64_t first_step,
                             int64_t last_step, const std::function<std::string()>& kept_model) {
  const Tensor flat = p.values().flat();
  const HostView values(be, flat);
  const float* v = values.data<float>();
  for (int64_t i = 0; i < flat.numel(); ++i)
    if (!std::isfinite(v[i]))
      throw Diverged(printable(detail::concat(
          "epoch ", epoch, ", steps ", first_step, "-", last_step,
          ": the model's parameters are not finite (", v[i],
          ") though the loss was; lower optim.lr or set train.clip_grad_norm. Nothing was saved "
          "from this epoch: ",
          kept_model())));
}

// One rank's training run: set up from the config (data, model, optimizer, loader, run
// directory, a resumed state), then epochs of steps, each epoch validated, reported and saved.
class Training {
 public:
  // `given`: the config as the caller read it (a resumed run's from its config.resolved.yaml).
  Training(const Config& c, const Config& given, std::ostream& out, const std::string& resume_dir,
           const TrainHooks& hooks, bool overwrite, dist::Communicator& comm);
  TrainSummary run();
  const std::string& run_dir() const { return run_dir_; }

 private:
  // The run directory, locked by rank 0 before anything in it is read, written or removed.
  std::string claim_run_dir(const Config& given, const std::string& resume_dir, bool overwrite);
  void build_model();
  void resume_from_state();
  void share_rank0_state();
  void print_start() const;
  // What a run stopped for a non-finite model keeps: the last saved checkpoint (once its write,
  // maybe still under way, has ended), or nothing.
  std::string kept_model();
  void prepare_run_dir();
  void write_adapter_config() const;
  void write_hf_files();
  // A resumed run whose patience ran out after its last whole epoch: it trains no more.
  bool stopped_early() const {
    return s_.patience > 0 && state_.since_best >= s_.patience && !state_.in_epoch;
  }
  void freeze_modules();
  void start_streams();
  // Stateful training: the states batch `bi` starts from (rows reset where its streams begin).
  std::pair<Tensor, Tensor> carried_states(int64_t bi, int64_t rows);
  // One epoch; false when the run ends after it (early stopping, a hook).
  bool run_epoch(int64_t epoch);
  // Starts the loader on this rank's windows of the epoch at `first_batch`; returns its batches.
  int64_t start_pass(int64_t epoch, int64_t first_batch);
  // Forward, backward and the optimizer for batch `bi` (null: this rank has none); its loss.
  double train_step(int64_t epoch, int64_t bi, const Batch* batch);
  // The micro-batches of batch `bi` and their loss terms, and the step's terms on every rank.
  void check_device_step(const Batch& batch);
  void plan_step(int64_t bi, const Batch* batch);
  // The ops of a step for a batch as planned, its losses and gradients' sum of squares into
  // step_stats_.
  void enqueue_step(int64_t bi, const Batch& batch);
  void make_step_graphs();
  // train.micro_batch_size auto: the micro-batch that fits, into s_ and the run's config.
  void resolve_micro_batch(double free_bytes, bool device);
  double read_step();
  void stop_if_signalled(int64_t epoch, int64_t batch, double loss_sum, double seen);
  void progress(int64_t epoch, int64_t batch, int64_t first_batch, double t0, double loss,
                int64_t seen, int64_t seen_before, double* last_progress) const;
  // Validation, early stopping, schedule, checkpoints and the epoch's line; false to stop.
  bool end_epoch(int64_t epoch, double loss_sum, int64_t seen, int64_t seen_before, double t0);
  void append_metrics(const nlohmann::json& j);
  void log_epoch(int64_t epoch, nlohmann::json j, bool saved, double epoch_s, double train_s,
                 double wait_s, double rate, const std::string& stop);
  void save_state(bool in_epoch, int64_t batch, double loss_sum, double seen);
  // What a rank that waits for the others past dist.timeout_seconds says of the run's checkpoints.
  void note_timeout();
  void finish();

  Config c_;  // train.micro_batch_size auto resolved into it (build_model)
  std::ostream& out_;
  const std::string resume_dir_;
  const TrainHooks& hooks_;
  dist::Communicator& comm_;
  const int ranks_, rank_;
  const ThreadConfig threads_;
  // data.path's size and hash as the run loaded it: a resumed run goes on only with the same data.
  std::string data_fingerprint_;
  std::string config_json_hash_;  // a decoder run's config.json as written (kConfigJsonHashKey)
  std::string precision_notice_;
  std::string micro_note_;  // how train.micro_batch_size auto chose
  Task task_;
  DType gemm_dtype_ = DType::f32;  // train.precision as the backend runs it (build_model)
  LoopSettings s_;                 // its micro_batch resolved by build_model where `auto`
  io::DirLock lock_;  // rank 0 owns the run directory from before it touches it to the end
  const std::string run_dir_;
  std::string rank0_dir_;  // on every rank, once rank 0 has shared its state
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 GEMMs: dynamic loss scaling
  std::unique_ptr<StepGraphs> graphs_;  // train.cuda_graphs: steps replayed as one graph
  std::string graphs_note_;             // why there are none (said at start-up), or ""
  bool graphs_off_noted_ = false;       // their turning off said
  bool device_checked_ = false;         // train.device_check ran (or does not apply)
  int64_t graph_steps_before_ = 0;      // steps replayed before this epoch
  // (1 + micro-batches) f64: a step's gradients' sum of squares, then each micro-batch's loss.
  Buffer step_stats_;
  // A batch runs as micro-batches of examples [first, end) whose gradients add up; each one's
  // mean loss weighs terms / step_terms_ in the step's.
  struct MicroBatch {
    int64_t first = 0, end = 0;
    double terms = 0;
  };
  std::vector<MicroBatch> micro_;
  std::vector<double> step_host_;            // step_stats_ read back
  double local_terms_ = 0, step_terms_ = 0;  // this rank's loss terms, every rank's
  // What this rank's mean loss weighs in the epoch's sum: its share of the step's mean times the
  // step's windows, so that the ranks' sums add up to one process's.
  double loss_weight_ = 0;
  bool sync_open_ = false;  // backward's finished gradients go to sync_ (the last micro-batch)
  // Dropout's masks: each step's seed base in backend memory (Backend::set_seed_base), a hash of
  // the run's seed and the step, and the masks' own seeds from `salts_`, the same at every step.
  Buffer seed_base_;
  uint64_t dropout_seed_ = 0;
  Rng salts_{0};
  int64_t skipped_steps_ = 0;  // of this epoch, for an inf or NaN gradient (fp16)
  double grad_norm_ = 0;       // the last step's, before clipping
  OptimizerOptions oo_;
  std::vector<std::string> initialized_;   // parameters loaded from model.init_from
  std::vector<std::string> mapped_heads_;  // heads that took some rows from it, by name
  int64_t global_batch_ = 0, batches_per_epoch_ = 0, total_steps_ = 0;
  int64_t used_ = 0;  // windows of the epoch that fit its batches (all ranks)
  LoopState state_;
  std::vector<int64_t> order_;  // the training windows, shuffled every epoch
  Rng rng_;
  std::string state_path_, checkpoint_, metrics_path_;
  AugmentOptions augment_;
  std::unique_ptr<AugmentCache> augment_cache_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Loader> val_loader_;  // validation's in micro-batches; null: loader_
  std::ofstream metrics_log_;
  std::string kept_metrics_;  // a resumed run's lines of the epochs it keeps
  std::unique_ptr<CheckpointWriter> writer_;
  bool old_predictions_removed_ = false;  // by a resumed run's first checkpoint
  ResourceMonitor resources_;             // cpu_percent, rss_mb, peak_rss_mb per epoch
  std::vector<bool> frozen_;              // held fixed for the first freeze_epochs epochs
  std::unique_ptr<dist::GradientSync> sync_;
  std::vector<int64_t> mine_;  // this rank's windows of the epoch
  Buffer dout_buf_;
  bool tty_ = false, stepped_ = false;           // stepped: a step has run in this process
  bool activations_noted_ = false;               // the model's activation note printed
  bool baselines_noted_ = false;                 // the validation baselines printed
  std::map<std::string, double> saved_metrics_;  // the epoch of the last checkpoint written
  // Stateful training: per position of order_, whether that row's state starts from zeros; the
  // states carried between batches, (L, B, H) each, two pairs used in turn (a batch's backward
  // still reads the states it started from while the next ones are written).
  std::vector<uint8_t> resets_;
  Buffer carry_h_[2], carry_c_[2];
  int carry_at_ = 0;
  TrainSummary summary_;
};

Training::Training(const Config& c, const Config& given, std::ostream& out,
                   const std::string& resume_dir, const TrainHooks& hooks, bool overwrite,
                   dist::Communicator& comm)
    : c_(c),
      out_(out),
      resume_dir_(resume_dir),
      hooks_(hooks),
      comm_(comm),
      ranks_(comm.size()),
      rank_(comm.rank()),
      threads_(configure_rank_threads(c, comm.local_size())),
      task_((check_settings(c), load_task(c))),
      s_((check_validation_split(c, task_), LoopSettings::from(c, task_))),
      run_dir_(claim_run_dir(given, resume_dir, overwrite)),
      rng_(static_cast<uint64_t>(c.integer("train.seed")) ^ 0x5eed5eedull) {
  note_timeout();
  if (rank_ == 0) data_fingerprint_ = io::file_fingerprint(c_.str("data.path"));
  // The order of day and month the dates were read in is the run's: a later file whose dates
  // never pass 12 (predict, eval --data) reads as this one did.
  if (c_.str("data.date_order") == "auto" && !task_.series.date_order.empty())
    c_ = c_.with_values({{"data.date_order", task_.series.date_order}},
                        c_.origin("data.date_order"));
  build_model();
  // So is the precision the run computes in (auto's choice, or fp32 where bf16 fell back): a
  // resume (on another machine, say) and eval keep it. A resume keeps the recorded one: its own
  // fallback (a machine or an ISA cap without bf16 GEMMs) is its leg's alone.
  const bool recorded = !resume_dir_.empty() && c_.str("train.precision") != "auto";
  if (!recorded && c_.str("train.precision") != gemm_precision_name(gemm_dtype_))
    c_ = c_.with_values({{"train.precision", gemm_precision_name(gemm_dtype_)}},
                        c_.origin("train.precision"));
  // Each rank takes batch_size windows of every global batch of ranks * batch_size.
  global_batch_ = ranks_ * s_.batch_size;
  batches_per_epoch_ =
      (static_cast<int64_t>(task_.split().train.size()) + global_batch_ - 1) / global_batch_;
  if (s_.max_batches > 0) batches_per_epoch_ = std::min(batches_per_epoch_, s_.max_batches);
  total_steps_ = batches_per_epoch_ * s_.epochs;
  // The loader's and augmentations' settings are checked before the start-up line: a bad one is
  // the run's only output.
  augment_ = augment_options(c_);
  const LoaderOptions loading = loader_options(c_, batch_bytes(task_, s_.batch_size));
  print_start();
  // The loader, and the augmentation cache (built now: a failure leaves the run directory as it
  // was).
  const uint64_t seed = static_cast<uint64_t>(c_.integer("train.seed"));
  if (augment_.cache)
    augment_cache_ =
        AugmentCache::open(task_, augment_, seed ^ 0xa06e47ull, threads_.threads, out_);
  loader_ = std::make_unique<Loader>(*be_, task_, s_.batch_size, loading);
  if (s_.micro_batch < s_.batch_size)  // validation's batches need no more memory than a step's
    val_loader_ = std::make_unique<Loader>(*be_, task_, s_.micro_batch,
                                           loader_options(c_, batch_bytes(task_, s_.micro_batch)));
  const LoaderOptions& lo = loader_->options();
  out_ << "loader: " << lo.workers << " worker" << (lo.workers == 1 ? "" : "s") << " (" << lo.reason
       << "), prefetch " << lo.prefetch_factor << " batches per worker"
       << (augment_.any()
               ? augment_.cache ? ", augmentations from the cache" : ", augmentations on the fly"
               : "")
       << "\n";
  const std::string default_dir = (fs::path("runs") / fs::path(c_.source()).stem()).string();
  out_ << "run directory: " << run_dir_
       << (resume_dir_.empty() && c_.str("train.run_dir").empty() && run_dir_ != default_dir
               ? " (" + default_dir + " holds another run)"
               : "")
       << "\n"
       << std::flush;
  order_ = task_.split().train;
  if (s_.stateful) start_streams();
  state_ = LoopState::start(s_.mode);
  state_path_ = (fs::path(run_dir_) / "training_state.safetensors").string();
  checkpoint_ = (fs::path(run_dir_) / "model.safetensors").string();
  metrics_path_ = (fs::path(run_dir_) / "metrics.jsonl").string();
  if (!resume_dir_.empty() && rank_ == 0) resume_from_state();
  if (ranks_ > 1) share_rank0_state();
  note_timeout();
  prepare_run_dir();
  if (rank_ == 0 && !model_->frozen_parameters().empty()) write_adapter_config();
  writer_ = std::make_unique<CheckpointWriter>();
  {
    std::vector<Tensor> fixed;  // a base under adapters: the same in every checkpoint
    const Parameters& p = model_->parameters();
    for (size_t i = 0; i < p.size(); ++i)
      if (p.fixed(i)) fixed.push_back(p.value(i));
    writer_->keep_constant(*be_, fixed);
  }
  tty_ = isatty(STDOUT_FILENO) && &out_ == &std::cout;
  summary_.run_dir = run_dir_;
  summary_.checkpoint = checkpoint_;
  summary_.monitor = s_.monitor;
  model_->parameters().zero_grad(*be_);
  freeze_modules();
  // Data parallel: gradients summed across ranks in buckets while backward runs; dropout draws
  // differ per rank.
  if (ranks_ > 1) {
    sync_ = std::make_unique<dist::GradientSync>(comm_, *be_, model_->parameters(),
                                                 static_cast<size_t>(s_.bucket_mb * (1 << 20)));
    model_->set_grad_ready_hook([this](size_t first, size_t end) {
      if (sync_open_) sync_->ready(first, end);
    });
    out_ << "data-parallel: gradients summed "
         << (sync_->on_device() ? "by " + be_->collectives_name()
                                : "through host memory (" + sync_->why_host() + ")")
         << "\n";
  }
}

std::string Training::claim_run_dir(const Config& given, const std::string& resume_dir,
                                    bool overwrite) {
  if (rank_ != 0) return resume_dir;
  if (resume_dir.empty()) return new_run_dir(c_, overwrite, &lock_);
  if (fs::is_directory(resume_dir)) {  // else: nothing to resume
    lock_resumed_run_dir(c_, resume_dir, &lock_);
    check_resumed_config_current(given, resume_dir);
  }
  return resume_dir;
}

void Training::start_streams() {
  if (ranks_ > 1)
    fail(c_.origin("train.stateful"),
         ": train.stateful runs in one process (not under mpirun with ", ranks_, " ranks)");
  StatefulStreams streams = checked_stateful_streams(c_, task_, s_.batch_size);
  order_ = std::move(streams.order);
  resets_ = std::move(streams.reset);
  batches_per_epoch_ =
      s_.max_batches > 0 ? std::min(streams.batches, s_.max_batches) : streams.batches;
  total_steps_ = batches_per_epoch_ * s_.epochs;
  const RecurrentOptions& o = task_.model.rnn;
  const Shape h_shape{o.num_layers, s_.batch_size, o.state_size()},
      c_shape{o.num_layers, s_.batch_size, o.hidden_size};
  for (int k = 0; k < 2; ++k) {
    be_->fill(carry_h_[k].get(*be_, DType::f32, h_shape), 0);
    if (cell_type(o.cell).cell_state) be_->fill(carry_c_[k].get(*be_, DType::f32, c_shape), 0);
  }
  out_ << "stateful: " << s_.batch_size << " streams of " << streams.batches
       << " consecutive chunks each; states carried between batches, reset at each epoch, "
          "series boundary and gap\n";
  // The chunks that do not fill a stream are not trained on: say so when that is a real share.
  const int64_t left_out = streams.chunks - streams.batches * s_.batch_size;
  if (left_out * 10 >= streams.chunks)
    out_ << "warning: train.stateful: " << left_out << " of the " << streams.chunks
         << " training chunks are left out (they do not fill " << s_.batch_size
         << " streams of equal length); a smaller train.batch_size trains on more of them\n";
}

std::pair<Tensor, Tensor> Training::carried_states(int64_t bi, int64_t rows) {
  const RecurrentOptions& o = task_.model.rnn;
  const int64_t B = s_.batch_size;
  Tensor h = carry_h_[carry_at_].get(*be_, DType::f32, {o.num_layers, B, o.state_size()});
  Tensor c = cell_type(o.cell).cell_state
                 ? carry_c_[carry_at_].get(*be_, DType::f32, {o.num_layers, B, o.hidden_size})
                 : Tensor();
  for (Tensor state : {h, c}) {
    if (state.empty()) continue;
    const int64_t width = state.dim(2);
    for (int64_t i = 0; i < rows; ++i)
      if (resets_[bi * B + i])  // window i starts a stretch: zero its row in every layer
        for (int64_t l = 0; l < o.num_layers; ++l)
          be_->fill(state.reshape({o.num_layers * B, width}).slice(l * B + i, l * B + i + 1), 0.0);
  }
  return {h, c};
}

void Training::build_model() {
  be_ = make_device_backend(c_, task_.model);
  gemm_dtype_ = model_precision(c_.str("train.precision"), *be_, task_.model, &precision_notice_);
  if (task_.model.adapter.bf16_base && gemm_dtype_ != DType::bf16)
    fail(c_.origin("adapter.base_precision"), ": adapter.base_precision bf16 needs bf16 GEMMs (",
         precision_notice_.empty() ? "train.precision: bf16" : precision_notice_, ")");
  const uint64_t seed = static_cast<uint64_t>(c_.integer("train.seed"));
  model_ = make_model(task_.model);
  check_model_fits(*model_, c_, true);
  size_t free = 0, total = 0;
  std::string device;
  const bool own_memory = be_->device_memory(&free, &total, &device);
  // On the CPU, the memory this process may take: the machine's (or its container's) available
  // memory, shared by the ranks on this machine.
  const double room = own_memory
                          ? double(free)
                          : double(available_memory_bytes()) / std::max(1, comm_.local_size());
  if (c_.str("train.micro_batch_size") == "auto") resolve_micro_batch(room, own_memory);
  {  // a step that cannot fit is refused before anything is allocated, naming what fits
    const int64_t rows = std::min<int64_t>(
        s_.micro_batch, std::max<int64_t>(1, static_cast<int64_t>(task_.split().train.size())));
    const std::string key =
        s_.micro_batch < s_.batch_size ? "train.micro_batch_size" : "train.batch_size";
    if (const std::string problem =
            step_fit_problem(room, own_memory ? device : "this machine", *model_, task_.model,
                             task_.steps(), rows, gemm_dtype_ != DType::f32, nullptr, own_memory);
        !problem.empty())
      fail(c_.origin(key), ": ", key, " ", c_.integer(key), ": ", problem);
  }
  model_->initialize(*be_, seed);
  model_->set_gemm_dtype(gemm_dtype_);
  model_->set_input_grad(false);
  if (std::string init = c_.str("model.init_from");
      !init.empty() && resume_dir_.empty() && rank_ == 0 &&
      task_.model.family == ModelFamily::decoder) {  // a Hugging Face folder
    if (c_.boolean("model.from_config")) {           // its weights are not read
      out_ << "from_config: a new " << task_.model.decoder.model_type << " model of " << init
           << "/config.json's shape\n";
    } else {
      auto& decoder = static_cast<Decoder&>(*model_);
      const bool scores = load_hf_weights(init, decoder, *be_);
      if (scores) check_classifier_labels(init, task_.text.class_names);
      const auto& fresh = decoder.fresh_parameters();
      for (const auto& e : decoder.parameters().values().entries())
        if (std::find(fresh.begin(), fresh.end(), e.name) == fresh.end() ||
            (scores && e.name == "score.weight"))
          initialized_.push_back(e.name);
      model_->init_adapters(*be_, {});
    }
  } else if (!init.empty() && resume_dir_.empty() && rank_ == 0) {  // the others get rank 0's
    if (fs::is_directory(init)) init = (fs::path(init) / "model.safetensors").string();
    // A base model's checkpoint holds no adapters nor a new head: they keep their start, and
    // DoRA's magnitudes not in the file are taken from the loaded weights; an adapter run's are
    // kept as saved.
    const std::vector<std::string> modules = c_.list("model.init_from_modules");
    check_init_feature_count(init, task_, modules);
    // A head trained for other classes or targets: its rows follow their names, loaded apart.
    const std::vector<std::string> heads =
        heads_by_name(init, c_, task_, model_->parameters(), modules);
    std::vector<std::string> ignored = model_->unused_base_tensors();
    ignored.insert(ignored.end(), heads.begin(), heads.end());
    try {
      initialized_ = load_parameters(
          init, model_->parameters(), *be_, false, modules, model_->fresh_parameters(), ignored,
          model_->tied_base_tensors(),
          modules.empty() ? " (model.init_from_modules loads only the modules it names, the "
                            "others starting new: a new head, say)"
                          : "");
    } catch (const Error& e) {  // a tensor of another shape, or a layer more: which key differs
      const std::string differences = init_model_differences(init, c_);
      if (differences.empty()) throw;
      throw Error(e.what() + differences);
    }
    match_init_features(init, c_, task_, initialized_, model_->parameters(), *be_, out_);
    // The rows a head took are said in its note, not counted as whole tensors loaded.
    mapped_heads_ = load_heads_by_name(init, c_, task_, heads, model_->parameters(), *be_, out_);
    if (!modules.empty() && initialized_.empty() && mapped_heads_.empty())
      fail(c_.origin("model.init_from_modules"), ": model.init_from_modules loads nothing from ",
           init, ": its head stands for other classes or outputs than this run's (said above)");
    model_->init_adapters(*be_, initialized_);
  }
  oo_.kind = c_.str("optim.kind");
  oo_.lr = c_.number("optim.lr");
  oo_.weight_decay = c_.number("optim.weight_decay");
  oo_.decay_matrices_only = c_.str("optim.decay_params") == "matrices";
  oo_.beta1 = c_.number("optim.beta1");
  oo_.beta2 = c_.number("optim.beta2");
  oo_.eps = c_.number("optim.eps");
  oo_.momentum = c_.number("optim.momentum");
  oo_.nesterov = c_.boolean("optim.nesterov");
  optimizer_ = std::make_unique<Optimizer>(*be_, model_->parameters(), oo_);
  if (gemm_dtype_ == DType::f16) scaler_ = std::make_unique<LossScaler>();
  be_->set_seed_base(static_cast<const uint64_t*>(seed_base_.get(*be_, DType::i64, {1}).data()));
  dropout_seed_ = mix_seed(seed, 0xd50b0a5e);
  make_step_graphs();
}

void Training::resolve_micro_batch(double free_bytes, bool device) {
  const int64_t rows =
      std::min<int64_t>(s_.batch_size, std::max<int64_t>(1, int64_t(task_.split().train.size())));
  int64_t micro = rows;
  if (s_.stateful)
    micro_note_ =
        "train.micro_batch_size auto: the whole batch (train.stateful carries its "
        "streams whole)";
  else
    micro = auto_micro_batch(*model_, task_.model, task_.steps(), rows, gemm_dtype_ != DType::f32,
                             free_bytes, device, &micro_note_);
  // 0, where not one example fits: the whole batch, which the device's check refuses by name.
  s_.micro_batch = micro >= 1 && micro < rows ? micro : s_.batch_size;
  const std::string key = "train.micro_batch_size";
  c_ = c_.with_values({{key, std::to_string(s_.micro_batch < s_.batch_size ? s_.micro_batch : 0)}},
                      c_.origin(key));
}

void Training::make_step_graphs() {
  const std::string setting = c_.str("train.cuda_graphs");
  if (setting != "auto" && setting != "off")
    fail(c_.origin("train.cuda_graphs"), ": train.cuda_graphs must be auto or off, got '", setting,
         "'");
  if (setting == "off" || !be_->captures()) return;
  if (s_.stateful)
    graphs_note_ = "train.cuda_graphs: stateful steps carry states from batch to batch; eager";
  else if (ranks_ > 1)
    graphs_note_ = "train.cuda_graphs: data-parallel steps all-reduce from the host; eager";
  else if (s_.micro_batch < s_.batch_size && task_type(task_.kind).loss_terms_vary())
    graphs_note_ =
        "train.cuda_graphs: micro-batches weigh their losses by the masked steps "
        "each holds, which change from batch to batch; eager";
  if (!graphs_note_.empty()) return;
  StepGraphs::Hooks hooks;
  hooks.enqueue = [this](const Batch& b) { enqueue_step(0, b); };
  hooks.host_key = [this] {
    return std::to_string(optimizer_->segment_count()) + "," +
           std::to_string(scaler_ ? scaler_->scale() : 1.0);
  };
  hooks.replayed = [this] { optimizer_->count_step(); };
  auto saved = std::make_shared<std::pair<int64_t, std::vector<int64_t>>>();
  hooks.save = [this, saved] { *saved = {optimizer_->steps(), optimizer_->param_steps()}; };
  hooks.restore = [this, saved] { optimizer_->set_steps(saved->first, saved->second); };
  graphs_ = std::make_unique<StepGraphs>(*be_, std::move(hooks));
}

void Training::print_start() const {
  const Split& split = task_.split();
  out_ << "seqforge " << SEQFORGE_VERSION << ": " << task_name(task_.kind) << ", "
       << split.train.size() << " training / " << split.val.size() << " validation / "
       << split.test.size() << " test " << task_type(task_.kind).samples() << ", "
       << model_->parameters().count() << " parameters, " << threads_.threads
       << (threads_.threads == 1 ? " thread (" : " threads (") << threads_.reason << "), "
       << gemm_precision_name(gemm_dtype_) << " GEMMs"
       << (scaler_ ? " with dynamic loss scaling" : "") << " (" << be_->description() << ")\n";
  if (ranks_ > 1)
    out_ << "data-parallel: " << ranks_ << " processes (" << comm_.name() << "), batch "
         << s_.batch_size << " per process, " << global_batch_ << " per step\n";
  if (s_.micro_batch < s_.batch_size)
    out_ << "micro-batches: each batch of " << s_.batch_size << " runs as "
         << (s_.batch_size + s_.micro_batch - 1) / s_.micro_batch << " micro-batches of up to "
         << s_.micro_batch << ", their gradients summed before the step\n";
  if (!micro_note_.empty()) out_ << "note: " << micro_note_ << "\n";
  if (!precision_notice_.empty()) out_ << "note: " << precision_notice_ << "\n";
  if (!graphs_note_.empty() && rank_ == 0) out_ << "note: " << graphs_note_ << "\n";
  if (!threads_.warning.empty()) out_ << "warning: " << threads_.warning << "\n";
  const RecurrentOptions& rnn = task_.model.rnn;
  const bool recurrent = task_.model.family == ModelFamily::recurrent;
  if (const AdapterOptions& a = task_.model.adapter; a.kind != AdapterKind::none) {
    const std::vector<bool> frozen = model_->frozen_parameters();
    const Parameters& p = model_->parameters();
    int64_t trainable = 0;
    for (size_t i = 0; i < p.size(); ++i)
      if (!frozen[i]) trainable += p.value(i).numel();
    std::string targets;
    for (const std::string& x : a.targets) targets += (targets.empty() ? "" : ", ") + x;
    char share[32];
    std::snprintf(share, sizeof share, "%.2f%%", 100.0 * double(trainable) / double(p.count()));
    const bool decoder = task_.model.family == ModelFamily::decoder;
    const int64_t layers = recurrent ? rnn.num_layers
                           : decoder ? task_.model.decoder.num_layers
                                     : task_.model.transformer.n_layer;
    out_ << "adapters: " << (a.kind == AdapterKind::lora ? "lora" : "dora") << " rank " << a.rank
         << ", alpha " << a.alpha << " on " << targets << " of " << layers
         << (recurrent || decoder ? " layer" : " block") << (layers == 1 ? "" : "s");
    if (a.dropout > 0)
      out_ << ", dropout " << a.dropout
           << (recurrent ? " on the entries of A (DropConnect)" : " on the adapters' inputs");
    out_ << ": " << trainable << " trainable parameters (" << share << "), the base frozen\n";
  }
  if (!recurrent && (task_.model.transformer.checkpoint_activations ||
                     task_.model.decoder.checkpoint_activations))
    out_ << "activation checkpointing: each "
         << (task_.model.family == ModelFamily::decoder ? "layer" : "block")
         << "'s activations recomputed in backward\n";
  for (const std::string& w : ignored_settings(c_)) out_ << "warning: " << w << "\n";
  if (recurrent && rnn.variational_dropout && rnn.dropout == 0)
    out_ << "warning: model.dropout_mode is variational but model.dropout is 0: nothing is "
            "dropped\n";
  if (recurrent && !rnn.variational_dropout && rnn.dropout > 0 && rnn.num_layers == 1)
    out_ << "warning: model.dropout " << rnn.dropout
         << " drops between layers and model.layers is 1: nothing is dropped (model.dropout_mode: "
            "variational drops inputs and states)\n";
  for (const std::string& note : task_.notes()) out_ << "note: " << printable(note) << "\n";
  if (task_.kind == TaskKind::forecast && s_.monitor != "val_mase")
    if (const std::string why = metric_absent(task_, "val_mase"); !why.empty())
      out_ << "note: val_mase is left out: " << why << "\n";
  if (c_.str("data.split.mode") == "random")
    out_ << "split: " << (task_.is_text() ? "chunks" : "whole windows")
         << " dealt at random to training, validation and test (data.split.mode: random, "
            "train.seed "
         << c_.integer("train.seed") << ")"
         << (task_.is_text() ? "" : "; windows that overlap share rows across the splits") << "\n";
  else if (!task_.is_text() && task_.series.series.size() > 1)
    out_ << "series: " << task_.series.series.size() << " in " << task_.path << " ("
         << c_.str("data.series_column") << "), split "
         << (c_.str("data.split.by") == "date" ? "at shared dates"
                                               : "at the same fractions of each")
         << "\n";
  if (task_.kind == TaskKind::text_classify && task_.text.truncated > 0)
    out_ << "note: " << task_.text.truncated << " examples are longer than data.seq_len "
         << task_.text.seq_len << " and were cut (the longer text of a pair first)\n";
  if (!initialized_.empty()) {
    std::vector<std::string> modules;
    int64_t values = 0;
    for (const std::string& name : initialized_) {
      const std::string module = name.substr(0, name.find('.'));
      if (std::find(modules.begin(), modules.end(), module) == modules.end())
        modules.push_back(module);
      values += model_->parameters().values().find(name)->shape.numel();
    }
    std::string list;
    for (const std::string& m : modules) list += (list.empty() ? "" : ", ") + m;
    out_ << "init_from: " << initialized_.size() << " tensors (" << values << " values) of " << list
         << " from " << c_.str("model.init_from") << "\n";
    std::string fresh;
    for (const std::string& name : model_->fresh_parameters())
      if (name.rfind("base_model.model.", 0) != 0 &&
          std::find(initialized_.begin(), initialized_.end(), name) == initialized_.end() &&
          std::find(mapped_heads_.begin(), mapped_heads_.end(), name) == mapped_heads_.end())
        fresh += (fresh.empty() ? "" : ", ") + name;
    if (!fresh.empty())
      out_ << "init_from: newly initialised (not in the checkpoint): " << fresh << "\n";
  }
  if (split.val.empty())
    out_ << "no validation (data.split.val is 0): no val_* metrics; " << s_.monitor
         << " decides early stopping and the best checkpoint\n";
}

// The saved sample order, checked before any entry indexes the data: the training split's
// windows, each as often as the split holds it (stateful streams: their order exactly).
std::vector<int64_t> saved_order(const io::SafetensorsFile& state, const std::vector<int64_t>& now,
                                 bool stateful) {
  const io::SafetensorsEntry* o = state.find("order");
  if (!o) fail(state.source(), ": missing tensor 'order' (the sample order)");
  if (o->dtype != DType::i64 || o->shape.size() != 1)
    fail(state.source(), ": tensor 'order' is ", dtype_safetensors_name(o->dtype), " ",
         Shape(o->shape).str(), ", expected I64 of one dimension");
  if (o->shape[0] != static_cast<int64_t>(now.size()))
    fail(state.source(), ": tensor 'order' holds ", o->shape[0],
         " windows, the training split has ", now.size(), " now (the data or its split changed?)");
  std::vector<int64_t> order(now.size());
  load_tensor(state, "order",
              Tensor(order.data(), DType::i64, {static_cast<int64_t>(order.size())}), nullptr);
  if (stateful) {
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i] != now[i])
        fail(state.source(), ": tensor 'order': entry ", i, " is ", order[i],
             ", the stateful streams' chunk there starts at ", now[i],
             " (the data or train.batch_size changed?)");
    return order;
  }
  std::vector<int64_t> sorted = now;
  std::sort(sorted.begin(), sorted.end());
  std::vector<bool> taken(sorted.size(), false);
  for (size_t i = 0; i < order.size(); ++i) {
    auto at = std::lower_bound(sorted.begin(), sorted.end(), order[i]);
    if (at == sorted.end() || *at != order[i])
      fail(state.source(), ": tensor 'order': entry ", i, " is ", order[i],
           ", not a window of the training split");
    size_t k = static_cast<size_t>(at - sorted.begin());
    while (k < sorted.size() && sorted[k] == order[i] && taken[k]) ++k;
    if (k == sorted.size() || sorted[k] != order[i])
      fail(state.source(), ": tensor 'order': entry ", i, " repeats window ", order[i],
           " (the order must hold each training window once)");
    taken[k] = true;
  }
  return order;
}

// Everything the loop carries from epoch to epoch, from the run's training state. Every value
// is checked before it is used: a damaged or foreign state is refused, naming the tensor or
// field.
void Training::resume_from_state() {
  if (!fs::exists(state_path_))
    fail(state_path_, ": missing: this run has nothing to resume from",
         fs::exists(checkpoint_) ? " (it stopped before its first training state was saved): "
                                   "train it anew with --overwrite"
                                 : "");
  const io::SafetensorsFile state = io::SafetensorsFile::read(state_path_);
  state.check_data_hash();
  const auto loop = state.metadata().find("seqforge.loop");
  if (loop == state.metadata().end()) fail(state_path_, ": no seqforge.loop metadata");
  LoopState saved = LoopState::from_json(loop->second, state_path_);
  // The sample order, the normalizers and the best score so far all belong to the data the run
  // began with: another file's rows of the same count would go on silently from them.
  if (const auto data = state.metadata().find("seqforge.data");
      data != state.metadata().end() && !data->second.empty() && !data_fingerprint_.empty() &&
      !io::same_fingerprint(c_.str("data.path"), data->second, data_fingerprint_)) {
    const auto then = state.metadata().find("seqforge.config");
    const std::string began_on =
        then == state.metadata().end()
            ? ""
            : Config::parse(then->second, state_path_ + " (stored config)").str("data.path");
    const std::string advice = detail::concat(
        ": --resume goes on with the data the run began with; start a new run (model.init_from=",
        run_dir_, "/model.safetensors) for new data");
    if (!began_on.empty() && began_on != c_.str("data.path"))
      fail(c_.origin("data.path"), ": data.path is ", c_.str("data.path"), ", the run began on ",
           began_on, advice);
    fail(c_.str("data.path"), ": changed since the run saved its state (", data->second, " then, ",
         data_fingerprint_, " now)", advice);
  }
  // A cosine schedule spans the run's steps: resumed with more (or fewer) epochs or batches, the
  // rate from here follows the new length, which the uninterrupted run would not have had.
  if (const auto then = state.metadata().find("seqforge.config");
      s_.schedule == "cosine" && then != state.metadata().end()) {
    const Config was = Config::parse(then->second, state_path_ + " (stored config)");
    const auto length = [](int64_t epochs, int64_t max_batches) {
      return std::to_string(epochs) + (epochs == 1 ? " epoch" : " epochs") +
             (max_batches > 0 ? " of at most " + std::to_string(max_batches) + " batches" : "");
    };
    const int64_t epochs = was.integer("train.epochs"),
                  max_batches = was.integer("train.max_batches");
    if (epochs != s_.epochs || max_batches != s_.max_batches)
      out_ << "note: train.schedule cosine now spans " << length(s_.epochs, s_.max_batches)
           << " (the run began with " << length(epochs, max_batches)
           << "): the rate from here follows the new length\n";
  }
  const auto& p = model_->parameters();
  if (saved.in_epoch && saved.batch_windows > 0 && saved.batch_windows != global_batch_)
    fail(state_path_, ": the run stopped part-way through epoch ", saved.epochs_done + 1, " after ",
         saved.batch, " batches of ", saved.batch_windows,
         " windows (train.batch_size x ranks); batches of ", global_batch_,
         " would skip or repeat windows of that epoch: resume with the same train.batch_size "
         "and ranks");
  saved.check(state_path_, p.size(), batches_per_epoch_);
  auto tensors = named(p, p.values(), "param.");
  for (int k = 0; k < (oo_.kind == "sgd" ? 1 : 2); ++k)
    for (auto& t : named(p, optimizer_->state(k), "optim." + std::to_string(k) + "."))
      tensors.push_back(t);
  // Adam's second moments are squares: a negative one would make its step NaN.
  for (const auto& [name, t] : tensors)
    load_tensor(state, name, t, be_.get(), oo_.kind != "sgd" && name.rfind("optim.1.", 0) == 0);
  std::vector<int64_t> order = saved_order(state, order_, s_.stateful);
  std::array<uint64_t, 4> words{};
  load_tensor(state, "rng", Tensor(words.data(), DType::i64, {4}), nullptr);
  if (words == std::array<uint64_t, 4>{})  // xoshiro's one state it never leaves
    fail(state_path_, ": tensor 'rng' is all zeros, not a generator's state");
  std::set<std::string> known = {"order", "rng"};
  for (const auto& [name, t] : tensors) known.insert(name);
  if (s_.stateful && saved.in_epoch) {
    load_tensor(state, "carry.h", carry_h_[carry_at_].tensor(), be_.get());
    known.insert("carry.h");
    if (cell_type(task_.model.rnn.cell).cell_state) {
      load_tensor(state, "carry.c", carry_c_[carry_at_].tensor(), be_.get());
      known.insert("carry.c");
    }
  }
  for (const io::SafetensorsEntry& e : state.entries())
    if (!known.count(e.name))
      fail(state_path_, ": tensor ", io::quoted(e.name),
           " is none of this run's state (its parameters, their optimizer moments, the order, "
           "the generator): the state is damaged or not this run's");
  order_ = std::move(order);
  rng_.set_state(words);
  state_ = std::move(saved);
  optimizer_->set_steps(state_.optimizer_steps, state_.param_steps);
  int64_t kept = 0, saved_epoch = 0;
  // The run goes on, so no kept line says it ended ("stop"); unless, with nothing to train
  // (run() says so), the last epoch's line says it ended there.
  const bool nothing_to_train = stopped_early() || state_.epochs_done >= s_.epochs;
  if (fs::exists(metrics_path_))
    for (nlohmann::json j : read_metrics_log(metrics_path_).epochs)
      if (j["epoch"].get<int64_t>() <= state_.epochs_done) {
        j.erase("stop");
        if (nothing_to_train && j["epoch"].get<int64_t>() == state_.epochs_done)
          j["stop"] = state_.epochs_done >= s_.epochs ? "epochs" : "early_stopping";
        kept_metrics_ += j.dump() + "\n";
        ++kept;
        if (j.value("checkpoint", false)) saved_epoch = j["epoch"].get<int64_t>();
      }
  if (saved_epoch > 0 && !fs::exists(checkpoint_))
    fail(checkpoint_, ": missing, though epoch ", saved_epoch,
         " saved it (metrics.jsonl): the run's saved model is gone, and its training state does "
         "not hold it; put it back, or start a new run");
  // The saved model is read at the run's end (its test split): damaged, it is refused now, not
  // after the epochs.
  if (fs::exists(checkpoint_)) io::SafetensorsFile::read(checkpoint_).check_data_hash();
  if (kept < state_.epochs_done)
    out_ << "note: " << metrics_path_ << " holds lines for " << kept << " of the "
         << state_.epochs_done
         << " epochs done (the others were lost or cut short): the report shows those it has\n";
  if (scaler_ && state_.loss_scale > 0)
    scaler_->set_state(state_.loss_scale, state_.loss_scale_growth);
  if (state_.in_epoch)
    out_ << "resuming " << run_dir_ << " in epoch " << state_.epochs_done + 1 << " after batch "
         << state_.batch << "\n";
  else
    out_ << "resuming " << run_dir_ << " after epoch " << state_.epochs_done << "\n";
}

// Every rank starts from rank 0's parameters and loop state (initialised or resumed).
void Training::share_rank0_state() {
  auto bytes = [&](void* p, size_t n) { comm_.broadcast({static_cast<std::byte*>(p), n}); };
  int64_t windows = static_cast<int64_t>(order_.size());
  bytes(&windows, sizeof windows);
  if (windows != static_cast<int64_t>(order_.size()))
    fail("rank ", rank_, " has ", order_.size(), " training windows, rank 0 has ", windows,
         " (different data on this machine?)");
  Parameters& p = model_->parameters();
  auto share = [&](Tensor t) {
    HostView v(*be_, t, HostView::Access::read_write);
    bytes(v.data<float>(), t.nbytes());
    v.upload();
  };
  share(p.values().flat());
  for (int k = 0; k < (oo_.kind == "sgd" ? 1 : 2); ++k) share(optimizer_->state(k).flat());
  bytes(order_.data(), order_.size() * sizeof(int64_t));
  std::array<uint64_t, 4> words = rng_.state();
  bytes(words.data(), sizeof words);
  rng_.set_state(words);
  int64_t dir_size = static_cast<int64_t>(run_dir_.size());  // rank 0's, named on a timeout
  bytes(&dir_size, sizeof dir_size);
  std::string dir = rank_ == 0 ? run_dir_ : std::string(static_cast<size_t>(dir_size), '\0');
  bytes(dir.data(), dir.size());
  rank0_dir_ = dir;
  if (rank_ == 0 && resume_dir_.empty()) {
    state_.optimizer_steps = optimizer_->steps();
    state_.param_steps = optimizer_->param_steps();
  }
  if (rank_ == 0) state_.param_steps.resize(p.size(), 0);
  if (rank_ == 0 && scaler_) {
    state_.loss_scale = scaler_->scale();
    state_.loss_scale_growth = scaler_->growth_tracker();
  }
  state_.broadcast(comm_);
  optimizer_->set_steps(state_.optimizer_steps, state_.param_steps);
  if (scaler_ && state_.loss_scale > 0)
    scaler_->set_state(state_.loss_scale, state_.loss_scale_growth);
}

std::string Training::kept_model() {
  try {
    writer_->flush();
  } catch (const Error& e) {  // what the log says was kept is not: that is the error
    fail(e.what(), "; and then training diverged");
  }
  return fs::exists(checkpoint_) ? checkpoint_ + " holds the last finite model"
                                 : "no model was saved yet (" + checkpoint_ + " does not exist)";
}

// The run's files are touched only now that everything has been checked, by rank 0 (which holds
// the directory's lock).
void Training::prepare_run_dir() {
  if (rank_ != 0) return;
  if (resume_dir_.empty())  // --overwrite: the old run's files go first
    for (const std::string& name : kRunFiles) fs::remove(fs::path(run_dir_) / name);
  fs::create_directories(run_dir_);
  const std::string yaml = c_.resolved_yaml();
  io::write_file_atomically((fs::path(run_dir_) / "config.resolved.yaml").string(),
                            {{yaml.data(), yaml.size()}});
  // metrics.jsonl keeps a resumed run's epochs before the next one (a line cut short by a kill
  // is dropped, and so is the test split's line); it is replaced atomically, then appended to,
  // a flushed line per epoch.
  io::write_file_atomically(metrics_path_, {{kept_metrics_.data(), kept_metrics_.size()}});
  metrics_log_.open(metrics_path_, std::ios::app);
  if (task_.model.family == ModelFamily::decoder) write_hf_files();
}

// A decoder run's directory is a Hugging Face folder too: the base's config.json (a classifier's
// with its labels), the tokenizer's files, and model.safetensors under HF's names, so that a
// later run (model.init_from) or transformers' from_pretrained reads it.
void Training::write_hf_files() {
  const fs::path base(c_.str("model.init_from")), dir(run_dir_);
  const auto write = [&](const std::string& name, const std::string& text) {
    io::write_file_atomically((dir / name).string(), {{text.data(), text.size()}});
  };
  // A resumed run keeps the config.json it began with: the base's may have been saved again since
  // (its metadata changed, the model not: check_run_inputs), and the run's checkpoints name the
  // copy's hash.
  const fs::path own = dir / "config.json";
  const fs::path source = !resume_dir_.empty() && fs::exists(own) ? own : base / "config.json";
  nlohmann::ordered_json config =
      nlohmann::ordered_json::parse(io::read_file(source.string()), nullptr, false);
  if (config.is_object() && task_.kind == TaskKind::text_classify) {
    const std::vector<std::string>& names = task_.text.class_names;
    nlohmann::ordered_json id2label = nlohmann::ordered_json::object(),
                           label2id = nlohmann::ordered_json::object();
    for (size_t i = 0; i < names.size(); ++i) {
      id2label[std::to_string(i)] = names[i];
      label2id[names[i]] = i;
    }
    config["id2label"] = id2label;
    config["label2id"] = label2id;
    const std::string& type = task_.model.decoder.model_type;
    config["architectures"] = {type == "qwen2"   ? "Qwen2ForSequenceClassification"
                               : type == "llama" ? "LlamaForSequenceClassification"
                                                 : "Gemma3ForSequenceClassification"};
  }
  const std::string config_text = config.dump(2) + "\n";
  write("config.json", config_text);
  config_json_hash_ = config_json_hash(config_text);
  write("tokenizer.json", io::read_file(task_.text.tokenizer));
  // The tokenizer's companions from beside it (its end-of-text token is read there), else the
  // base's.
  const fs::path beside = fs::path(task_.text.tokenizer).parent_path();
  for (const char* extra : {"tokenizer_config.json", "special_tokens_map.json"})
    if (fs::exists(beside / extra))
      write(extra, io::read_file((beside / extra).string()));
    else if (fs::exists(base / extra))
      write(extra, io::read_file((base / extra).string()));
}

// PEFT's adapter_config.json for the run's adapters: peft.PeftModel.from_pretrained reads it
// with adapter_model.safetensors.
void Training::write_adapter_config() const {
  const TransformerOptions& t = task_.model.transformer;
  const AdapterOptions& a = task_.model.adapter;
  nlohmann::json modules_to_save = nullptr;
  if (task_.model.family == ModelFamily::recurrent) {
    modules_to_save = {"head"};
  } else if (task_.model.family == ModelFamily::decoder) {
    if (task_.model.decoder.num_labels > 0) modules_to_save = {"score"};
  } else if (t.num_classes > 0) {
    modules_to_save = {"classifier"};
    if (t.segments > 0) modules_to_save.push_back("transformer.wse");
  }
  nlohmann::json task_type = nullptr;  // PEFT's task types: a language model, a classifier
  if (task_.is_lm()) task_type = "CAUSAL_LM";
  if (task_.kind == TaskKind::classify || task_.kind == TaskKind::text_classify)
    task_type = "SEQ_CLS";
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", task_type},
      {"base_model_name_or_path", c_.str("model.init_from")},
      {"r", a.rank},
      {"lora_alpha", a.alpha},
      {"lora_dropout", a.dropout},
      {"use_dora", a.kind == AdapterKind::dora},
      {"target_modules", a.targets},
      {"modules_to_save", modules_to_save},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
  };
  const std::string text = config.dump(2) + "\n";
  io::write_file_atomically((fs::path(run_dir_) / "adapter_config.json").string(),
                            {{text.data(), text.size()}});
}

void Training::freeze_modules() {
  frozen_.assign(model_->parameters().size(), false);
  for (const std::string& module : s_.freeze_modules) {
    bool any = false;
    for (size_t i = 0; i < frozen_.size(); ++i)
      if (model_->parameters().values().entries()[i].name.rfind(module + ".", 0) == 0)
        frozen_[i] = any = true;
    if (!any)
      fail(c_.origin("train.freeze_modules"), ": train.freeze_modules: the model has no module '",
           module, "' (modules: ", module_names(model_->parameters()), ")");
  }
  if (!s_.freeze_modules.empty() && s_.freeze_epochs > state_.epochs_done) {
    std::string list;
    for (const std::string& m : s_.freeze_modules) list += (list.empty() ? "" : ", ") + m;
    out_ << "frozen: " << list << " for epochs 1-" << s_.freeze_epochs;
    if (s_.freeze_epochs < s_.epochs) out_ << ", trained from epoch " << s_.freeze_epochs + 1;
    out_ << "\n";
  }
}

TrainSummary Training::run() {
  // A resumed run that had stopped early, or had done its epochs, stays as it was.
  if (!resume_dir_.empty() && rank_ == 0) {
    if (stopped_early())
      out_ << "nothing to train: the run stopped early after epoch " << state_.epochs_done << " ("
           << s_.monitor << " did not improve for " << state_.since_best
           << " epochs; a larger train.early_stopping.patience trains on)\n";
    else if (state_.epochs_done >= s_.epochs)
      out_ << "nothing to train: the run has done " << state_.epochs_done << " epochs of "
           << s_.epochs
           << (state_.in_epoch ? ", and the part-way epoch after them stays undone" : "")
           << " (a larger train.epochs trains on)\n";
  }
  const int64_t last = stopped_early() ? state_.epochs_done : s_.epochs;
  for (int64_t epoch = state_.epochs_done + 1; epoch <= last; ++epoch)
    if (!run_epoch(epoch)) break;
  if (rank_ != 0) return summary_;
  finish();
  return summary_;
}

bool Training::run_epoch(int64_t epoch) {
  SF_PROFILE_SCOPE("epoch");
  const double t0 = now_s();
  std::vector<bool> frozen =
      epoch <= s_.freeze_epochs ? frozen_ : std::vector<bool>(frozen_.size(), false);
  const std::vector<bool> base = model_->frozen_parameters();  // under adapters: always
  for (size_t i = 0; i < base.size(); ++i) frozen[i] = frozen[i] || base[i];
  optimizer_->set_frozen(frozen);
  if (graphs_) graphs_->invalidate();     // what trains may change between epochs
  const bool part_way = state_.in_epoch;  // resumed in the middle of this epoch
  const int64_t first_batch = part_way ? state_.batch : 0;
  if (!part_way && !s_.stateful)
    for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i)
      std::swap(order_[i], order_[rng_.next() % (i + 1)]);
  double loss_sum = part_way ? state_.loss_sum : 0;
  int64_t seen = part_way ? static_cast<int64_t>(state_.seen) : 0;
  skipped_steps_ = part_way ? state_.skipped_steps : 0;
  state_.in_epoch = false;
  const int64_t seen_before = seen;
  double last_progress = t0;
  // The progress line's loss: this rank's windows since the start (or resumption) of the epoch.
  double shard_sum = 0;
  int64_t shard_seen = 0;
  const int64_t local_batches = start_pass(epoch, first_batch);
  for (int64_t bi = first_batch; bi < batches_per_epoch_; ++bi, ++state_.step) {
    if (stepped_) stop_if_signalled(epoch, bi, loss_sum, double(seen));
    stepped_ = true;
    SF_PROFILE_SCOPE("train step");
    const Batch* batch = nullptr;  // null: this rank has no windows in this step
    if (bi < local_batches) {
      SF_PROFILE_SCOPE("data wait");
      batch = &loader_->next();
    }
    optimizer_->set_lr(
        learning_rate(s_, oo_.lr, state_.step, epoch, total_steps_, state_.lr_factor));
    if (batch && !device_checked_) check_device_step(*batch);
    if (batch) {  // this step's dropout masks: a function of the seed, the step and the rank
      const uint64_t base =
          mix_seed(dropout_seed_, uint64_t(state_.step) * uint64_t(ranks_) + uint64_t(rank_));
      be_->upload(seed_base_.tensor(), &base);
    }
    const double loss = train_step(epoch, bi, batch);
    if (!batch) continue;
    loss_sum += loss * loss_weight_;
    seen += batch->size;
    shard_sum += loss * batch->size;
    shard_seen += batch->size;
    if (hooks_.on_step) hooks_.on_step(epoch, bi + 1, batches_per_epoch_);
    progress(epoch, bi, first_batch, t0, shard_sum / double(shard_seen), seen, seen_before,
             &last_progress);
  }
  if (ranks_ > 1) {  // the global training loss
    std::array<double, 2> sums = {loss_sum, double(seen)};
    comm_.all_reduce_sum(sums);
    loss_sum = sums[0];
    seen = static_cast<int64_t>(sums[1]);
  }
  return end_epoch(epoch, loss_sum, seen, seen_before, t0);
}

int64_t Training::start_pass(int64_t epoch, int64_t first_batch) {
  const uint64_t seed = static_cast<uint64_t>(c_.integer("train.seed"));
  const uint64_t epoch_seed = mix_seed(seed, static_cast<uint64_t>(epoch));
  // Rank r's k-th batch is order[(k * ranks + r) * b, + b); the last ones may be short or empty.
  used_ =
      std::min<int64_t>(static_cast<int64_t>(order_.size()), batches_per_epoch_ * global_batch_);
  int64_t local_batches = batches_per_epoch_;
  if (ranks_ > 1) {
    mine_.clear();
    for (int64_t k = 0; k < batches_per_epoch_; ++k) {
      const int64_t begin = std::min(used_, (k * ranks_ + rank_) * s_.batch_size);
      mine_.insert(mine_.end(), order_.begin() + begin,
                   order_.begin() + std::min(used_, begin + s_.batch_size));
    }
    local_batches = (static_cast<int64_t>(mine_.size()) + s_.batch_size - 1) / s_.batch_size;
  }
  const BatchRecipe recipe{augment_.any() ? &augment_ : nullptr, augment_cache_.get(), epoch_seed};
  loader_->start(ranks_ > 1 ? mine_ : order_, local_batches, recipe,
                 ranks_ > 1 ? mix_seed(epoch_seed, static_cast<uint64_t>(rank_)) : epoch_seed,
                 first_batch);
  return local_batches;
}

double Training::train_step(int64_t epoch, int64_t bi, const Batch* batch) {
  plan_step(bi, batch);
  const int64_t most = (s_.batch_size + s_.micro_batch - 1) / s_.micro_batch;
  const Tensor stats = step_stats_.get(*be_, DType::f64, {1 + most});
  if (!batch) {  // this rank still joins the collectives of the step
    sync_->begin_step();
    sync_->finish();
    fused_step(*be_, model_->parameters(), *optimizer_, s_.clip, scaler_.get(), stats.slice(0, 1));
    read_step();
    return 0;
  }
  // The losses and the gradients' sum of squares stay in the backend's memory until the step's
  // one read-back, at its end.
  if (graphs_) {
    graphs_->step(*batch);
    if (!graphs_->on() && !graphs_off_noted_) {
      graphs_off_noted_ = true;
      if (rank_ == 0) out_ << "note: train.cuda_graphs: " << graphs_->off_reason() << "\n";
    }
  } else {
    enqueue_step(bi, *batch);
  }
  const double loss = read_step();
  if (!std::isfinite(loss))
    throw Diverged(printable(detail::concat(
        "epoch ", epoch, ", step ", state_.step + 1, " (batch ", bi + 1, " of ", batches_per_epoch_,
        "): the training loss is ", loss,
        "; lower optim.lr or set train.clip_grad_norm (e.g. 1.0). Nothing was saved from this "
        "epoch: ",
        kept_model())));
  // Without loss scaling (which skips such a step) a gradient whose squares overflow float32
  // ruins the step: Adam's second moment becomes inf (its update m / inf = 0), clipping scales the
  // gradient to zero, or its entries are inf; nothing trains.
  if (!scaler_ && !(grad_norm_ <= std::sqrt(double(FLT_MAX))))
    throw Diverged(printable(detail::concat(
        "epoch ", epoch, ", step ", state_.step + 1, " (batch ", bi + 1, " of ", batches_per_epoch_,
        "): the gradient's norm is ",
        std::isnan(grad_norm_) ? std::string("NaN")
                               : detail::concat(grad_norm_, ", past what float32 holds squared"),
        "; ",
        task_.model.adapter.kind != AdapterKind::none
            ? "lower adapter.alpha (alpha / rank scales the adapters' gradients)"
            : "lower optim.lr, or scale the data (data.normalize)",
        ". Nothing was saved from this epoch: ", kept_model())));
  return loss;
}

// On a GPU, the run's first step is first repeated on the CPU for a few rows of its batch
// (device_check.hpp); a difference is reported as the defect it is.
void Training::check_device_step(const Batch& batch) {
  device_checked_ = true;
  size_t free = 0, total = 0;
  std::string device;
  if (!be_->device_memory(&free, &total, &device) || ranks_ > 1 || s_.stateful ||
      !c_.boolean("train.device_check"))
    return;
  const DeviceCheckSettings settings{.gemm = gemm_dtype_,
                                     .reduced = c_.str("train.matmul_precision") == "high",
                                     .loss_scale = scaler_ ? scaler_->scale() : 1.0,
                                     .max_rows = s_.micro_batch,
                                     .host_bytes = double(available_memory_bytes())};
  const DeviceCheck r =
      check_step_on_cpu(*model_, *be_, task_, settings, batch, seed_base_.tensor());
  if (!r.ran)
    out_ << "note: train.device_check: not run: " << r.summary << "\n";
  else if (r.agrees)
    out_ << "device check: the first step's loss and gradients agree with the CPU's" << r.summary
         << "\n";
  else
    out_ << "warning: the first step's loss and gradients on " << device << " differ from the CPU's"
         << r.summary
         << ". This is a defect: please report it with the output of `seqforge diagnose`; "
            "train.device: cpu trains on the CPU meanwhile\n";
}

void Training::plan_step(int64_t bi, const Batch* batch) {
  // Terms are windows where every window's loss has as many (then the step's count is known
  // without asking the other ranks), else the task's count (mae's masked steps).
  const TaskType& type = task_type(task_.kind);
  const bool vary = type.loss_terms_vary();
  micro_.clear();
  local_terms_ = 0;
  for (int64_t first = 0; batch && first < batch->size; first += s_.micro_batch) {
    const int64_t end = std::min(batch->size, first + s_.micro_batch);
    const double terms = vary ? double(type.loss_terms(task_, *batch, first, end)) : end - first;
    micro_.push_back({first, end, terms});
    local_terms_ += terms;
  }
  step_terms_ = local_terms_;
  loss_weight_ = batch ? double(batch->size) : 0.0;
  if (ranks_ == 1) return;
  const double step_windows = double(std::min(global_batch_, used_ - bi * global_batch_));
  if (vary) {
    std::array<double, 1> all = {local_terms_};
    comm_.all_reduce_sum(all);
    step_terms_ = all[0];
    // A rank's mean is over its own terms (mae's masked steps), which differ between ranks.
    loss_weight_ = step_terms_ > 0 ? local_terms_ / step_terms_ * step_windows : 0.0;
  } else {
    step_terms_ = step_windows;
  }
}

void Training::enqueue_step(int64_t bi, const Batch& batch) {
  const Tensor stats = step_stats_.tensor();
  Tensor h0, c0;
  if (s_.stateful) std::tie(h0, c0) = carried_states(bi, batch.size);
  // The summed gradients are the mean over the step's examples on every rank: each
  // micro-batch's mean gradient weighted by its share of the loss's terms.
  for (size_t j = 0; j < micro_.size(); ++j) {
    const MicroBatch& m = micro_[j];
    Batch rows;
    if (micro_.size() > 1) rows = batch_rows(batch, m.first, m.end);
    const Batch& part = micro_.size() > 1 ? rows : batch;
    model_->set_token_layout(part.lengths, part.segments);
    salts_.reseed(0x5eedba5e + j);
    Tensor y = model_->forward(*be_, part.input, h0, c0, true, salts_);
    if (s_.stateful) {  // the final states start the next batch, detached from this one's graph
      carry_at_ ^= 1;
      be_->copy(carry_h_[carry_at_].get(*be_, DType::f32, h0.shape()), model_->recurrent()->h_n());
      if (!c0.empty())
        be_->copy(carry_c_[carry_at_].get(*be_, DType::f32, c0.shape()),
                  model_->recurrent()->c_n());
    }
    Tensor dout = dout_buf_.get(*be_, DType::f32, y.shape());
    {
      SF_PROFILE_SCOPE("loss");
      loss_of(*be_, task_, y, part, dout, stats.slice(1 + j, 2 + j));
    }
    if (const double share = step_terms_ > 0 ? m.terms / step_terms_ : 0.0; share != 1.0)
      be_->scale(dout, share);
    const bool last = j + 1 == micro_.size();
    if (sync_ && last) {  // its gradients are the step's as backward finishes them
      sync_->begin_step();
      sync_open_ = true;
    }
    if (scaler_) be_->scale(dout, scaler_->scale());
    model_->backward(*be_, dout);
  }
  if (!activations_noted_) {
    activations_noted_ = true;
    if (const std::string note = model_->activation_note(); !note.empty() && rank_ == 0)
      out_ << note << "\n";
  }
  if (sync_) {
    sync_->finish();
    sync_open_ = false;
  }
  SF_PROFILE_SCOPE("optimizer");
  // Clipping and the update, decided where the gradients are; with fp16, the gradients unscaled
  // first, and the step skipped (the scale halved) when they overflowed.
  fused_step(*be_, model_->parameters(), *optimizer_, s_.clip, scaler_.get(), stats.slice(0, 1));
}

// The step's one read-back, (sum of squares of the gradients, the micro-batches' losses): the
// scaler's update and the skipped steps' count. Returns this rank's mean loss.
double Training::read_step() {
  std::vector<double>& host = step_host_;
  host.resize(size_t(step_stats_.tensor().numel()));
  be_->download(host.data(), step_stats_.tensor());
  const StepReport r = finish_step(host[0], s_.clip, scaler_.get(), *optimizer_);
  if (!r.applied && scaler_) ++skipped_steps_;
  grad_norm_ = r.grad_norm;
  if (micro_.size() == 1) return host[1];
  double sum = 0;
  for (size_t j = 0; j < micro_.size(); ++j) sum += micro_[j].terms * host[1 + j];
  return local_terms_ > 0 ? sum / local_terms_ : 0.0;
}

// A signal stops the run before its next step, once every rank has seen it: the state is
// saved and Interrupted thrown for the CLI to exit 130 (SIGINT) or 143 (SIGTERM).
void Training::stop_if_signalled(int64_t epoch, int64_t batch, double loss_sum, double seen) {
  int sig = interrupt_requested();
  if (ranks_ > 1) {
    std::array<double, 2> any = {double(sig == SIGINT), double(sig == SIGTERM)};
    comm_.all_reduce_sum(any);
    sig = any[1] > 0 ? SIGTERM : any[0] > 0 ? SIGINT : 0;
  }
  if (!sig) return;
  std::array<double, 2> sums = {loss_sum, seen};
  if (ranks_ > 1) comm_.all_reduce_sum(sums);
  if (rank_ != 0) throw Interrupted(sig, "");
  save_state(true, batch, sums[0], sums[1]);
  writer_->flush();
  throw Interrupted(
      sig, detail::concat("interrupted (", sig == SIGINT ? "SIGINT" : "SIGTERM", ") in epoch ",
                          epoch, " after batch ", batch, " of ", batches_per_epoch_,
                          ": the training state is saved in ", state_path_,
                          "; continue with: seqforge train --resume ", run_dir_));
}

// Progress: redrawn in place on a terminal, else a line every progress_seconds.
void Training::progress(int64_t epoch, int64_t bi, int64_t first_batch, double t0, double loss,
                        int64_t seen, int64_t seen_before, double* last_progress) const {
  const double now = now_s();
  if (!(tty_ ? bi % 10 == 9 || bi + 1 == batches_per_epoch_
             : s_.progress_seconds > 0 && now - *last_progress >= s_.progress_seconds))
    return;
  *last_progress = now;
  const double el = now - t0, done = double(bi + 1 - first_batch);
  // To the run's last epoch at this epoch's pace (validation and early stopping aside).
  const double eta =
      el / done * double(batches_per_epoch_ - bi - 1 + (s_.epochs - epoch) * batches_per_epoch_);
  char line[160];
  std::snprintf(line, sizeof line,
                "%sepoch %lld/%lld  %lld/%lld batches  %s %.5g  %.0f samples/s  ETA %.0f s%s",
                tty_ ? "\r" : "", (long long)epoch, (long long)s_.epochs, (long long)(bi + 1),
                (long long)batches_per_epoch_, ranks_ > 1 ? "rank 0's loss" : "loss", loss,
                double(seen - seen_before) * double(ranks_) / std::max(el, 1e-9), eta,
                tty_ ? "  " : "\n");  // every rank's samples: each takes an equal share
  out_ << line << std::flush;
}

bool Training::end_epoch(int64_t epoch, double loss_sum, int64_t seen, int64_t seen_before,
                         double t0) {
  const double train_s = now_s() - t0, wait_s = loader_->wait_seconds();
  summary_.epochs = epoch;
  if (rank_ != 0) {  // rank 0 validates, saves and decides; the others follow
    std::array<double, 2> next{};
    comm_.broadcast({reinterpret_cast<std::byte*>(next.data()), sizeof next});
    state_.lr_factor = next[1];
    state_.epochs_done = epoch;
    note_timeout();
    return next[0] == 0;
  }
  std::map<std::string, double> m = evaluate_split(*be_, *model_, task_, task_.split().val,
                                                   val_loader_ ? *val_loader_ : *loader_);
  m["train_loss"] = loss_sum / double(seen);
  check_finite_parameters(*be_, model_->parameters(), epoch,
                          std::max<int64_t>(1, state_.step - batches_per_epoch_ + 1), state_.step,
                          [&] { return kept_model(); });
  const double epoch_s = now_s() - t0;
  if (!m.count(s_.monitor))
    fail(c_.origin("train.early_stopping.monitor"), ": train.early_stopping.monitor: '", s_.monitor,
         "' has no value after epoch ", epoch, " (", format_metrics(m), " )",
         s_.monitor == "val_skill"
             ? ": the naive forecast's error on the validation split is 0 (a target that does "
               "not change there), so the skill against it is undefined; monitor val_loss"
             : "");
  const double value = m.at(s_.monitor);
  const bool improved = s_.improves(value, state_.best);
  if (improved) {
    state_.best = value;
    state_.since_best = 0;
  } else {
    ++state_.since_best;
  }
  if (s_.schedule == "plateau" && state_.step >= s_.warmup_steps) {
    if (s_.improves(value, state_.plateau_best)) {
      state_.plateau_best = value;
      state_.since_plateau = 0;
    } else if (++state_.since_plateau >= s_.plateau_patience) {
      state_.lr_factor *= s_.gamma;
      state_.since_plateau = 0;
    }
  }
  const bool hook_stop = hooks_.on_epoch && !hooks_.on_epoch(epoch, m);
  const bool patience_out = s_.patience > 0 && state_.since_best >= s_.patience;
  const bool last_epoch = epoch == s_.epochs || patience_out || hook_stop;
  const bool write =
      (s_.save == "best" && improved) || (s_.save == "last" && last_epoch) ||
      (s_.save == "every_n" && (epoch % std::max<int64_t>(1, s_.save_every) == 0 || last_epoch));
  const Parameters& p = model_->parameters();
  lock_.check_still_held();
  if (write) {
    if (!resume_dir_.empty() && !old_predictions_removed_) {
      // A finished run's predictions are of the model this checkpoint replaces: none until the
      // run finishes and writes them again.
      for (const char* name : {"val_predictions.csv", "val_reconstructions.csv"})
        fs::remove(fs::path(run_dir_) / name);
      old_predictions_removed_ = true;
    }
    saved_metrics_ = m;
    std::map<std::string, std::string> meta = checkpoint_metadata(c_, task_, epoch, m);
    meta["seqforge.data"] = data_fingerprint_;  // eval --split re-splits only these bytes
    if (!config_json_hash_.empty()) meta[kConfigJsonHashKey] = config_json_hash_;
    writer_->submit(checkpoint_, *be_, named(p, p.values(), "", true), {}, meta);
    if (const std::vector<bool> frozen = model_->frozen_parameters(); !frozen.empty()) {
      // PEFT's adapter file: what trains, the adapters and a new head (modules_to_save).
      std::vector<std::pair<std::string, Tensor>> trained;
      for (size_t i = 0; i < p.size(); ++i)
        if (!frozen[i]) {
          const std::string& name = p.values().entries()[i].name;
          trained.emplace_back(name.rfind(kPeftPrefix, 0) == 0 ? name : kPeftPrefix + name,
                               p.value(i));
        }
      writer_->submit((fs::path(run_dir_) / "adapter_model.safetensors").string(), *be_, trained,
                      {}, {{"format", "pt"}});
    }
  }
  state_.epochs_done = epoch;
  // The epoch's line first: a state that counts the epoch is never without it (a resumed run
  // keeps the lines of the epochs its state counts).
  // Why the run ends after this epoch, in its line: a report tells a finished run so.
  const std::string stop = hook_stop            ? hooks_.on_epoch_stop
                           : patience_out       ? "early_stopping"
                           : epoch == s_.epochs ? "epochs"
                                                : "";
  log_epoch(epoch, m, write, epoch_s, train_s, wait_s,
            double(seen - seen_before) / std::max(train_s, 1e-9), stop);
  save_state(false, 0, 0, 0);  // after every epoch, for --resume
  note_timeout();
  summary_.last = m;
  if (ranks_ > 1) {
    std::array<double, 2> next = {double(hook_stop || patience_out), state_.lr_factor};
    comm_.broadcast({reinterpret_cast<std::byte*>(next.data()), sizeof next});
  }
  if (hook_stop) {
    out_ << (hooks_.on_epoch_stop == "pruned" ? "pruned by the study" : "stopped by on_epoch")
         << " after epoch " << epoch << "\n";
    summary_.stopped = true;
    return false;
  }
  if (patience_out) {
    out_ << "early stopping: " << s_.monitor << " did not improve for " << s_.patience
         << " epochs\n";
    return false;
  }
  return true;
}

// A line of metrics.jsonl, flushed; one that cannot be written stops the run.
void Training::append_metrics(const nlohmann::json& j) {
  lock_.check_still_held();
  errno = 0;
  metrics_log_ << j.dump() << "\n" << std::flush;
  if (!metrics_log_)
    fail(metrics_path_, ": cannot append a line of the run's metrics (",
         errno ? std::strerror(errno) : "a write failed",
         "); the run stops, its last checkpoint intact");
}

// The epoch's line in metrics.jsonl (its metrics `j`, timings, resources), the report and the
// console line.
void Training::log_epoch(int64_t epoch, nlohmann::json j, bool saved, double epoch_s,
                         double train_s, double wait_s, double rate, const std::string& stop) {
  // The baselines' errors are the same every epoch: said once, kept out of the epoch's line.
  std::map<std::string, double> shown = j.get<std::map<std::string, double>>();
  std::erase_if(shown, [](const auto& kv) { return kv.first.find("naive_") != std::string::npos; });
  const std::string metrics = format_metrics(shown);
  if (!baselines_noted_ && j.contains("val_naive_mae")) {
    baselines_noted_ = true;
    char line[320];
    std::snprintf(line, sizeof line,
                  "baselines on validation: naive (each target predicted by its window's last "
                  "value) MAE %.5g, RMSE %.5g",
                  j["val_naive_mae"].get<double>(), j["val_naive_rmse"].get<double>());
    out_ << line;
    if (j.contains("val_snaive_mae")) {
      // h steps ahead, the value ceil(h / season) seasons before the target.
      const int64_t season = task_.series.season, horizon = task_.series.horizon;
      const int64_t back = (horizon + season - 1) / season * season;
      out_ << "; seasonal naive ("
           << (task_.series.steps_ahead > 1 && horizon > season
                   ? "at h steps ahead, ceil(h / " + std::to_string(season) + ") seasons of " +
                         std::to_string(season) + " rows before the target"
                   : std::to_string(back) + " rows before the target")
           << ") MAE " << j["val_snaive_mae"].get<double>() << ", RMSE "
           << j["val_snaive_rmse"].get<double>();
    }
    out_ << "; val_skill is 1 - the model's MSE / naive's\n";
  }
  j["epoch"] = epoch;
  j["lr"] = optimizer_->options().lr;
  j["epoch_seconds"] = epoch_s;
  j["train_seconds"] = train_s;
  j["samples_per_second"] = rate;
  j["data_wait_seconds"] = wait_s;
  j["data_wait_share"] = wait_s / std::max(train_s, 1e-9);
  j["checkpoint"] = saved;
  if (scaler_) {
    j["loss_scale"] = scaler_->scale();
    j["skipped_steps"] = skipped_steps_;
  }
  if (graphs_) {  // the epoch's steps replayed from a captured graph
    j["graph_steps"] = graphs_->replayed_steps() - graph_steps_before_;
    graph_steps_before_ = graphs_->replayed_steps();
  }
  for (const auto& [k, v] : resources_.interval_summary()) j[k] = v;
  if (!stop.empty()) j["stop"] = stop;
  append_metrics(j);
  write_run_report(run_dir_, /*while_training=*/true);
  char head[96];
  std::snprintf(head, sizeof head, "epoch %lld/%lld", (long long)epoch, (long long)s_.epochs);
  char scaling[96] = "";
  if (scaler_ && skipped_steps_ > 0)
    std::snprintf(scaling, sizeof scaling, "  %lld steps skipped (fp16 overflow), loss scale %g",
                  (long long)skipped_steps_, scaler_->scale());
  skipped_steps_ = 0;
  char tail[256];
  std::snprintf(tail, sizeof tail, "  lr %.3g  %.1f s  %.0f samples/s  data wait %.1f%%%s%s",
                optimizer_->options().lr, epoch_s, rate, 100 * wait_s / std::max(train_s, 1e-9),
                scaling, saved ? "  [saved]" : "");
  out_ << (tty_ ? "\r" : "") << head << metrics << tail << "\n" << std::flush;
}

void Training::note_timeout() {
  std::string dir = rank0_dir_.empty() ? run_dir_ : rank0_dir_;
  if (dir.empty()) dir = "rank 0's run directory";  // before rank 0 has shared it
  comm_.set_timeout(s_.dist_timeout,
                    state_.epochs_done > 0 || !resume_dir_.empty()
                        ? "the last checkpoint in " + dir + " is intact"
                        : "no epoch had ended, so " + dir + " holds no checkpoint yet");
}

// The loop's state for --resume (rank 0): after state_.epochs_done epochs or, `in_epoch`, after
// `batch` batches of the next one (its windows shuffled, their loss summed over `seen`).
void Training::save_state(bool in_epoch, int64_t batch, double loss_sum, double seen) {
  lock_.check_still_held();
  const Parameters& p = model_->parameters();
  auto tensors = named(p, p.values(), "param.");
  for (int k = 0; k < (oo_.kind == "sgd" ? 1 : 2); ++k)
    for (auto& t : named(p, optimizer_->state(k), "optim." + std::to_string(k) + "."))
      tensors.push_back(t);
  std::array<uint64_t, 4> words = rng_.state();
  const std::vector<std::pair<std::string, Tensor>> host_tensors = {
      {"order", Tensor(order_.data(), DType::i64, {static_cast<int64_t>(order_.size())})},
      {"rng", Tensor(words.data(), DType::i64, {4})}};
  if (s_.stateful && in_epoch) {  // the states the next batch starts from
    tensors.emplace_back("carry.h", carry_h_[carry_at_].tensor());
    if (cell_type(task_.model.rnn.cell).cell_state)
      tensors.emplace_back("carry.c", carry_c_[carry_at_].tensor());
  }
  LoopState saved = state_;
  if (scaler_) {
    saved.loss_scale = scaler_->scale();
    saved.loss_scale_growth = scaler_->growth_tracker();
  }
  saved.optimizer_steps = optimizer_->steps();
  saved.param_steps = optimizer_->param_steps();
  saved.in_epoch = in_epoch;
  saved.batch = batch;
  saved.batch_windows = in_epoch ? global_batch_ : 0;
  saved.skipped_steps = in_epoch ? skipped_steps_ : 0;
  saved.loss_sum = loss_sum;
  saved.seen = seen;
  writer_->submit(state_path_, *be_, tensors, host_tensors,
                  {{"seqforge.loop", saved.to_json()},
                   {"seqforge.config", c_.resolved_yaml()},
                   {"seqforge.data", data_fingerprint_}});
}

// After the last epoch (rank 0): checkpoints on disk, the validation outputs, the test split
// and the report.
void Training::finish() {
  writer_->flush();
  // What follows loads the saved model: the training one goes first, so that a large base is
  // not held twice.
  graphs_.reset();
  sync_.reset();
  optimizer_.reset();
  loader_.reset();
  val_loader_.reset();
  model_.reset();
  // The data too: the saved model is evaluated on the data read again (once, for the validation
  // outputs and the test split), as `seqforge eval` reads it, and a large file must not be held
  // twice.
  const size_t test_windows = task_.split().test.size();
  task_.series = SeriesData{};
  task_.text = TextData{};
  std::optional<LoadedRun> saved_run;
  if (fs::exists(checkpoint_)) {
    saved_run.emplace(load_run(run_dir_, ""));
    write_validation_outputs(run_dir_, *saved_run);
  }
  // A signal after the last step stops the test evaluation: the run is whole without it.
  auto stopped = [&](int sig, const std::string& when) {
    saved_run.reset();
    write_run_report(run_dir_);
    return Interrupted(
        sig, detail::concat("interrupted (", sig == SIGINT ? "SIGINT" : "SIGTERM", ") ", when,
                            ": the model is saved in ", checkpoint_,
                            "; its test metrics: seqforge eval ", run_dir_, " --split test"));
  };
  if (s_.test_after && test_windows > 0 && saved_run) {
    if (const int sig = interrupt_requested()) throw stopped(sig, "before the test evaluation");
    try {
      summary_.test = evaluate(*saved_run, run_dir_, "test", "", nullptr);  // notes: at start-up
    } catch (const Interrupted& e) {
      throw stopped(e.signal(), "in the test evaluation");
    }
    const int64_t model_epoch = std::stoll(saved_run->file.metadata().at("seqforge.epoch"));
    nlohmann::json j = summary_.test;
    j["split"] = "test";
    j["model_epoch"] = model_epoch;
    append_metrics(j);
    std::map<std::string, double> shown;
    for (const auto& [k, v] : summary_.test)
      if (k != "samples") shown[k] = v;
    out_ << "test (the saved model, epoch " << model_epoch << ", " << test_windows << " "
         << task_type(task_.kind).samples() << "):" << format_metrics(shown) << "\n";
  }
  saved_run.reset();
  if (const auto it = saved_metrics_.find("val_skill");
      it != saved_metrics_.end() && it->second < 0) {
    const auto& transforms = task_.series.target_transforms;
    const bool changes = std::any_of(transforms.begin(), transforms.end(),
                                     [](Transform t) { return t != Transform::none; });
    out_ << "warning: the saved model forecasts worse than the naive last-value forecast on "
            "validation (val_mse "
         << saved_metrics_.at("val_mse") << " against naive's "
         << std::pow(saved_metrics_.at("val_naive_rmse"), 2) << ", val_skill " << it->second
         << "): train longer or change the model"
         << (changes ? "" : ", or predict the change (data.transform)") << "\n";
  }
  const std::string report = write_run_report(run_dir_);
  summary_.best = state_.best;
  out_ << "best " << s_.monitor << " " << state_.best;
  // Under train.save last or every_n the model is not the best epoch's: its own value too.
  if (const auto it = saved_metrics_.find(s_.monitor);
      s_.save != "best" && it != saved_metrics_.end() && it->second != state_.best)
    out_ << " (the saved model's, train.save " << s_.save << ": " << it->second << ")";
  out_ << "; model: " << checkpoint_ << "; metrics: " << metrics_path_ << "; report: " << report
       << "\n";
}

}  // namespace

TrainSummary train(const Config& config, std::ostream& out, const std::string& resume_dir,
                   const TrainHooks& hooks, bool overwrite) {
  check_run_inputs(config, resume_dir);
  const std::string init = config.str("model.init_from");
  const bool base_moved = !init.empty() && !fs::exists(init);
  // Paths made absolute, so eval, predict and --resume work from any directory.
  std::string note;
  // A resumed run records its directory as it is now, should it have been moved.
  const Config resolved =
      (resume_dir.empty()
           ? config
           : as_it_trained(config).with_values(
                 {{"train.run_dir", nlohmann::json(fs::absolute(resume_dir).string()).dump()}},
                 "the resumed run's directory"))
          .with_absolute_paths(io::current_directory());
  const Config c = base_moved ? resolved : with_base_architecture(resolved, &note);
  const InterruptScope interrupts;  // SIGINT, SIGTERM: stop after the current step
  dist::Communicator& comm = dist::world();
  std::ostream quiet(nullptr);  // rank 0 alone prints
  std::ostream& shown = comm.rank() == 0 ? out : quiet;
  if (!note.empty()) shown << note << "\n";
  TrainSummary summary;
  if (comm.size() == 1) {
    Training training(c, config, out, resume_dir, hooks, overwrite, comm);
    try {
      summary = training.run();
    } catch (Interrupted& e) {
      e.set_run_dir(training.run_dir());
      throw;
    }
  } else {
    std::string run_dir;
    try {
      check_ranks_agree(c, comm);
      Training training(c, config, shown, resume_dir, hooks, overwrite, comm);
      run_dir = training.run_dir();
      summary = training.run();
    } catch (Interrupted& e) {
      e.set_run_dir(run_dir);
      throw;  // every rank stopped at the same step
    } catch (const std::exception& e) {
      comm.abort(e.what());  // the other ranks would otherwise wait for this one until the timeout
    }
  }
  // A signal after the last step of a run with no test evaluation to stop: the run is whole, and
  // the exit code still says a signal came, so that a script does not go on. (Inside a study the
  // study answers it: the trial is complete.)
  if (const int sig = interrupt_requested(); sig && interrupts.outermost()) {
    Interrupted late(sig, detail::concat("interrupted (", sig == SIGINT ? "SIGINT" : "SIGTERM",
                                         ") after the last epoch: the run is complete, its model "
                                         "in ",
                                         summary.checkpoint));
    late.set_run_dir(summary.run_dir);
    throw late;
  }
  return summary;
}

}  // namespace seqforge
