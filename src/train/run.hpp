#pragma once
// What training, evaluation, prediction and diagnosis share: a task (data and model options),
// its loss and metrics, checkpoint metadata and the loading of a saved run.
#include <charconv>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "seqforge/backend/backend.hpp"
#include "seqforge/core/threads.hpp"
#include "seqforge/data/datasets.hpp"
#include "seqforge/data/loader.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/sequence_model.hpp"
#include "seqforge/train/config.hpp"
#include "seqforge/train/trainer.hpp"

namespace seqforge {

// Seconds on a steady clock.
double now_s();

// A task: its data and the model it needs.
struct Task : Dataset {
  ModelOptions model;
  RegressionLoss loss;  // train.loss, of the regression tasks (forecast, mae)
};

// Loads the task's data per the config; with `from`, reuses its normalisation and vocabulary.
Task load_task(const Config& c, const Task* from = nullptr);
// A run's stored config (its checkpoint's, its config.resolved.yaml) as the run trained: a key
// added since it was written takes the behaviour it had then (data.split.context: strict).
Config as_it_trained(const Config& stored);

// ---- The model, its device and its precision, from the config (run_model.cpp) -------------------

// The model.* keys, checked against the task.
ModelOptions model_options(const Config& c, const Task& t);
// train.loss and train.huber_delta, checked against the task.
RegressionLoss regression_loss_of(const Config& c, TaskKind task);
// The backend that trains (or evaluates) model `m` on train.device: auto, cpu or cuda, checked.
// `inference` (eval, predict, generate, merge): a stored cuda is auto, so that a run trained on
// a GPU is served on a machine without one.
std::unique_ptr<Backend> make_device_backend(const Config& c, const ModelOptions& m,
                                             bool inference = false);
// The GEMM dtype `precision` (train.precision) gives a model on `be`: resolve_precision's, f16
// for fp16, or f32, with a notice, where the backend runs no such GEMMs.
DType backend_precision(const std::string& precision, const Backend& be, std::string* notice);
// resolve_precision's GEMM dtype on a CPU, `auto` taking bf16 only where bf16 GEMMs pay off here
// (bf16_gemms_pay_off; else fp32, with a notice saying why).
DType cpu_gemm_precision(const std::string& precision, std::string* notice);
// backend_precision for model `m`: fp32, with a notice, for a family that runs no half GEMMs yet.
DType model_precision(const std::string& precision, const Backend& be, const ModelOptions& m,
                      std::string* notice);
// train.precision's name for a GEMM dtype: fp32, bf16 or fp16.
const char* gemm_precision_name(DType gemm);
// A transformer initialised from a base model takes the base's shape: model.embedding,
// model.layers and model.block_size from its tensors, model.heads from the seqforge config in
// its metadata. Keys the config leaves out are set (and named in `note`); a key set to another
// value, or heads that neither the file nor the config give, is an error.
Config with_base_architecture(const Config& c, std::string* note);

// ---- What a run needs in memory, checked before it allocates (run_memory.cpp) -------------------

// Before a model's parameters are allocated: refuses one whose parameters (with their gradients
// and AdamW's two moments when `training`) need more memory than is available, naming the keys
// that size it.
void check_model_fits(Model& model, const Config& c, bool training);
// Examples a forward pass without backward (validation, eval, predict) takes at once:
// train.batch_size, or train.micro_batch_size where smaller (set to bound the memory; `auto`,
// which training resolves with auto_micro_batch and stores resolved, counts as the batch).
int64_t forward_rows(const Config& c);
// Bytes a training step keeps for backward per batch of B windows of T steps (an estimate: the
// layers' saved activations, their gradients, the head's), with half-precision GEMM copies.
double activation_bytes(const ModelOptions& m, int64_t T, int64_t B, bool half);
// Before a run allocates: "" when the model's parameters, gradients, AdamW's moments and the
// activations of `batch` examples at once (a micro-batch) fit `free_bytes` (a device's free
// memory; with !own_memory, the memory available on the CPU), else the problem in one line,
// naming the micro-batch size that fits (auto_micro_batch's). *need_bytes: the estimate.
std::string step_fit_problem(double free_bytes, const std::string& device, Model& model,
                             const ModelOptions& m, int64_t T, int64_t batch, bool half,
                             double* need_bytes = nullptr, bool own_memory = true);
// train.micro_batch_size `auto`: the examples of a batch of `batch` a training step runs at once,
// given `free_bytes`. On a device with its own memory (`device`): the whole batch where the step
// fits 90% of its free memory with the model's parameters, gradients and AdamW's moments, else
// the largest micro-batch that does (0: not even one example). On the CPU (free_bytes: the
// memory available to this process): the whole batch where its activations take at most half
// of it, else the largest that do, at least 1. `why`: the choice in one line.
int64_t auto_micro_batch(Model& model, const ModelOptions& m, int64_t T, int64_t batch, bool half,
                         double free_bytes, bool device, std::string* why);
// Bytes of one batch's buffers, for the loader's memory budget.
int64_t batch_bytes(const Task& t, int64_t batch_size);

// ---- The loss and the metrics (run_metrics.cpp) -------------------------------------------------

// The loss and its gradient for a batch: the mean loss into `loss` (one f64 in the backend's
// memory, not waited for).
void loss_of(Backend& be, const Task& t, Tensor out, const Batch& b, Tensor dout, Tensor loss);
// The metrics an epoch of the task can watch (train_loss, val_loss and the task's val_*).
std::vector<std::string> metric_names(const Task& t);
// Why metric `name` of t's can have no value on t's data ("" where it may have one).
std::string metric_absent(const Task& t, const std::string& name);
// Metrics over a split (no training, no dropout): val_loss and the task's val_* metrics. With
// `interruptible`, a SIGINT or SIGTERM (in an InterruptScope) stops it between batches:
// Interrupted.
std::map<std::string, double> evaluate_split(Backend& be, Model& model, const Task& t,
                                             const std::vector<int64_t>& starts, Loader& loader,
                                             bool interruptible = false);
// The shortest text that reads back as the same number.
template <typename Real>
std::string shortest(Real x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}
// "  key value" for each metric.
std::string format_metrics(const std::map<std::string, double>& m);

// ---- Checkpoints and saved runs -----------------------------------------------------------------

// After model.init_from loaded `loaded` from `path` (init_features.cpp): the weights that read a
// series task's features (the first recurrent layer's input weights, their adapters' A, a masked
// autoencoder's head) put in this run's feature order where the checkpoint's model read the same
// features in another, with a line on `out`; other features are an error, and features transformed
// or normalised otherwise than the config `c` does get a note. A loaded forecaster's or
// classifier's head is put in this run's order of the same targets or classes (other ones: a note).
void match_init_features(const std::string& path, const Config& c, const Task& task,
                         const std::vector<std::string>& loaded, Parameters& params, Backend& be,
                         std::ostream& out);
// The head tensors (a classifier's or forecaster's head, a text classifier's classifier) that
// model.init_from is not to load whole: the checkpoint's classes or targets are others than this
// run's, or (a forecaster's) its rows stand for other steps ahead or quantiles. The loader leaves
// them out; load_heads_by_name copies the rows of the names both runs share where the rows are
// laid out alike, the others keeping their start, says so on `out`, and returns the heads that
// took rows.
std::vector<std::string> heads_by_name(const std::string& path, const Config& c, const Task& task,
                                       const Parameters& params,
                                       const std::vector<std::string>& modules);
std::vector<std::string> load_heads_by_name(const std::string& path, const Config& c,
                                            const Task& task, const std::vector<std::string>& heads,
                                            Parameters& params, Backend& be, std::ostream& out);
// Before model.init_from loads `path`'s `modules` (empty: all): a checkpoint whose model read
// another number of features than this run's data gives is an error naming both lists, where a
// weight reading them is to be loaded (its shape would otherwise be the only word).
// The architecture keys (model.hidden, model.layers, ...) whose values in `path`'s stored config
// differ from `c`'s, as a clause for an error about the tensors' shapes: "" where none differ or
// the checkpoint holds no config seqforge reads.
std::string init_model_differences(const std::string& path, const Config& c);
void check_init_feature_count(const std::string& path, const Task& task,
                              const std::vector<std::string>& modules);

// A decoder run's config.json as its checkpoint records it, under kConfigJsonHashKey: a hash of
// its content (keys sorted, spacing aside). The model is built from that file, so a changed one
// is refused.
inline constexpr const char* kConfigJsonHashKey = "seqforge.config_json_hash";
std::string config_json_hash(const std::string& text);

// Metadata stored with the weights: what eval, predict and generate need to rebuild the task.
std::map<std::string, std::string> checkpoint_metadata(const Config& c, const Task& t,
                                                       int64_t epoch,
                                                       const std::map<std::string, double>& m);
// The arena's tensors under the parameters' names, prefixed (and their aliases' names).
std::vector<std::pair<std::string, Tensor>> named(const Parameters& params, const Arena& arena,
                                                  const std::string& prefix, bool aliases = false);
// Copies a tensor of `file` into `dst`, checking its shape and dtype, that a float tensor holds
// no NaN or infinity and, with `non_negative`, no value below 0 (f32); errors name the file and
// tensor. `dst` is memory of `be`, or host memory when `be` is null.
void load_tensor(const io::SafetensorsFile& file, const std::string& name, Tensor dst, Backend* be,
                 bool non_negative = false);

// A run's checkpoint: `run` is a run directory or a .safetensors file.
struct LoadedRun {
  io::SafetensorsFile file;
  Config config;
  Task task;
  std::string base_model;  // model.init_from as trained (a decoder's config names its own folder)
};
// `missing`, where given with another file (`data_override`): its fill replaces the run's
// data.missing (predict and eval's --missing: ffill or interpolate, where the run did not mask),
// its codes join the run's data.missing_values (--missing-values).
LoadedRun load_run(const std::string& run, const std::string& data_override,
                   WindowSet windows = WindowSet::splits, const InputReading& missing = {});
// evaluate() and write_validation_outputs() of a run already loaded (the end of training reads
// its data once for both); `data` names the file `r` was loaded with ("" for the run's own).
std::map<std::string, double> evaluate(LoadedRun& r, const std::string& run,
                                       const std::string& split, const std::string& data,
                                       std::ostream* notes);
int64_t write_validation_outputs(const std::string& run, LoadedRun& r);
// The checkpoint and what building its model needs, without reading the run's data file (generate,
// merge): the task holds no examples.
LoadedRun load_run_model(const std::string& run);
// The files a training run writes into its directory (besides .lock and train.log).
extern const std::vector<std::string> kRunFiles;
// Refuses an output path (`option`: "--output") that is one of the run's own files (kRunFiles,
// its lock, its log): writing there would destroy the run.
void check_output_outside_run(const std::string& output, const std::string& run,
                              const std::string& option);
// The model of a loaded run, its weights loaded, computing in the run's precision.
std::unique_ptr<Model> load_model(Backend& be, const LoadedRun& r, std::ostream* notes);

// Stateful training's batches: the training split cut into consecutive chunks (windows one
// lookback apart, or a text's consecutive sequences), dealt into batch_size streams, each a
// contiguous stretch of the data; batch k holds every stream's k-th chunk. A stream's state is
// reset where its chunk does not continue the previous one (a new series, a gap, its first).
struct StatefulStreams {
  std::vector<int64_t> order;  // (batches * batch_size) window starts, batch after batch
  std::vector<uint8_t> reset;  // like order: 1 where the row's state starts from zeros
  int64_t batches = 0;
  int64_t chunks = 0;  // in the training split; those past batches * batch_size are left out
};
StatefulStreams stateful_streams(const Dataset& d, int64_t batch_size);
// The same for config `c`'s run, refused naming the key where no state would be carried (a
// data.stride that does not divide the lookback) or no batch fills (too few windows).
StatefulStreams checked_stateful_streams(const Config& c, const Dataset& d, int64_t batch_size);

// Compute threads of one of `local` processes on this machine: an unbound process (mpirun
// --bind-to none) shares the machine's CPUs with the others.
ThreadConfig configure_rank_threads(const Config& c, int local);

}  // namespace seqforge
