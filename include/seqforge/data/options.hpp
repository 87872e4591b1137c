#pragma once
// The data layer's options, typed. train/ binds them from the config once (data_options.hpp),
// checking each key; nothing below train/ reads the config.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace seqforge {

// What a model learns from its data: to forecast targets, to classify windows, to reconstruct
// masked steps (a masked autoencoder), the next character of a text, or the class of a text or
// a pair of texts.
enum class TaskKind { forecast, classify, mae, charlm, text_classify, lm };
const char* task_name(TaskKind kind);
// data.task's value; an unknown name is an error naming `source` and the key.
TaskKind parse_task(const std::string& name, const std::string& source);

// A column transform applied before windowing and normalisation (data.transform).
enum class Transform { none, log, diff, log_return, pct_change };
Transform parse_transform(const std::string& name);  // "" for none; throws on an unknown name
const char* transform_name(Transform t);

// How a sequence of items (rows, characters, windows) is split (data.split.*).
struct SplitOptions {
  std::string mode = "time";  // time | random
  std::string by = "rows";    // rows | date (a series' rows, or dates shared by all series)
  // history: a validation or test window's lookback may reach back into the parts before (only
  // its target must lie in its split); strict: whole windows inside their split.
  std::string context = "history";
  double train = 0.8, val = 0.1;
  uint64_t seed = 0;  // random splits and label subsets (train.seed)
};

// The dates' calendar (data.frequency): found from the dates, a fixed step, business days
// (Monday to Friday less holidays) or calendar months.
struct Frequency {
  enum Kind { automatic, fixed, business, calendar_months } kind = automatic;
  int64_t micros = 0;  // fixed: the step in microseconds
  int64_t months = 0;  // calendar_months
  std::string text = "auto";
};
// data.frequency's value: auto, B, M, Q, Y or a step ([n]us, [n]ms, [n]s, [n]min, [n]h or [n]H,
// [n]D, [n]W); an unknown one is an error naming `where`.
Frequency parse_frequency(const std::string& text, const std::string& where);

// A time series as windows (forecast, classify, mae).
struct SeriesOptions {
  std::string date_col, class_col, series_col, label, label_col;
  int64_t lookback = 0, horizon = 0, stride = 1;  // mae: horizon 0, the window is the target
  // forecast: direct (an output per step ahead, 1 to horizon) or last (only `horizon` ahead).
  std::string horizon_mode = "direct";
  // forecast with the quantile loss: the quantiles forecast for every target and step, ascending.
  std::vector<double> quantiles;
  bool every_step = false;  // forecast: a forecast after every step of a window (model.output)
  int64_t season = 0;       // rows per season, for the seasonal-naive baseline and MASE; 0: none
  // Empty cells (CSV) or NaN (.npy) of features and targets: error, or filled within their
  // series in time order: ffill (the last value before), interpolate (linear between the
  // values around; the nearest at a series' ends).
  std::string missing = "error";
  std::vector<std::string> missing_values;  // more cells that mark a missing value
  bool missing_words = true;  // NA, N/A, NaN, null, None, #N/A, <NA> mark one (data.missing_words)
  // Dates written day and month first, 01/02/2012: the order (dmy, mdy), or auto (told by a day
  // past 12 in the column).
  std::string date_order = "auto";
  Frequency frequency;
  std::vector<int64_t> holidays;  // days since 1970-01-01, sorted (data.holidays)
  // Features derived from the date column, each as a sine and cosine of its cycle: hour,
  // dayofweek, dayofmonth, dayofyear, month (after the file's features, named <name>_sin/_cos).
  std::vector<std::string> calendar;
  // Columns naming a category per series (constant within it: a battery's cell type), each fed
  // as one-hot features (data.static).
  std::vector<std::string> statics;
  // Text columns whose value may change from row to row (the day's weather, a machine's mode),
  // each fed as one-hot features, one per category (data.categorical).
  std::vector<std::string> categorical;
  // forecast: columns known ahead of time (a promotion, a holiday, a weather forecast); each step
  // of a window also gets their values at the rows its forecast is for (data.known_future).
  std::vector<std::string> known_future;
  std::vector<std::string> features, targets;
  std::map<std::string, Transform> transforms;
  std::string normalize = "zscore";
  std::string normalize_per = "all";         // all | series: one scaler per series
  std::string normalize_fallback = "error";  // error | pooled: a series without its own
  double label_fraction = 1;                 // of the training windows kept (a fixed random subset)
};

struct TextOptions {
  int64_t seq_len = 0;  // charlm: characters per sequence; text_classify: the most per example
  // text_classify: the CSV column of each example's text, or two (text A and text B of a pair,
  // joined by the separator), and the column of its class.
  std::vector<std::string> columns;
  std::string class_col, separator = "\n";
  // lm: the tokenizer.json that turns the text into token ids (a Hugging Face tokenizer).
  std::string tokenizer;
  // lm on a CSV column (columns holds it): each row's text is a document, and the token that ends
  // one is eos_token (a token of the tokenizer), or eos_id when only an id is known (a model
  // folder's config.json); eos_from says where it came from, for error messages.
  std::string eos_token{}, eos_from{};
  int64_t eos_id = -1;
};

struct DataOptions {
  std::string source;  // where the options came from (the config file), for error messages
  // Where each data.* key was given ("file:line", "override 'key=value'"), for errors about it.
  std::map<std::string, std::string> origins;
  const std::string& where(const std::string& key) const {
    const auto it = origins.find(key);
    return it == origins.end() ? source : it->second;
  }
  TaskKind task = TaskKind::forecast;
  std::string path;
  SplitOptions split;
  SeriesOptions series;
  TextOptions text;
  double mask_ratio = 0.15;  // mae
};

}  // namespace seqforge
