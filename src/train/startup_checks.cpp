#include "startup_checks.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "io/file_util.hpp"
#include "loop.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/data/augment.hpp"
#include "seqforge/data/datasets.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/nn/decoder.hpp"
#include "seqforge/train/data_options.hpp"
#include "task_type.hpp"

namespace seqforge {

namespace fs = std::filesystem;

namespace {

// The optimizer's settings, as the optimizer would refuse them, but before any work and naming
// where the config set them.
void check_optimizer_settings(const Config& c) {
  for (const char* key : {"optim.lr", "optim.weight_decay", "optim.eps", "optim.momentum"})
    if (const double v = c.number(key); !(v >= 0 && std::isfinite(v)))
      fail(c.origin(key), ": ", key, " must be a finite number >= 0, got ", v);
  for (const char* key : {"optim.beta1", "optim.beta2"})
    if (const double v = c.number(key); c.str("optim.kind") != "sgd" && !(v >= 0 && v < 1))
      fail(c.origin(key), ": ", key, " must be in [0, 1), got ", v);
  // Adam divides by sqrt(v) + eps: 0 makes a parameter whose gradient is 0 a NaN.
  if (c.str("optim.kind") != "sgd" && c.number("optim.eps") == 0)
    fail(c.origin("optim.eps"),
         ": optim.eps must be above 0 (Adam divides by sqrt(v) + eps, "
         "and a gradient of 0 would give 0/0); PyTorch's default is 1e-8");
}

// A column named twice in one of the lists of columns, refused before training (a stored config
// that holds one still loads, so such a model keeps predicting).
void check_distinct_columns(const Config& c) {
  for (const char* key : {"data.features", "data.targets", "data.calendar", "data.known_future",
                          "data.static", "data.categorical"}) {
    const std::vector<std::string> names = c.list(key);
    for (size_t i = 0; i < names.size(); ++i)
      if (std::find(names.begin(), names.begin() + i, names[i]) != names.begin() + i)
        fail(c.origin(key), ": ", key, " names '", names[i], "' twice");
  }
}

// predict writes series, window_end, forecast_for and step beside each target's forecast and its
// <target>_actual: a new run's target of one of those names would make two columns of one name.
void check_target_names(const Config& config) {
  if (config.str("data.task") != "forecast") return;
  const std::vector<std::string> targets = config.list("data.targets");
  for (const std::string& target : targets) {
    for (const char* own : {"series", "window_end", "forecast_for", "step"})
      if (target == own)
        fail(config.origin("data.targets"), ": data.targets: '", target,
             "' is the name of a column predict writes (series, window_end, forecast_for, step); "
             "rename the column in the data");
    if (std::find(targets.begin(), targets.end(), target + "_actual") != targets.end())
      fail(config.origin("data.targets"), ": data.targets: '", target,
           "_actual' is the name of the column predict writes for target '", target,
           "''s actual values; rename one of them");
  }
}

// A resumed run continues the function it trained on the windows it trained on, and goes on
// from its state as it was: an override of a key that changes the model's function, its
// parameters' layout, what its windows hold or which windows each split has, how its saved state
// is read (the optimizer's moments, the seed of its masks) or what its best score measures is
// refused, naming the key and both values. (Keys such as train.epochs, the rate or the patience
// may change.)
bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::weakly_canonical(fs::absolute(a), ec) == fs::weakly_canonical(fs::absolute(b), ec);
}

void check_resume_keeps_the_model(const Config& config, const std::string& resume_dir) {
  const fs::path resolved = fs::path(resume_dir) / "config.resolved.yaml";
  if (!fs::is_regular_file(resolved)) return;  // nothing to resume: the run says so
  // The config its state was saved under (its header hashed with it), where the state holds one:
  // config.resolved.yaml edited since is an override as well.
  const Config written = as_it_trained(Config::load(resolved.string()));
  Config saved = written;
  if (const fs::path state = fs::path(resume_dir) / "training_state.safetensors";
      fs::is_regular_file(state)) {
    const io::SafetensorsFile file = io::SafetensorsFile::read(state.string());
    if (const auto it = file.metadata().find("seqforge.config"); it != file.metadata().end())
      saved = as_it_trained(Config::parse(it->second, state.string() + " (stored config)"));
  }
  for (const ConfigKey& k : config_keys()) {
    // The base a run began from (its state holds the weights) may be given anew only where it
    // moved: the path it trained with is gone.
    const bool model =
        k.path.rfind("model.", 0) == 0 &&
        (k.path != "model.init_from" || saved.str(k.path).empty() || fs::exists(saved.str(k.path)));
    // data.path's bytes are checked by their fingerprint; the loader's workers and the seasonal
    // baseline's period change no window.
    const bool data = k.path.rfind("data.", 0) == 0 && k.path != "data.path" &&
                      k.path != "data.num_workers" && k.path != "data.prefetch_factor" &&
                      k.path != "data.season";
    const bool state = k.path == "train.seed" || k.path == "optim.kind" || k.path == "train.loss" ||
                       k.path == "train.quantiles" || k.path == "train.huber_delta" ||
                       k.path == "train.early_stopping.monitor" ||
                       k.path == "train.early_stopping.mode";
    if (!(model || data || state || k.path.rfind("adapter.", 0) == 0)) continue;
    if (k.path == "model.init_from" && !saved.str(k.path).empty() &&
        same_path(config.str(k.path), saved.str(k.path)))
      continue;
    if (config.str(k.path) != saved.str(k.path))
      fail(config.origin(k.path), ": ", k.path,
           " cannot change when a run resumes (it trained with ", saved.str(k.path), ", asked for ",
           config.str(k.path), "): start a new run to change it");
  }
  // The directory as config.resolved.yaml names it: a copied run's resume rewrites it there.
  if (config.str("train.run_dir") != written.str("train.run_dir"))
    fail(config.origin("train.run_dir"), ": a resumed run goes on in its directory ", resume_dir,
         "; train.run_dir cannot move it (copy the directory, then resume the copy)");
}

// Files other than data.path that a run read its tokens and its model from: a resume reads them
// again where the config names them, so one that changed since (other ids for the same tokens,
// another rope_theta) is refused, as a changed data file is, before it trains another model.
void check_resume_keeps_its_files(const Config& config, const std::string& resume_dir) {
  const fs::path dir(resume_dir);
  const std::string task = config.str("data.task");
  if (task == "lm" || task == "text_classify") {
    for (const char* name : {"training_state.safetensors", "model.safetensors"}) {
      const fs::path file = dir / name;
      if (!fs::is_regular_file(file)) continue;
      const io::SafetensorsFile state = io::SafetensorsFile::read(file.string());
      const auto& meta = state.metadata();
      const auto hash = meta.find("seqforge.tokenizer_hash");
      if (hash == meta.end()) continue;
      uint64_t expected = 0, now = 0;
      std::from_chars(hash->second.data(), hash->second.data() + hash->second.size(), expected);
      if (const std::string named = data_options(config).text.tokenizer;
          expected != 0 && fs::is_regular_file(named))
        read_tokenizer(named, expected, &now);  // refuses another tokenizer
      break;
    }
  }
  if (config.str("model.family") != "decoder") return;
  const fs::path kept = dir / "config.json";
  const fs::path base = fs::path(config.str("model.init_from")) / "config.json";
  if (!fs::is_regular_file(kept) || !fs::is_regular_file(base)) return;
  // The model it describes: a classifier's copy names its classes besides, and a base saved again
  // writes other metadata (transformers_version, dtype, use_cache), neither of which changes it.
  const auto model_of = [](const fs::path& path) {
    DecoderOptions o = read_decoder_config(path.string());
    o.num_labels = 0;
    return o;
  };
  if (model_of(base) != model_of(kept))
    fail(base.string(), ": differs from the config.json the run trained with (its copy ",
         kept.string(),
         "): a resumed run goes on with the model it began; restore the file, or "
         "start a new run from this one (model.init_from: ",
         resume_dir, ")");
}

}  // namespace

void check_validation_split(const Config& c, const Task& t) {
  const Split& s = t.split();
  const double share = c.number("data.split.val");
  if (share == 0 || !s.val.empty()) return;
  const char* what = task_type(t.kind).samples();
  const std::string size = t.kind == TaskKind::text_classify ? "one example"
                           : t.is_lm() ? "data.seq_len + 1 = " + std::to_string(t.text.seq_len + 1)
                                       : "data.lookback + data.horizon = " +
                                             std::to_string(t.series.lookback + t.series.horizon);
  const std::string counts = " (train " + std::to_string(s.train.size()) + ", validation 0, test " +
                             std::to_string(s.test.size()) + ")";
  if (!t.is_text() && t.series.val_without_truth > 0)
    fail(c.origin("data.split.val"), ": data.split.val: the validation split has no ", what, counts,
         ": its ", t.series.val_without_truth, " ", what, " have no target (",
         t.kind == TaskKind::classify ? "their class cells are empty"
                                      : "their target cells are missing",
         "); give some of its rows a target, move the split (data.split.train, data.split.val), "
         "or set data.split.val: 0 to train without validation");
  if (c.str("data.split.mode") == "random")
    fail(c.origin("data.split.val"), ": data.split.val: the validation split has no ", what, counts,
         ": ", share, " of ", s.train.size() + s.test.size(), " ", what,
         " rounds to none; raise data.split.val, or set data.split.val: 0 to train without "
         "validation");
  const bool strict =
      t.is_text() || t.kind == TaskKind::mae || c.str("data.split.context") == "strict";
  if (strict)
    fail(c.origin("data.split.val"), ": data.split.val: the validation split has no ", what, counts,
         ": each series' validation part is shorter than ", size,
         t.is_text() || t.kind == TaskKind::mae ? ""
                                                : " (data.split.context: strict keeps whole "
                                                  "windows inside it; history would not)",
         "; raise data.split.val, shorten the windows, or set data.split.val: 0 to train without "
         "validation");
  fail(c.origin("data.split.val"), ": data.split.val: the validation split has no ", what, counts,
       ": no validation row has ", size,
       " rows of its series up to it (or the validation parts are empty); raise data.split.val, "
       "shorten the windows, or set data.split.val: 0 to train without validation");
}

void check_settings(const Config& c) {
  check_distinct_columns(c);
  check_optimizer_settings(c);
  augment_options(c);
}

void check_before_training(const Config& c) {
  check_settings(c);
  const Task task = load_task(c);
  check_validation_split(c, task);
  const LoopSettings loop = LoopSettings::from(c, task);
  if (loop.stateful) checked_stateful_streams(c, task, loop.batch_size);
}

void check_run_inputs(const Config& config, const std::string& resume_dir) {
  if (!resume_dir.empty()) check_resume_keeps_the_model(as_it_trained(config), resume_dir);
  if (resume_dir.empty()) check_target_names(config);
  if (const std::string data = config.str("data.path"); !data.empty() && !fs::exists(data)) {
    std::error_code ec;
    const bool relative = fs::path(data).is_relative();
    fail(config.origin("data.path"), ": data.path ", io::quoted(data, 200), ": no such file",
         relative ? " (a relative path is read from the current directory, " +
                        fs::current_path(ec).string() + ", not from the config's)"
                  : "");
  }
  // A resumed run's weights are in its training state, and its resolved config has the base's
  // shape; a text model still reads its vocabulary or tokenizer from the base.
  const std::string init = config.str("model.init_from");
  const bool base_moved = !init.empty() && !fs::exists(init);
  const TaskKind task = parse_task(config.str("data.task"), config.origin("data.task"));
  if (base_moved &&
      (resume_dir.empty() || config.str("model.family") != "recurrent" ||
       task == TaskKind::charlm || task == TaskKind::lm || task == TaskKind::text_classify))
    fail(config.origin("model.init_from"), ": model.init_from ", io::quoted(init, 200),
         ": no such file or folder",
         resume_dir.empty() ? ""
                            : "; the resumed run reads its base model there (its vocabulary, its "
                              "shape): give its new place with model.init_from=PATH");
  if (!base_moved && fs::is_regular_file(init)) {  // else the loader says what is wrong
    bool training_state = false;
    try {
      training_state = io::SafetensorsFile::read(init).metadata().count("seqforge.loop") > 0;
    } catch (const Error&) {
    }
    if (training_state)
      fail(config.origin("model.init_from"), ": model.init_from ", io::quoted(init, 200),
           " is a run's training state (what --resume reads), not a model: give the run's "
           "directory or its model.safetensors");
  }
  if (!resume_dir.empty()) check_resume_keeps_its_files(config, resume_dir);
}

void check_ranks_agree(const Config& c, dist::Communicator& comm) {
  static const std::string data_bytes = "data.path's bytes";
  static const std::set<std::string> own = {"train.threads",
                                            "data.num_workers",
                                            "data.prefetch_factor",
                                            "train.progress_seconds",
                                            "train.device",
                                            "train.run_dir",
                                            "data.path"};
  nlohmann::json mine = nlohmann::json::object();
  for (const ConfigKey& k : config_keys())
    if (!own.count(k.path)) mine[k.path] = c.str(k.path);
  mine[data_bytes] = io::file_fingerprint(c.str("data.path"));
  const std::string text = mine.dump();
  int64_t size = int64_t(text.size());
  comm.broadcast({reinterpret_cast<std::byte*>(&size), sizeof size});
  std::string rank0 = comm.rank() == 0 ? text : std::string(size_t(size), '\0');
  comm.broadcast({reinterpret_cast<std::byte*>(rank0.data()), rank0.size()});
  // Every rank learns whether any differs, so that none goes on to claim the run directory.
  double differing = rank0 == text ? 0 : 1;
  comm.all_reduce_sum({&differing, 1});
  if (differing == 0) return;
  if (rank0 == text) {  // a rank that differs names its key and ends the job
    comm.barrier();
    fail("another rank's settings differ from rank 0's");
  }
  const nlohmann::json theirs = nlohmann::json::parse(rank0, nullptr, false);
  for (const auto& [key, value] : mine.items()) {
    if (!theirs.is_object() || !theirs.contains(key))
      fail("rank ", comm.rank(), " has setting ", key,
           ", which rank 0's seqforge does not know (another version?)");
    if (theirs[key] != value && key == data_bytes)
      fail(c.origin("data.path"), ": rank ", comm.rank(), "'s data file ",
           io::quoted(c.str("data.path")), " is not rank 0's (", value.get<std::string>(),
           " against ", theirs[key].get<std::string>(),
           "): every rank reads the same data; give each the same file");
    if (theirs[key] != value)
      fail(c.origin(key), ": rank ", comm.rank(), "'s ", key, " is ",
           io::quoted(value.get<std::string>()), ", rank 0's is ",
           io::quoted(theirs[key].get<std::string>()),
           ": every rank trains with rank 0's settings; give them all the same");
  }
  fail("rank ", comm.rank(), "'s settings differ from rank 0's (another seqforge version?)");
}

void check_resumed_config_current(const Config& given, const std::string& resume_dir) {
  const std::string resolved = (fs::path(resume_dir) / "config.resolved.yaml").string();
  if (!fs::exists(resolved)) return;  // nothing to resume: the run says so
  const auto replaced = [&](const std::string& what) {
    fail(resume_dir, ": another process wrote the run in it while this resume started (", what,
         "); nothing was resumed: resume again to continue the run it holds now");
  };
  std::optional<Config> now;
  try {
    now = Config::load(resolved);
  } catch (const Error& e) {
    replaced(std::string("config.resolved.yaml: ") + e.what());
  }
  for (const ConfigKey& k : config_keys())
    if (given.origin(k.path).rfind("override '", 0) != 0 && now->str(k.path) != given.str(k.path))
      replaced(k.path + " was " + given.str(k.path) + ", is now " + now->str(k.path));
}

}  // namespace seqforge
