// Binding the config's data.*, augment.* and train.seed keys to the data layer's options.
#include "seqforge/train/data_options.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/calendar.hpp"
#include "io/file_util.hpp"
#include "seqforge/backend/ops.hpp"
#include "seqforge/core/autotune.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxStepsAhead = 10000;  // a direct forecast's outputs per target

int64_t positive(const Config& c, const std::string& key) {
  const int64_t v = c.integer(key);
  if (v <= 0) fail(c.origin(key), ": ", key, " must be positive, got ", v);
  return v;
}

// data.tokenizer, or the tokenizer.json of model.init_from's folder.
// The token ending each document of an lm text column: data.eos_token, else the eos_token of the
// tokenizer_config.json beside the tokenizer, else the eos_token_id of model.init_from's
// config.json (the first of a list).
void end_of_document(const Config& c, TextOptions* o) {
  o->eos_token = c.str("data.eos_token");
  o->eos_from = c.origin("data.eos_token") + ": data.eos_token";
  if (!o->eos_token.empty()) return;
  const auto read_json = [](const fs::path& path) {
    try {
      return nlohmann::json::parse(io::read_file(path.string()));
    } catch (const nlohmann::json::exception& e) {
      fail(path.string(), ": not valid JSON ", io::json_syntax_error(e.what()));
    }
  };
  const fs::path beside = fs::path(o->tokenizer).parent_path() / "tokenizer_config.json";
  if (fs::exists(beside)) {
    const nlohmann::json j = read_json(beside);
    const auto it = j.find("eos_token");
    if (it != j.end() && it->is_object() && it->contains("content") && (*it)["content"].is_string())
      o->eos_token = (*it)["content"].get<std::string>();
    else if (it != j.end() && it->is_string())
      o->eos_token = it->get<std::string>();
    o->eos_from = beside.string() + ": eos_token";
    if (!o->eos_token.empty()) return;
  }
  const std::string init = c.str("model.init_from");
  const fs::path config = fs::path(init) / "config.json";
  if (!init.empty() && fs::is_directory(init) && fs::exists(config)) {
    const nlohmann::json j = read_json(config);
    const auto it = j.find("eos_token_id");
    if (it != j.end() && it->is_number_integer()) o->eos_id = it->get<int64_t>();
    if (it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_number_integer())
      o->eos_id = (*it)[0].get<int64_t>();
    o->eos_from = config.string() + ": eos_token_id";
    if (o->eos_id >= 0) return;
  }
  fail(c.origin("data.eos_token"),
       ": data.eos_token: data.task lm on data.text_columns ends each document with an "
       "end-of-text token: set data.eos_token to it (no eos_token in a tokenizer_config.json "
       "beside ",
       o->tokenizer, ", nor an eos_token_id in model.init_from's config.json)");
}

std::string tokenizer_path(const Config& c) {
  std::string path = c.str("data.tokenizer");
  const std::string init = c.str("model.init_from");
  if (path.empty() && !init.empty() && fs::is_directory(init) &&
      fs::exists(fs::path(init) / "tokenizer.json"))
    path = (fs::path(init) / "tokenizer.json").string();
  if (path.empty())
    fail(c.origin("data.tokenizer"), ": data.task ", c.str("data.task"),
         " needs data.tokenizer (a tokenizer.json), or a model.init_from folder that holds one");
  return path;
}

SplitOptions split_options(const Config& c) {
  SplitOptions o;
  o.mode = c.str("data.split.mode");
  if (o.mode != "time" && o.mode != "random")
    fail(c.origin("data.split.mode"), ": data.split.mode must be time or random, got '", o.mode,
         "'");
  o.by = c.str("data.split.by");
  if (o.by != "rows" && o.by != "date")
    fail(c.origin("data.split.by"), ": data.split.by must be rows or date, got '", o.by, "'");
  o.context = c.str("data.split.context");
  if (o.context != "history" && o.context != "strict")
    fail(c.origin("data.split.context"), ": data.split.context must be history or strict, got '",
         o.context, "'");
  o.train = c.number("data.split.train");
  o.val = c.number("data.split.val");
  if (!(o.train > 0 && o.train <= 1))
    fail(c.origin("data.split.train"), ": data.split.train must be in (0, 1], got ", o.train);
  if (!(o.val >= 0)) fail(c.origin("data.split.val"), ": data.split.val must be >= 0, got ", o.val);
  if (!(o.train + o.val <= 1 + 1e-9))
    fail(c.origin("data.split.val"), ": data.split.train ", o.train, " (",
         c.origin("data.split.train"), ") + data.split.val ", o.val,
         " exceed 1: the test part is what is left");
  o.seed = static_cast<uint64_t>(c.integer("train.seed"));
  return o;
}

// The data.* keys of a time-series task, checked.
SeriesOptions series_options(const Config& c, TaskKind task, const SplitOptions& split) {
  SeriesOptions o;
  o.lookback = positive(c, "data.lookback");
  o.horizon = c.integer("data.horizon");
  o.stride = positive(c, "data.stride");
  o.season = c.integer("data.season");
  o.calendar = c.list("data.calendar");
  o.statics = c.list("data.static");
  o.categorical = c.list("data.categorical");
  o.known_future = c.list("data.known_future");
  if (!o.known_future.empty() && task != TaskKind::forecast)
    fail(c.origin("data.known_future"), ": data.known_future is for forecasters; data.task ",
         task_name(task), " forecasts nothing");
  for (const std::string& name : o.calendar)
    if (name != "hour" && name != "dayofweek" && name != "dayofmonth" && name != "dayofyear" &&
        name != "month")
      fail(c.origin("data.calendar"), ": data.calendar: unknown '", name,
           "' (expected hour, dayofweek, dayofmonth, dayofyear or month)");
  if (!o.calendar.empty() && c.str("data.date_column").empty())
    fail(c.origin("data.calendar"), ": data.calendar needs data.date_column, the dates it reads");
  o.missing = c.str("data.missing");
  if (o.missing != "error" && o.missing != "ffill" && o.missing != "interpolate" &&
      o.missing != "mask")
    fail(c.origin("data.missing"),
         ": data.missing must be error, ffill, interpolate or mask, got '", o.missing, "'");
  o.missing_values = c.list("data.missing_values");
  o.missing_words = c.boolean("data.missing_words");
  for (const std::string& code : o.missing_values)
    if (code.find_first_not_of(" \t") == std::string::npos)
      fail(c.origin("data.missing_values"),
           ": data.missing_values: an empty entry (empty cells are missing values already)");
  o.date_col = c.str("data.date_column");
  o.date_order = c.str("data.date_order");
  if (o.date_order != "auto" && o.date_order != "dmy" && o.date_order != "mdy")
    fail(c.origin("data.date_order"), ": data.date_order must be auto, dmy or mdy, got '",
         o.date_order, "'");
  o.frequency = parse_frequency(c.str("data.frequency"), c.origin("data.frequency"));
  if (o.frequency.kind != Frequency::automatic && o.date_col.empty())
    fail(c.origin("data.frequency"), ": data.frequency needs data.date_column, the dates it reads");
  if (const std::string holidays = c.str("data.holidays"); !holidays.empty()) {
    if (o.frequency.kind != Frequency::business && o.frequency.kind != Frequency::automatic)
      fail(c.origin("data.holidays"), ": data.holidays are days off business days; data.frequency ",
           o.frequency.text, " has none (set data.frequency: B)");
    o.holidays = read_holidays(holidays);
  }
  o.class_col = c.str("data.class_column");
  o.series_col = c.str("data.series_column");
  o.features = c.list("data.features");
  // A classifier's truth is its class, an autoencoder's its features: their targets are ignored
  // (said at start-up), and take no column out of the features.
  if (task == TaskKind::forecast) o.targets = c.list("data.targets");
  if (split.by == "date" && o.date_col.empty())
    fail(c.origin("data.split.by"), ": data.split.by date needs data.date_column");
  for (const auto& [column, name] : c.map("data.transform")) {
    try {
      o.transforms[column] = parse_transform(name);
    } catch (const Error& e) {
      fail(c.origin("data.transform"), ": data.transform: ", column, ": ", e.what());
    }
  }
  if (task == TaskKind::forecast) {
    if (o.horizon < 1)
      fail(c.origin("data.horizon"), ": data.horizon must be positive, got ", o.horizon);
    if (o.targets.empty())
      fail(c.origin("data.targets"), ": data.targets is required for data.task forecast");
    o.horizon_mode = c.str("data.horizon_mode");
    if (o.horizon_mode != "direct" && o.horizon_mode != "last")
      fail(c.origin("data.horizon_mode"), ": data.horizon_mode must be direct or last, got '",
           o.horizon_mode, "'");
    if (o.horizon_mode == "direct" && o.horizon > kMaxStepsAhead)
      fail(c.origin("data.horizon"), ": data.horizon ", o.horizon,
           " with data.horizon_mode "
           "direct is an output per step ahead; at most ",
           kMaxStepsAhead, " (data.horizon_mode: last forecasts only the last)");
  } else if (task == TaskKind::classify) {
    if (o.horizon < 0)
      fail(c.origin("data.horizon"), ": data.horizon must be >= 0, got ", o.horizon);
    o.label = c.str("data.label");
    if (o.label != "column" && o.label != "direction" && o.label != "volatility")
      fail(c.origin("data.label"), ": data.label must be column, direction or volatility, got '",
           o.label, "'");
    if (o.label == "column" && o.class_col.empty())
      fail(c.origin("data.class_column"), ": data.class_column is required for data.task classify");
    if (o.label != "column") {
      o.label_col = c.str("data.label_column");
      if (o.label_col.empty())
        fail(c.origin("data.label_column"), ": data.label_column is required for data.label ",
             o.label);
      if (o.horizon < 1)
        fail(c.origin("data.horizon"), ": data.horizon must be positive for data.label ", o.label);
    }
  } else {  // mae
    if (o.horizon < 1)
      fail(c.origin("data.horizon"), ": data.horizon must be positive, got ", o.horizon);
    o.horizon = 0;  // the window itself is the target
  }
  o.normalize_per = c.str("data.normalize_per");
  if (o.normalize_per != "all" && o.normalize_per != "series")
    fail(c.origin("data.normalize_per"), ": data.normalize_per must be all or series, got '",
         o.normalize_per, "'");
  o.normalize_fallback = c.str("data.normalize_fallback");
  if (o.normalize_fallback != "error" && o.normalize_fallback != "pooled")
    fail(c.origin("data.normalize_fallback"),
         ": data.normalize_fallback must be error or pooled, got '", o.normalize_fallback, "'");
  o.normalize = c.str("data.normalize");
  if (o.normalize != "zscore" && o.normalize != "minmax" && o.normalize != "none")
    fail(c.origin("data.normalize"), ": data.normalize must be zscore, minmax or none, got '",
         o.normalize, "'");
  o.label_fraction = c.number("data.label_fraction");
  if (!(o.label_fraction > 0 && o.label_fraction <= 1))
    fail(c.origin("data.label_fraction"), ": data.label_fraction must be in (0, 1], got ",
         o.label_fraction);
  return o;
}

}  // namespace

DataOptions data_options(const Config& c) {
  DataOptions o;
  o.source = c.source();
  for (const ConfigKey& k : config_keys())
    if (k.path.rfind("data.", 0) == 0) o.origins[k.path] = c.origin(k.path);
  o.path = c.str("data.path");
  if (o.path.empty()) fail(c.origin("data.path"), ": data.path is required");
  o.task = parse_task(c.str("data.task"), c.source());
  // One file holds the data (a file per series, or per document, is no data.path).
  std::error_code ec;
  const bool pattern = o.path.find_first_of("*?[") != std::string::npos && !fs::exists(o.path, ec);
  if (pattern || fs::is_directory(o.path, ec))
    fail(c.origin("data.path"), ": data.path ", io::quoted(o.path, 200), " is ",
         pattern ? "a pattern" : "a directory", "; give one file",
         o.task == TaskKind::forecast || o.task == TaskKind::classify || o.task == TaskKind::mae
             ? ": series from several files go in one, with a column naming each series "
               "(data.series_column)"
             : ": join the texts into one");
  o.split = split_options(c);
  if (o.task == TaskKind::charlm) {
    o.text.seq_len = positive(c, "data.seq_len");
    return o;
  }
  if (o.task == TaskKind::lm) {
    o.text.seq_len = positive(c, "data.seq_len");
    o.text.tokenizer = tokenizer_path(c);
    o.text.columns = c.list("data.text_columns");
    if (o.text.columns.size() > 1)
      fail(c.origin("data.text_columns"),
           ": data.task lm reads one text column (each row a document), got ",
           o.text.columns.size());
    if (!o.text.columns.empty()) end_of_document(c, &o.text);
    return o;
  }
  if (o.task == TaskKind::text_classify) {
    o.text.seq_len = positive(c, "data.seq_len");
    o.text.columns = c.list("data.text_columns");
    if (o.text.columns.empty() || o.text.columns.size() > 2)
      fail(c.origin("data.text_columns"),
           ": data.text_columns must name one text column or two (a pair), got ",
           o.text.columns.size());
    o.text.class_col = c.str("data.class_column");
    if (o.text.class_col.empty())
      fail(c.origin("data.class_column"),
           ": data.class_column is required for data.task text_classify");
    for (const std::string& column : o.text.columns)
      if (column == o.text.class_col)
        fail(c.origin("data.text_columns"), ": data.text_columns names '", column,
             "', the data.class_column: the model would read each row's class in its text");
    o.text.separator = c.str("data.separator");
    // A Hugging Face decoder reads tokens, pairs joined by its tokenizer's template.
    if (c.str("model.family") == "decoder") o.text.tokenizer = tokenizer_path(c);
    if (o.text.columns.size() == 2 && o.text.separator.empty())
      fail(c.origin("data.separator"),
           ": data.separator must not be empty for a pair of text columns");
    return o;
  }
  o.series = series_options(c, o.task, o.split);
  if (o.task == TaskKind::forecast) o.series.quantiles = loss_quantiles(c);
  const std::string output = c.str("model.output");
  if (output == "every_step" && o.task != TaskKind::forecast)
    fail(c.origin("model.output"), ": model.output every_step is for forecasters; data.task ",
         task_name(o.task), " has ",
         o.task == TaskKind::mae ? "an output at every step already" : "one class per window");
  if (output == "final_states" && o.task == TaskKind::mae)
    fail(c.origin("model.output"),
         ": model.output final_states is for forecasters and classifiers; data.task mae has an "
         "output at every step");
  o.series.every_step = output == "every_step";
  o.mask_ratio = c.number("data.mask_ratio");
  if (!(o.mask_ratio > 0 && o.mask_ratio < 1))
    fail(c.origin("data.mask_ratio"), ": data.mask_ratio must be in (0, 1), got ", o.mask_ratio);
  return o;
}

AugmentOptions augment_options(const Config& c) {
  AugmentOptions o;
  auto probability = [&](const std::string& key) {
    const double p = c.number(key);
    if (!(p >= 0 && p <= 1)) fail(c.origin(key), ": ", key, " must be in [0, 1], got ", p);
    return p;
  };
  auto non_negative = [&](const std::string& key) {
    const double v = c.number(key);
    if (!(v >= 0 && std::isfinite(v)))
      fail(c.origin(key), ": ", key, " must be a finite number >= 0, got ", v);
    return v;
  };
  o.jitter_p = probability("augment.jitter.p");
  o.jitter_sigma = non_negative("augment.jitter.sigma");
  o.scaling_p = probability("augment.scaling.p");
  o.scaling_sigma = non_negative("augment.scaling.sigma");
  o.magnitude_warp_p = probability("augment.magnitude_warp.p");
  o.magnitude_warp_sigma = non_negative("augment.magnitude_warp.sigma");
  o.magnitude_warp_knots = c.integer("augment.magnitude_warp.knots");
  o.time_warp_p = probability("augment.time_warp.p");
  o.time_warp_sigma = non_negative("augment.time_warp.sigma");
  o.time_warp_knots = c.integer("augment.time_warp.knots");
  o.window_slice_p = probability("augment.window_slice.p");
  o.window_slice_ratio = c.number("augment.window_slice.ratio");
  if (!(o.window_slice_ratio > 0 && o.window_slice_ratio <= 1))
    fail(c.origin("augment.window_slice.ratio"),
         ": augment.window_slice.ratio must be in (0, 1], got ", o.window_slice_ratio);
  o.cache = c.boolean("augment.cache");
  o.cache_versions = c.integer("augment.cache_versions");  // its range is the config's
  o.cache_dir = c.str("augment.cache_dir");
  if (o.cache_dir.empty())
    o.cache_dir = (fs::path(autotune::cache_path()).parent_path() / "augment").string();
  const TaskKind task = parse_task(c.str("data.task"), c.origin("data.task"));
  // A forecast's targets and a classifier's label are those of the window's last step (or the
  // rows after it): their slices end there. A masked autoencoder's are its window's own.
  o.slice_keeps_end = task != TaskKind::mae;
  if ((o.any() || o.cache) &&
      (task == TaskKind::charlm || task == TaskKind::lm || task == TaskKind::text_classify))
    fail(c.source(), ": augment: augmentations apply to time series, not to data.task ",
         c.str("data.task"));
  // A step's forecast after every step is of the rows after that step of the file: inputs
  // moved along time would no longer end where its targets begin.
  if (task == TaskKind::forecast && c.str("model.output") == "every_step")
    for (const char* key : {"augment.time_warp.p", "augment.window_slice.p"})
      if (c.number(key) > 0)
        fail(c.origin(key), ": ", key,
             " moves a window's steps along time, which model.output every_step's targets "
             "(the rows after each step) would not follow; use model.output last");
  // Steps moved along time may carry a missing cell onto a step the autoencoder would score.
  if (task == TaskKind::mae && c.str("data.missing") == "mask")
    for (const char* key : {"augment.time_warp.p", "augment.window_slice.p"})
      if (c.number(key) > 0)
        fail(c.origin(key), ": ", key,
             " moves a window's steps along time, and with data.missing mask the masked "
             "autoencoder would score missing cells moved onto complete steps; use "
             "data.missing interpolate or ffill");
  if (o.cache && !o.any())
    fail(c.origin("augment.cache"),
         ": augment.cache is true but no augmentation has a probability above 0");
  return o;
}

std::vector<double> loss_quantiles(const Config& c) {
  if (c.str("train.loss") != "quantile") return {};
  std::vector<double> out;
  for (const std::string& text : c.list("train.quantiles")) {
    const double q = io::parse_double(io::trim(text)).value_or(NAN);
    if (!(q > 0 && q < 1))
      fail(c.origin("train.quantiles"), ": train.quantiles: '", text,
           "' is not a quantile (a number between 0 and 1, exclusive)");
    if (!out.empty() && !(q > out.back()))
      fail(c.origin("train.quantiles"), ": train.quantiles must be ascending and distinct, got ",
           out.back(), " then ", q);
    out.push_back(q);
  }
  if (out.empty() || out.size() > kMaxQuantiles)
    fail(c.origin("train.quantiles"), ": train.quantiles needs 1 to ", kMaxQuantiles,
         " quantiles, got ", out.size());
  return out;
}

LoaderOptions loader_options(const Config& c, int64_t batch_bytes) {
  const int prefetch = static_cast<int>(c.integer("data.prefetch_factor"));  // 1 to 64
  const std::string workers = c.str("data.num_workers");
  if (workers == "auto") return loader_options(-1, prefetch, batch_bytes);
  char* end = nullptr;
  const long n = std::strtol(workers.c_str(), &end, 10);
  if (workers.empty() || *end != '\0' || n < 0 || n > 256)
    fail(c.origin("data.num_workers"),
         ": data.num_workers must be auto or a count in [0, 256], got '", workers, "'");
  return loader_options(static_cast<int>(n), prefetch, batch_bytes);
}

SeriesData load_series(const Config& c, const SeriesData* stored, WindowSet windows) {
  return load_series(data_options(c), stored, windows);
}

Dataset load_dataset(const Config& c, const Dataset* from, WindowSet windows) {
  return load_dataset(data_options(c), from, windows);
}

}  // namespace seqforge
