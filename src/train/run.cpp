#include "run.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/file_util.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/hash.hpp"
#include "seqforge/nn/checkpoint.hpp"
#include "seqforge/train/data_options.hpp"
#include "seqforge/train/trainer.hpp"
#include "task_type.hpp"

namespace seqforge {

namespace fs = std::filesystem;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

// Whether init_from loads tensors indexed by the vocabulary (an embedding or an output head over
// characters): all of them, or init_from_modules names one of their modules.
bool init_loads_vocabulary(const Config& c) {
  const std::vector<std::string> modules = c.list("model.init_from_modules");
  if (modules.empty()) return true;
  for (const std::string& m : modules)
    if (m == "embedding" || m == "head" || m == "transformer" || m == "lm_head") return true;
  return false;
}

}  // namespace

Config as_it_trained(const Config& stored) {
  Config c = stored;
  if (!c.is_set("data.split.context"))
    c = c.with_values({{"data.split.context", "strict"}},
                      c.source() + " (written before data.split.context; its windows were strict)");
  if (!c.is_set("data.horizon_mode"))
    c = c.with_values({{"data.horizon_mode", "last"}},
                      c.source() +
                          " (written before data.horizon_mode; its outputs were the "
                          "last step's)");
  return c;
}

Task load_task(const Config& c, const Task* from) {
  Task t;
  const Dataset* source = from;
  // A text task on a pre-trained model: the model's vocabulary, so that every id means the
  // character it meant in pre-training (the data's own could differ by one character and shift
  // every id after it).
  Dataset pretrained;
  const TaskKind task = parse_task(c.str("data.task"), c.origin("data.task"));
  // Characters (a decoder reads its tokenizer's tokens instead).
  const bool text = (task == TaskKind::text_classify || task == TaskKind::charlm) &&
                    c.str("model.family") != "decoder";
  if (std::string init = c.str("model.init_from");
      !from && !init.empty() && text && init_loads_vocabulary(c)) {
    if (fs::is_directory(init)) init = (fs::path(init) / "model.safetensors").string();
    const io::SafetensorsFile file = io::SafetensorsFile::read(init);
    const auto& meta = file.metadata();
    if (const auto it = meta.find("seqforge.vocab"); it != meta.end()) {
      const auto vocab = nlohmann::json::parse(it->second, nullptr, false);
      if (!vocab.is_string()) fail(init, ": seqforge.vocab metadata is not what seqforge wrote");
      pretrained.text.vocab = decode_utf8(vocab.get<std::string>(), init + ": seqforge.vocab");
      source = &pretrained;
    }
  }
  static_cast<Dataset&>(t) = load_dataset(c, source);
  t.model = model_options(c, t);
  t.loss = regression_loss_of(c, t.kind);
  return t;
}

// Metadata stored with the weights: what eval, predict and generate need to rebuild the task.
std::map<std::string, std::string> checkpoint_metadata(const Config& c, const Task& t,
                                                       int64_t epoch,
                                                       const std::map<std::string, double>& m) {
  std::map<std::string, std::string> meta = {
      {"format", "seqforge"},
      {"seqforge.version", SEQFORGE_VERSION},
      {"seqforge.layout",
       t.model.family == ModelFamily::transformer
           ? "nanoGPT names (model.py): transformer.wte, transformer.wpe, transformer.h.{i}.ln_1, "
             ".attn.c_attn (q, k, v row blocks), .attn.c_proj, .ln_2, .mlp.c_fc, .mlp.c_proj, "
             "transformer.ln_f; lm_head.weight is transformer.wte.weight (tied)"
           : "PyTorch names: embedding (nn.Embedding), lstm (nn.LSTM, batch_first=True, gate "
             "order i, f, g, o), gru (nn.GRU, batch_first=True, gate order r, z, n) or lnlstm "
             "(nn.LSTM's names and gate order, and the layer norms' "
             "lnlstm.{ln_ih_weight,ln_hh_weight,ln_c_weight,ln_c_bias}_l{k}), head (nn.Linear " +
                 std::string(t.model.per_step ? "on every step's output"
                             : t.model.final_states
                                 ? "on the final states: torch.cat([h_n[-2], h_n[-1]], 1), "
                                   "or h_n[-1] unidirectional"
                                 : "on the last step's output, output[:, -1]") +
                 ")"},
      {"seqforge.config", c.resolved_yaml()},
      {"seqforge.epoch", std::to_string(epoch)},
      {"seqforge.metrics", nlohmann::json(m).dump()},
  };
  task_type(t.kind).store(c, t, &meta);
  return meta;
}

std::vector<std::pair<std::string, Tensor>> named(const Parameters& params, const Arena& arena,
                                                  const std::string& prefix, bool aliases) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.emplace_back(prefix + params.values().entries()[i].name, arena.view(i));
  if (aliases)
    for (const auto& [name, i] : params.aliases()) out.emplace_back(prefix + name, arena.view(i));
  return out;
}

// Copies a tensor of `file` into `dst`, checking its shape and values; errors name the file and
// tensor.
void load_tensor(const io::SafetensorsFile& file, const std::string& name, Tensor dst, Backend* be,
                 bool non_negative) {
  const io::SafetensorsEntry* e = file.find(name);
  if (!e) fail(file.source(), ": missing tensor '", name, "' (a run of another architecture?)");
  if (Shape(e->shape) != dst.shape() || e->dtype != dst.dtype())
    fail(file.source(), ": tensor '", name, "' is ", dtype_safetensors_name(e->dtype), " ",
         Shape(e->shape).str(), ", this run has ", dtype_safetensors_name(dst.dtype()), " ",
         dst.shape().str(), " (a run of another architecture?)");
  const auto bytes = file.bytes(*e);
  double bad = 0;
  if (const int64_t at = first_non_finite(bytes.data(), e->dtype, size_t(dst.numel()), &bad);
      at >= 0)
    fail(file.source(), ": tensor '", name, "' holds a non-finite value (", bad, " at index ", at,
         ")");
  if (non_negative && e->dtype == DType::f32)
    for (int64_t i = 0; i < dst.numel(); ++i) {
      float v = 0;
      std::memcpy(&v, bytes.data() + i * sizeof v, sizeof v);  // file data may be unaligned
      if (v < 0)
        fail(file.source(), ": tensor '", name, "' holds a negative value (", v, " at index ", i,
             "), which it cannot hold");
    }
  if (be)
    be->upload(dst, bytes.data());
  else
    std::memcpy(dst.data(), bytes.data(), bytes.size());
}

namespace {

// A run's checkpoint, its stored config (data.path replaced by `data_override` when given) and
// the task as stored: normalizers, classes, vocabulary, column names.
LoadedRun read_run(const std::string& run, const std::string& data_override,
                   const InputReading& missing = {}) {
  const std::string path =
      fs::is_directory(run) ? (fs::path(run) / "model.safetensors").string() : run;
  if (!fs::exists(run)) fail(run, ": no such run directory or model.safetensors");
  if (fs::is_directory(run) && !fs::exists(path)) {
    if (fs::exists(fs::path(run) / "study.db") || fs::exists(fs::path(run) / "best.yaml") ||
        fs::exists(fs::path(run) / "study.json"))
      fail(run, ": a tune study's directory, not a run: give one of its trials (", run,
           "/trial-N; `seqforge tune --report` names the best)");
    if (fs::exists(fs::path(run) / "metrics.jsonl"))
      fail(run,
           ": the run saved no model yet (model.safetensors is written at its first saved "
           "epoch)");
    fail(run, ": no model.safetensors here (not a run directory)");
  }
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".yaml" || ext == ".yml")
    fail(run, ": a config, not a run: train it first (seqforge train ", run,
         "), then give the run directory");
  char magic[16] = {};
  if (std::error_code ec; fs::is_regular_file(path, ec))  // a pipe would block: read() refuses it
    std::ifstream(path, std::ios::binary).read(magic, sizeof magic);
  if (std::string(magic, sizeof magic) == std::string("SQLite format 3\0", 16))
    fail(run, ": a study database, not a run: `seqforge tune --report ", run,
         "` names its best trial");
  io::SafetensorsFile file;
  try {
    file = io::SafetensorsFile::read(path);
  } catch (const std::exception& e) {
    if (ext == ".safetensors") throw;
    fail(run, ": not a run directory or a model.safetensors (", e.what(), ")");
  }
  const auto& meta = file.metadata();
  if (meta.count("seqforge.loop"))
    fail(path, ": a run's training state (what --resume reads), not its model: give the run ",
         "directory or its model.safetensors");
  if (!meta.count("seqforge.config")) {
    const auto& entries = file.entries();
    if (!entries.empty() && entries.front().name.starts_with("base_model.model."))
      fail(path, ": a PEFT adapter file, which holds the adapters alone: give the run directory ",
           "it belongs to (or its model.safetensors)");
    if (const fs::path folder = fs::absolute(fs::path(path)).parent_path();
        fs::exists(folder / "config.json"))
      fail(folder.string(), ": a Hugging Face model folder, not a seqforge run: a run from it ",
           "(model.family: decoder, model.init_from: ", folder.string(),
           ") evaluates, predicts and generates with it");
    fail(path, ": not a seqforge checkpoint (no seqforge.config metadata)");
  }
  Config config =
      as_it_trained(Config::parse(meta.at("seqforge.config"), path + " (stored config)"));
  if (!data_override.empty())
    config = config.with_values({{"data.path", yaml_string(data_override)}}, "the data file given");
  if (!missing.codes.empty()) {
    std::vector<std::string> codes = config.list("data.missing_values");
    for (const std::string& code : missing.codes) {
      if (code.empty())
        fail("--missing-values: an empty entry (empty cells are missing values already)");
      if (std::find(codes.begin(), codes.end(), code) == codes.end()) codes.push_back(code);
    }
    YAML::Emitter list;
    list << YAML::Flow << YAML::BeginSeq;
    for (const std::string& code : codes) list << YAML::DoubleQuoted << code;
    list << YAML::EndSeq;
    config = config.with_values({{"data.missing_values", list.c_str()}}, "--missing-values");
  }
  if (const std::string& order = missing.date_order; !order.empty()) {
    if (order != "dmy" && order != "mdy")
      fail("--date-order: expected dmy (day first) or mdy (month first), got ", io::quoted(order));
    config = config.with_values({{"data.date_order", order}}, "--date-order");
  }
  if (const std::string& fill = missing.fill; !fill.empty()) {
    const std::string trained = config.str("data.missing");
    if (fill != "error" && fill != "ffill" && fill != "interpolate")
      fail("--missing: expected error, ffill or interpolate, got ", io::quoted(fill));
    if (trained == "mask")
      fail("--missing ", fill, ": ", run,
           " masks missing cells (data.missing: mask), as its model was trained to read them");
    config = config.with_values({{"data.missing", fill}}, "--missing");
  }
  // A run keeps data.holidays' days in its checkpoint: the file may have moved or gone.
  if (meta.count("seqforge.holidays") && !config.str("data.holidays").empty())
    config = config.with_values({{"data.holidays", "''"}}, "the run's holidays");
  // A token model's run keeps the tokenizer it trained with: read from there, the run needs
  // neither the base folder nor the file data.tokenizer named (both may have changed or gone).
  const fs::path run_dir = fs::absolute(fs::path(path)).parent_path();
  if (const fs::path own = run_dir / "tokenizer.json";
      fs::exists(run_dir / "config.resolved.yaml") && fs::exists(own) &&
      (config.str("data.task") == "lm" || config.str("data.task") == "text_classify"))
    config = config.with_values({{"data.tokenizer", yaml_string(own.string())}},
                                "the run's tokenizer.json");
  // A decoder's run directory is a Hugging Face folder of its own (its config.json beside the
  // weights, which it holds whole): the model is built from there, and the base may have gone.
  const std::string base_model = config.str("model.init_from");
  if (config.str("model.family") == "decoder" && fs::exists(run_dir / "config.resolved.yaml") &&
      fs::exists(run_dir / "config.json")) {
    const std::string own = (run_dir / "config.json").string();
    if (const auto then = meta.find(kConfigJsonHashKey); then != meta.end()) {
      if (const std::string now = config_json_hash(io::read_file(own)); now != then->second)
        fail(own, ": differs in content from the config.json the run wrote (", kConfigJsonHashKey,
             " ", then->second, " in ", path, ", now ", now,
             "): the model would be built otherwise than it trained; use the run's copy");
    }
    config = config.with_values({{"model.init_from", yaml_string(run_dir.string())}},
                                "the run's config.json");
  }
  Task stored;
  stored.kind = parse_task(config.str("data.task"), path + " (stored config)");
  task_type(stored.kind).restore(meta, path, &stored);
  if (stored.kind == TaskKind::forecast && !stored.series.target_norm.shift.empty()) {
    // The scalers against the checkpoint's own config: an edited checkpoint is named as such.
    const int64_t steps =
        config.str("data.horizon_mode") == "direct" ? config.integer("data.horizon") : 1;
    if (stored.series.target_norm.steps != std::max<int64_t>(steps, 1))
      fail(path, ": seqforge.target_norm holds scalers for ", stored.series.target_norm.steps,
           " steps ahead where its stored config forecasts ", steps,
           " (data.horizon, data.horizon_mode): the checkpoint is inconsistent");
  }
  return {std::move(file), std::move(config), std::move(stored), base_model};
}

}  // namespace

const std::vector<std::string> kRunFiles = {"config.resolved.yaml",
                                            "metrics.jsonl",
                                            "model.safetensors",
                                            "training_state.safetensors",
                                            "report.html",
                                            "val_predictions.csv",
                                            "val_reconstructions.csv",
                                            "trace.json",
                                            "adapter_model.safetensors",
                                            "adapter_config.json",
                                            "config.json",
                                            "tokenizer.json",
                                            "tokenizer_config.json",
                                            "special_tokens_map.json"};

void check_output_outside_run(const std::string& output, const std::string& run,
                              const std::string& option) {
  if (output.empty() || output == "-") return;
  std::error_code ec, ec_run;
  const bool run_is_dir = fs::is_directory(run, ec);
  const fs::path dir = run_is_dir ? fs::path(run) : fs::path(run).parent_path();
  const fs::path target = fs::weakly_canonical(output, ec);
  const fs::path run_dir = fs::weakly_canonical(dir.empty() ? "." : dir, ec_run);
  if (ec || ec_run) return;  // paths that cannot be resolved: the write itself fails
  const std::string name = target.filename().string();
  const bool own = target.parent_path() == run_dir &&
                   (name == ".lock" || name == "train.log" ||
                    std::find(kRunFiles.begin(), kRunFiles.end(), name) != kRunFiles.end());
  if (own || (!fs::is_directory(run, ec) && target == fs::weakly_canonical(run, ec)))
    fail(option, ": ", output, " is the run's own ", name,
         "; writing it would destroy the run: give another path");
  // A folder output (a merged Hugging Face folder) writes model.safetensors and config.json into
  // it: never into a run, this one or another.
  const bool in_a_run = run_is_dir || fs::exists(run_dir / "config.resolved.yaml", ec) ||
                        fs::path(run).filename() == "model.safetensors";
  if ((target == run_dir && in_a_run) || fs::exists(target / "config.resolved.yaml", ec))
    fail(option, ": ", output, " is ",
         target == run_dir ? "the run's own directory" : "a run directory",
         "; writing into it would destroy ", target == run_dir ? "the run" : "that run",
         ": give another path");
  // Nor the data it trained on, which eval and --resume read again (a Python run's is in it).
  std::string data;
  try {
    if (fs::is_regular_file(run_dir / "config.resolved.yaml", ec))
      data = Config::load((run_dir / "config.resolved.yaml").string()).str("data.path");
  } catch (const Error&) {  // loading the run says what is wrong with it
  }
  if (!data.empty() && fs::equivalent(output, data, ec))
    fail(option, ": ", output, " is the data the run trained on (its data.path); writing it ",
         "would replace it: give another path");
  if (fs::exists(target.parent_path() / "config.resolved.yaml", ec) &&
      (name == ".lock" || name == "train.log" ||
       std::find(kRunFiles.begin(), kRunFiles.end(), name) != kRunFiles.end()))
    fail(option, ": ", output, " is the ", name, " of the run in ", target.parent_path().string(),
         "; writing it would destroy that run: give another path");
}

void check_output_file(const std::string& output, const std::string& option,
                       const std::vector<std::pair<std::string, std::string>>& reads) {
  if (output.empty() || output == "-") return;
  std::error_code ec;
  if (fs::is_directory(output, ec))
    fail(option, ": ", output, " is a folder; give a file to write");
  for (const auto& [path, what] : reads)
    if (!path.empty() && fs::equivalent(output, path, ec))
      fail(option, ": ", output, " is ", what, ": writing it would replace it; give another file");
  const fs::path folder = fs::path(output).parent_path();
  if (!folder.empty() && !fs::is_directory(folder, ec))
    fail(option, ": ", output, ": there is no folder ", folder.string(), " to write it in");
  // A file made and removed again: the folder takes new files (permissions, a read-only or
  // special file system), before the work whose result it is to hold.
  if (fs::exists(output, ec) && !fs::is_regular_file(output, ec)) return;  // /dev/stdout
  const fs::path probe =
      (folder.empty() ? fs::path(".") : folder) / (".seqforge-write-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    fail(option, ": ", output, ": cannot write in ", folder.empty() ? "." : folder.string(), ": ",
         std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string config_json_hash(const std::string& text) {
  // Of the content, keys sorted: line ends, indentation and key order are no change.
  const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const std::string canonical = parsed.is_discarded() ? text : parsed.dump();
  return hash_hex(hash_text(canonical));
}

LoadedRun load_run(const std::string& run, const std::string& data_override, WindowSet windows,
                   const InputReading& missing) {
  LoadedRun r = read_run(run, data_override, missing);
  const TaskKind kind = r.task.kind;
  const bool forecasts =
      kind == TaskKind::forecast || kind == TaskKind::classify || kind == TaskKind::text_classify;
  if ((windows == WindowSet::every_window || windows == WindowSet::last_windows) && !forecasts)
    fail(run, ": predict needs a forecast, classify or text_classify run; this is a ",
         task_name(kind), " run",
         r.task.is_lm()          ? " (sample from it with seqforge generate)"
         : kind == TaskKind::mae ? " (eval --data FILE scores its reconstructions of a file)"
                                 : "");
  if (windows == WindowSet::last_windows && kind == TaskKind::text_classify)
    fail("--last: a text classifier predicts every row of the file");
  // The splits of a file that changed since training are other rows than the run's.
  const auto then = r.file.metadata().find("seqforge.data");
  if (windows == WindowSet::splits && data_override.empty() && then != r.file.metadata().end() &&
      !then->second.empty()) {
    const std::string path = r.config.str("data.path");
    if (const std::string now = io::file_fingerprint(path);
        !now.empty() && !io::same_fingerprint(path, then->second, now))
      fail(path, ": changed since ", run, " trained on it (", then->second, " then, ", now,
           " now): its val and test splits would be other rows; evaluate the new file with "
           "--data, or train a new run on it");
  }
  Task task;
  static_cast<Dataset&>(task) = load_dataset(r.config, &r.task, windows);
  // The stored config's columns give the model's inputs and outputs in the order
  // seqforge.features and seqforge.targets name them.
  const auto same_columns = [&](const char* key, const std::vector<std::string>& then,
                                const std::vector<std::string>& now) {
    if (now == then) return;
    size_t i = 0;
    while (i < now.size() && i < then.size() && now[i] == then[i]) ++i;
    fail(r.file.source(), ": ", key, " names ", then.size(), " columns",
         i < then.size() ? ", column " + std::to_string(i) + " " + io::quoted(then[i]) : "",
         "; its stored config gives ", now.size(),
         i < now.size() ? ", column " + std::to_string(i) + " " + io::quoted(now[i]) : "",
         ": the checkpoint is damaged");
  };
  if (!task.is_text()) {
    same_columns("seqforge.features", r.task.series.feature_names, task.series.feature_names);
    if (task.kind == TaskKind::forecast)
      same_columns("seqforge.targets", r.task.series.target_names, task.series.target_names);
  }
  task.model = model_options(r.config, task);
  task.loss = regression_loss_of(r.config, task.kind);
  r.task = std::move(task);
  return r;
}

LoadedRun load_run_model(const std::string& run) {
  LoadedRun r = read_run(run, "");
  Task& t = r.task;
  if (!t.is_text() && t.series.feature_names.empty()) {
    // A checkpoint that does not name its columns: its data file does.
    static_cast<Dataset&>(t) = load_dataset(r.config, &t, WindowSet::splits);
    t.model = model_options(r.config, t);
    t.loss = regression_loss_of(r.config, t.kind);
    return r;
  }
  const DataOptions o = data_options(r.config);
  t.path = o.path;
  // What sizes the model's head, as load_series sets it: steps ahead, quantiles, every step,
  // and a masked autoencoder's file features (its head's rows: the names include derived ones).
  t.series.task = t.kind;
  t.series.lookback = o.series.lookback;
  t.series.horizon = o.series.horizon;
  if (t.kind == TaskKind::forecast && o.series.horizon_mode == "direct")
    t.series.steps_ahead = o.series.horizon;
  if (t.kind == TaskKind::forecast) t.series.quantiles = o.series.quantiles;
  t.series.every_step = o.series.every_step;
  if (t.kind == TaskKind::mae) {
    const io::SafetensorsEntry* head = r.file.find("head.weight");
    if (!head || head->shape.size() != 2)
      fail(r.file.source(), ": a masked autoencoder's checkpoint without its head.weight matrix");
    t.series.file_features = head->shape[0];
  }
  t.text.seq_len = o.text.seq_len;
  t.text.segments = o.text.columns.size() == 2 ? 2 : 0;
  t.model = model_options(r.config, t);
  t.loss = regression_loss_of(r.config, t.kind);
  return r;
}

// The model of a loaded run, its weights loaded, computing in the run's precision.
std::unique_ptr<Model> load_model(Backend& be, const LoadedRun& r, std::ostream* notes) {
  std::string notice;
  const DType gemm = model_precision(r.config.str("train.precision"), be, r.task.model, &notice);
  // A base held in bf16 needs bf16 GEMMs; without them it is held in f32, which holds its bf16
  // values exactly.
  ModelOptions options = r.task.model;
  if (options.adapter.bf16_base && gemm != DType::bf16) {
    options.adapter.bf16_base = options.decoder.adapter.bf16_base = false;
    notice += std::string(notice.empty() ? "" : "; ") +
              "adapter.base_precision bf16: the base weights held in fp32 for fp32 GEMMs";
  }
  auto model = make_model(options);
  check_model_fits(*model, r.config, false);
  model->initialize(be, 0);
  load_parameters(r.file.source(), model->parameters(), be);
  model->set_gemm_dtype(gemm);
  if (!notice.empty() && notes) *notes << "note: " << notice << "\n";
  return model;
}

StatefulStreams checked_stateful_streams(const Config& c, const Dataset& d, int64_t batch_size) {
  // A chunk continues a stream from the window one lookback after the last: one cut at every
  // stride rows exists only where the stride divides the lookback.
  if (const int64_t stride = d.is_lm() ? 1 : c.integer("data.stride"); d.steps() % stride != 0)
    fail(c.origin("data.stride"), ": data.stride ", stride, " does not divide data.lookback ",
         d.steps(),
         ", so under train.stateful no window starts where another ends and no "
         "state would be carried: set it to a divisor of ",
         d.steps(), " (1 keeps every window)");
  StatefulStreams streams = stateful_streams(d, batch_size);
  if (streams.batches == 0)
    fail(c.origin("train.stateful"), ": train.stateful: the training split holds ",
         d.split().train.size(), " windows, too few for ", batch_size,
         " streams of consecutive chunks of ", d.steps(),
         " steps; lower train.batch_size or data.lookback");
  return streams;
}

StatefulStreams stateful_streams(const Dataset& d, int64_t batch_size) {
  const int64_t T = d.steps();
  std::vector<int64_t> chunks;
  std::vector<uint8_t> fresh;
  int64_t last = -1;
  for (int64_t s : d.split().train) {  // in time order
    if (last >= 0 && s < last + T) continue;
    const bool continues = last >= 0 && s == last + T &&
                           (d.is_lm() || (&d.series.series_of(s) == &d.series.series_of(last) &&
                                          !d.series.follows_gap(s)));
    chunks.push_back(s);
    fresh.push_back(continues ? 0 : 1);
    last = s;
  }
  StatefulStreams out;
  const int64_t n = static_cast<int64_t>(chunks.size()), L = n / batch_size;
  out.batches = L;
  out.chunks = n;
  for (int64_t k = 0; k < L; ++k)
    for (int64_t i = 0; i < batch_size; ++i) {
      out.order.push_back(chunks[i * L + k]);
      out.reset.push_back(k == 0 || fresh[i * L + k] ? 1 : 0);
    }
  return out;
}

// Compute threads of one of `local` processes on this machine: an unbound process (mpirun
// --bind-to none) shares the machine's CPUs with the others.
ThreadConfig configure_rank_threads(const Config& c, int local) {
  const int64_t requested = c.integer("train.threads");  // 0: one per CPU
  const int cpus = usable_cpus(), online = online_cpus();
  ThreadConfig t;
  if (local <= 1 || requested > 0 || std::getenv("OMP_NUM_THREADS") || cpus < online) {
    t = configure_threads(static_cast<int>(requested));  // alone, or bound by the launcher
  } else {
    t = configure_threads(std::max(1, cpus / local));
    t.reason = std::to_string(cpus) + " CPUs shared by " + std::to_string(local) +
               " processes on this machine";
  }
  return t;
}

}  // namespace seqforge
