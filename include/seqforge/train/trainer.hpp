#pragma once
// The trainer behind `seqforge train | eval | generate`: builds the dataset and model from a
// config, runs the epoch loop (validation, early stopping, learning-rate schedules, clipping,
// checkpoints written atomically in the background) and reports every epoch.
#include <functional>
#include <iostream>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "seqforge/train/config.hpp"

namespace seqforge {

struct TrainSummary {
  std::string run_dir, checkpoint;     // the run directory; its model.safetensors
  int64_t epochs = 0;                  // epochs run
  std::string monitor;                 // the monitored metric
  double best = 0;                     // its best value
  std::map<std::string, double> last;  // the last epoch's metrics
  std::map<std::string, double> test;  // the saved model on the test split (train.test_after)
  bool stopped = false;                // a hook's on_epoch ended the run early
};

// Callbacks into the epoch loop (used by `seqforge tune`).
struct TrainHooks {
  // After each epoch's validation, with that epoch's metrics (val_loss, train_loss, ...).
  // Returning false ends the run after this epoch, with its checkpoint and state written.
  std::function<bool(int64_t epoch, const std::map<std::string, double>& metrics)> on_epoch;
  // What such an end is called, in the log and as the last epoch's "stop" in metrics.jsonl:
  // "pruned" (a study's trial), "on_epoch" (a caller's callback).
  std::string on_epoch_stop = "on_epoch";
  // After each training step, with its epoch, the batches of that epoch done and its batches.
  std::function<void(int64_t epoch, int64_t batches_done, int64_t batches_per_epoch)> on_step;
};

// Thrown when the training loss or the model's parameters stop being finite, or the gradient's
// norm is NaN or past what float32 holds squared; the last saved checkpoint (the best epoch's,
// with train.save: best) is left as it was.
class Diverged : public Error {
 public:
  using Error::Error;
};

// Trains per `config`; progress and one line per epoch go to `out`. With `resume_dir`, continues
// that run from the state saved after its last complete epoch (training_state.safetensors:
// parameters, optimizer moments, step, epoch, sample order, RNG, early-stopping and schedule
// state); with deterministic settings the resumed run's metrics equal an uninterrupted run's.
// SIGINT or SIGTERM stops the run before its next step: the training state is saved (a resumed
// run continues at that batch) and Interrupted (core/interrupt.hpp) is thrown.
// A new run never mixes with another run's files: train.run_dir must not hold a run unless
// `overwrite` (which removes that run's files first); without train.run_dir the run goes to
// runs/<config name>, or runs/<config name>-2, -3, ... when that holds a run. Paths in the
// stored config are absolute. A non-finite training loss or model stops the run with Diverged
// and saves nothing from it.
TrainSummary train(const Config& config, std::ostream& out, const std::string& resume_dir = "",
                   const TrainHooks& hooks = {}, bool overwrite = false);

// The settings a run checks before it reads its data (a column named twice, the optimizer's and
// the augmentations'), each refused naming its key: what train, diagnose and tune refuse at once.
void check_settings(const Config& c);

// What a run refuses before its first step, with its data read: check_settings, then the data
// file and its splits, the monitored metric, stateful streams. Tune checks its trials' config
// with it before the study exists.
void check_before_training(const Config& c);

// Settings the config gives that do nothing with its other settings (a transformer's model.cell,
// adapter.rank without an adapter, ...), one warning each; train prints them at start-up.
std::vector<std::string> ignored_settings(const Config& c);

// Whether a run of the config's task can watch the metric `name` (train_loss, val_loss or one of
// the task's val_* metrics; which of these its data gives is known once the data is read).
bool task_can_report(const Config& c, const std::string& name);

// How eval and predict read another file: `fill` ("ffill" or "interpolate") in place of the
// run's data.missing, `codes`, texts that mark a missing cell besides the run's
// data.missing_values, and `date_order` ("dmy" or "mdy") for dates whose day and month no date
// of the file tells apart (each empty: as the run trained).
struct InputReading {
  std::string fill;
  std::vector<std::string> codes;
  std::string date_order;
  bool empty() const { return fill.empty() && codes.empty() && date_order.empty(); }
};

// Metrics of a trained run (a run directory or its model.safetensors) on a split of its data
// ("val" or "test": test_*, val_* metrics), or on every window of another file of the same
// layout (`data`: data_* metrics), computed in the run's precision; the precision's note, if
// any, goes to `notes` (none: not printed).
// `missing` (with `data`) says how that file's missing cells are read (see load_run).
std::map<std::string, double> evaluate(const std::string& run, const std::string& split,
                                       const std::string& data = "",
                                       std::ostream* notes = &std::cerr,
                                       const InputReading& missing = {});

// Macro-averaged F1 from per-class true positives, false positives and false negatives, over the
// classes present in the truth or the predictions (scikit-learn's default); 0 with none.
double macro_f1(const std::vector<int64_t>& tp, const std::vector<int64_t>& fp,
                const std::vector<int64_t>& fn);

struct PredictOptions {
  std::string input;       // a CSV (or .npy) of the training data's layout; targets optional
  std::string output;      // CSV to write; "-": standard output
  bool last_only = false;  // only the forecast after each series' last row
  InputReading missing{};  // how the input's missing cells are read ({}: as the run trained)
};

// One column of predictions: text (series, dates, classes) or numbers (NaN: empty).
struct PredictionColumn {
  enum class Kind { text, integer, f32, f64 };  // numbers: as computed (f32) or read (f64)
  PredictionColumn(std::string name_, Kind kind_) : name(std::move(name_)), kind(kind_) {}
  std::string name;
  Kind kind;
  std::vector<std::string> text;  // a text column's rows
  std::vector<double> values;     // a numeric column's rows
};

// What predict writes, as a table: its columns in the file's order.
struct Predictions {
  std::vector<PredictionColumn> columns;
  int64_t rows = 0;                // windows times steps ahead (text: examples)
  int64_t windows = 0;             // windows (text: examples) predicted
  double compute_seconds = 0;      // assembling windows and running the model
  std::vector<std::string> notes;  // facts worth a line (short series, empty predictions)
  std::string summary;             // "predict: N windows in S s (...)"
};
Predictions predictions(const std::string& run, const std::string& input, bool last_only,
                        const InputReading& missing = {});
// The table as predict's CSV: numbers computed in f32 as their shortest f32 text.
std::string predictions_csv(const Predictions& p);

// Predictions of a forecasting or classification run for every complete window of `input`
// (never split), in the run's precision: per window its series, its last row's date (or row),
// the date (or row) the forecast is for, and the prediction in the targets' own units (transforms
// undone) with round-trip precision, or the class and every class's probability; the actual
// value beside it when the file has it. A throughput line goes to `log`. Returns the windows
// predicted (a row each, or one per step ahead).
int64_t predict(const std::string& run, const PredictOptions& options, std::ostream& log);

// Fails at once, naming `option`, where the file `output` cannot be written: a folder, or in a
// folder that does not exist ("-" is standard output), or one of the files the command reads
// (`reads`: each file's path and what it is), which writing would replace. A command checks
// before its work.
void check_output_file(const std::string& output, const std::string& option,
                       const std::vector<std::pair<std::string, std::string>>& reads = {});

// Samples `length` characters (a token model: tokens) from a language model after `prompt`;
// returns the prompt and the sample. `stream`, when given, receives that text as it is made, in
// pieces whose concatenation is the returned text (a token model's held back until its decoding
// is whole characters).
std::string generate(const std::string& run, const std::string& prompt, int64_t length,
                     double temperature, int64_t top_k, uint64_t seed, double top_p = 1.0,
                     const std::function<void(std::string_view)>& stream = {});

// Folds a run's LoRA or DoRA adapters into its base weights (W0 + (alpha/r) B A; DoRA: m V /
// ||V|| per row) and writes them as a plain transformer checkpoint (nanoGPT's names, the run's
// config with adapter.kind none), atomically. Returns the Linears merged.
int64_t merge_adapters(const std::string& run, const std::string& output);

}  // namespace seqforge

namespace seqforge {

// Writes what the report draws of a run's saved model on the validation split: forecasting and
// classification, val_predictions.csv (row: the target's 1-based data row, time: its date when
// the data has dates, series: when there are several, actual, predicted: the first target in
// its own units, or class names); mae, val_reconstructions.csv (a few windows: window, step,
// feature, original, reconstructed, masked, normalised). Returns the windows written (0 for
// charlm, which writes nothing).
int64_t write_validation_outputs(const std::string& run);

// What `seqforge diagnose CONFIG` reports: the data and model a config gives on this machine,
// memory per batch, and seconds per epoch estimated from a short measured run.
struct ConfigDiagnosis {
  std::string task;
  int64_t rows = 0;                      // data rows (characters for text)
  int64_t train = 0, val = 0, test = 0;  // windows (sequences) per split
  int64_t steps = 0;                     // time steps per window
  int64_t parameters = 0, batch_size = 0, batches_per_epoch = 0;
  int64_t micro_batch = 0;       // examples through forward and backward at once
  std::string micro_batch_note;  // how train.micro_batch_size auto chose ("" when not auto)
  double batch_input_mb = 0;     // one batch's inputs and targets
  double activation_mb = 0;      // estimate: what a micro-batch keeps for backward, and gradients
  double measured_peak_mb = 0;   // peak resident memory of this process after the measured run
  // On a GPU (train.device cuda, or auto with one): which, the precision its GEMMs run in, a
  // step's estimated need (parameters, gradients, moments, activations) and its memory.
  std::string device, device_precision;
  double device_need_mb = 0, device_free_mb = 0, device_total_mb = 0;
  int timed_steps = 0;
  double step_seconds = 0;            // median training step
  double validation_seconds = 0;      // one validation pass
  double epoch_seconds = 0;           // batches_per_epoch steps plus validation
  std::vector<std::string> problems;  // one line each: what is wrong, and what to change
  std::vector<std::string> notes;     // what train says of the data at start-up ("note: ...")
};

// Loads the data and model as `train` would, trains `steps` steps in a temporary run directory,
// and lists problems. Errors that train would throw before it starts come out the same way.
ConfigDiagnosis diagnose_config(const Config& config, int steps = 10);

}  // namespace seqforge
