#pragma once
// Datasets built from typed options (options.hpp): windows over a time series (forecast, classify,
// mae) and chunks of a text (charlm), with time-ordered splits and normalisation fitted on the
// training split only. Windows are read from the source when a batch is assembled and normalised as
// they are copied, so a memory-mapped .npy source is never loaded whole.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "seqforge/core/dtype.hpp"
#include "seqforge/data/options.hpp"
#include "seqforge/io/file_stamp.hpp"
#include "seqforge/text/tokenizer.hpp"

namespace seqforge {

// (rows, cols) source values, rows in time order: in memory (a CSV) or memory-mapped (a float
// .npy file).
struct SourceMatrix {
  DType dtype = DType::f64;  // f32 or f64
  int64_t rows = 0, cols = 0;
  const std::byte* data = nullptr;
  std::shared_ptr<const void> owner;  // the memory or the mapping
  double at(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    return dtype == DType::f32 ? reinterpret_cast<const float*>(data)[i]
                               : reinterpret_cast<const double*>(data)[i];
  }
};

// Per column: normalized = (x - shift) / scale. With scalers per series (data.normalize_per:
// series), each named series has its own shift and scale; the pooled ones serve the others.
struct Normalizer {
  std::string kind = "none";  // zscore | minmax | none
  std::vector<double> shift, scale;
  // Columns per target: a direct forecast's targets are scaled per step ahead (column k *
  // targets + j), as a change over k steps differs in scale from one over the horizon.
  int64_t steps = 1;
  std::vector<std::string> series;                              // names, with scalers per series
  std::vector<std::vector<double>> series_shift, series_scale;  // (series, columns)
  // Fits on the given rows of the given columns of `m`.
  void fit(const std::string& kind, const SourceMatrix& m, const std::vector<int64_t>& cols,
           const std::vector<int64_t>& rows);
  // Fits `n_cols` columns on the values `each(add)` hands over, add(column, value), NaN skipped.
  void fit_values(const std::string& kind, size_t n_cols,
                  const std::function<void(const std::function<void(size_t, double)>&)>& each);
  // The index of series `name`'s own scaler, or -1 (the pooled one).
  int64_t series_index(const std::string& name) const;
  const double* shifts(int64_t series_index) const {
    return series_index < 0 ? shift.data() : series_shift[series_index].data();
  }
  const double* scales(int64_t series_index) const {
    return series_index < 0 ? scale.data() : series_scale[series_index].data();
  }
  double invert(double y, int64_t col, int64_t series_index = -1) const {
    return y * scales(series_index)[col] + shifts(series_index)[col];
  }
  std::string to_json() const;
  // Errors name `where`.
  static Normalizer from_json(const std::string& json, const std::string& where);
};

struct Split {
  std::vector<int64_t> train, val, test;  // window (or chunk) starts, ascending
};

// One series of a file: rows [begin, end) of the source, in time order.
struct SeriesSpan {
  std::string name;  // the series column's value ("" for a file of one series)
  int64_t begin = 0, end = 0;
  int64_t step = 0;        // the usual time step in seconds (the median), with a date column
  bool regular = false;    // every step a whole number of `step`s, of `months` calendar months
                           // or of business days (more than one: a gap), so later dates are known
  int64_t months = 0;      // the dates step by this many calendar months (the same time of day, on
                           // the same day of the month or each month's last day); 0: they do not
  bool month_end = false;  // with `months`: on each month's last day
  bool business_days = false;  // the dates step by business days (data.frequency B)
  // Numeric times: the mean of the whole steps, where a step such as 1/24 (hours in days) rounds
  // to millionths one way or the other from row to row; 0 otherwise.
  double exact_step = 0;
};

// The transform of `x` against `base` (the previous row for a feature, the window's last row for
// a target), and its inverse; log ignores the base. NaN where undefined (log of x <= 0, say).
double apply_transform(Transform t, double x, double base);
double invert_transform(Transform t, double y, double base);

// Which windows a series dataset lists.
enum class WindowSet {
  splits,        // train, val and test per data.split (training, eval --split)
  with_targets,  // every window whose target row is in the file, in `split.test` (eval --data)
  every_window,  // every complete input window, targets optional, in `split.test` (predict)
  last_windows,  // each series' last complete input window (predict --last): cells before it
                 // may be missing
};

// A time series as windows: input rows [s, s + lookback), target at row s + lookback - 1 + horizon
// (mae: horizon 0; the window's own features, some steps masked, are the target). A direct
// multi-step forecast has a target at every step ahead, rows s + lookback to s + lookback - 1 +
// horizon. Several series lie one after another in `source`; no window crosses from one into the
// next.
struct SeriesData {
  TaskKind task = TaskKind::forecast;  // forecast, classify or mae
  int64_t rows = 0, lookback = 0, horizon = 0;
  int64_t steps_ahead = 1;        // targets per target column: horizon (direct forecast), else 1
  std::vector<double> quantiles;  // forecast with the quantile loss: those forecast, ascending
  bool every_step = false;        // forecast: outputs after every step of a window (model.output)
  int64_t known_begin = 0, known_end = 0;      // features holding data.known_future values ahead
  int64_t one_hot_begin = 0, one_hot_end = 0;  // features holding data.static's and
                                               // data.categorical's one-hot columns
  bool masks_missing = false;  // data.missing mask: missing inputs are 0 (normalised) beside
                               // an indicator feature; windows of a missing target are left out
  int64_t season = 0;          // rows per season (data.season); 0: none
  std::vector<std::string> feature_names, target_names, class_names;
  // The file's features, first in feature_names; the rest (calendar, one-hot, known-future
  // values ahead, missing indicators) are derived from them or from the dates.
  int64_t file_features = 0;
  // (features) 1 where a feature holds the file's values (its features, data.known_future's
  // columns ahead), 0 where the dates, categories or missing cells give it: what augmentations
  // may change.
  std::vector<char> value_features;
  SourceMatrix source;  // features (transformed), targets (transformed over the horizon)
  std::vector<int64_t> feature_cols, target_cols;  // columns of `source`; targets may be absent
  int64_t label_col = -1;                          // column of data.label_column's values
  std::vector<Transform> target_transforms;        // (O)
  std::vector<double> raw_targets;  // (rows, O) targets in their own units, when transformed
  std::vector<int64_t> classes;     // (rows) class ids (classify); -1: unknown
  bool has_targets = true;          // the file holds the targets (or classes); predict needs none
  double label_threshold = 0;       // data.label volatility: the training windows' median
  Normalizer feature_norm, target_norm;
  std::vector<SeriesSpan> series;      // in source order
  std::vector<int64_t> series_scaler;  // (series) its normalizers' series index; -1: pooled
  std::vector<int64_t> file_rows;      // (rows) each row's 0-based row in the file; empty: the same
  std::vector<std::string> dates;      // (rows) the date column's text, when there is one
  std::vector<int64_t> times;          // (rows) seconds since 1970, when there is a date column
  std::vector<uint8_t> gap_before;     // (rows, with times) 1 where more than the series' usual
                                       // step (a gap) lies between the row and the one before
  // The date column holds numbers (elapsed seconds, a Unix time, a sample index): times are
  // those numbers in millionths (kNumericTimeScale), with no calendar.
  bool numeric_times = false;
  static constexpr double kNumericTimeScale = 1e6;
  // The decimals every time of the file is written with ("860.0": 1), for times past its end.
  int numeric_decimals = 0;
  // The dates are times with UTC offsets: instants, written in UTC with a Z.
  bool utc_times = false;
  // Dates written with fractions of a second (a sensor's "10:00:07.250"): times, and the steps
  // between them, in microseconds (kNumericTimeScale a second).
  bool subsecond_times = false;
  // "dmy" or "mdy": the order of day and month the training file's dates were read in (by
  // data.date_order, or found from a field past 12), which a run keeps for later files; else "".
  std::string date_order;
  // A stored model's: its training data's usual step between rows ("1 hour", "1 month";
  // usual_step), which predict and eval --data compare with their file's; "": not known.
  std::string trained_step;
  // The training file's columns where it was an array (.npy), whose columns are named by
  // position: a later array must have as many, or every name after a column more or fewer moves;
  // 0 where the columns have names.
  int64_t array_columns = 0;
  // The step between rows most of the series take ("1 hour", "1 month", "1 business day"); ""
  // without dates, or with numeric times (which have no unit).
  std::string usual_step() const;
  std::vector<int64_t> holidays;  // days since 1970 that are no business days (data.holidays)
  // data.static: each column with its categories (sorted), a one-hot feature per category.
  std::vector<std::pair<std::string, std::vector<std::string>>> static_categories;
  // data.categorical: each column with its categories (sorted), a one-hot feature per category
  // after the statics'.
  std::vector<std::pair<std::string, std::vector<std::string>>> categories;
  std::vector<std::string> notes;  // facts worth a line at start-up (gaps, cut dates)
  bool drops_first_rows = false;   // a feature's differencing transform takes each series' first
                                   // row as its base: the row is no window's
  std::string layout;  // how rows were ordered and transformed (date, series, transforms)
  Split split;
  // Validation windows left out for want of a target (a class cell left empty, a missing value).
  size_t val_without_truth = 0;
  int64_t num_features() const { return static_cast<int64_t>(feature_names.size()); }
  // Targets times steps_ahead times quantiles (forecast: output (k * targets + j) * quantiles + q
  // is quantile q of target j at step k), classes (classify) or the file's features (mae).
  int64_t num_outputs() const;
  int64_t num_targets() const { return static_cast<int64_t>(target_names.size()); }
  int64_t num_quantiles() const { return quantiles.empty() ? 1 : int64_t(quantiles.size()); }
  // The quantile whose forecast is the point forecast: the one nearest 0.5 (the median).
  int64_t point_quantile() const;
  // The row of the window's last target (the furthest step ahead), and of its step k.
  int64_t target_row(int64_t start) const { return start + lookback - 1 + horizon; }
  int64_t target_row(int64_t start, int64_t k) const {
    return target_row(start) - steps_ahead + 1 + k;
  }
  int64_t last_row(int64_t start) const { return start + lookback - 1; }
  // The series of source row `row`.
  const SeriesSpan& series_of(int64_t row) const;
  // The last row of series `s` before the future rows appended for data.known_future's values
  // ahead, which hold no target and not the inputs (under data.missing mask: none of the file's
  // features but the known columns); s.begin - 1 where every row is one.
  int64_t last_observed_row(const SeriesSpan& s) const;
  // Whether a gap in the dates lies between `row` and the row before it.
  bool follows_gap(int64_t row) const {
    return size_t(row) < gap_before.size() && gap_before[size_t(row)];
  }
  // The time `ahead` rows after source row `row` in its series: the file's, or past the series'
  // end by its calendar where its dates are regular; none without dates or calendar.
  std::optional<int64_t> time_ahead(int64_t row, int64_t ahead) const;
  // A time of `times` as the date column writes it: an ISO date written as the column's date
  // `like` is (a date alone where `like` is one, or ""), or the number.
  std::string time_text(int64_t when, const std::string& like) const;
  // The scaler (Normalizer::series_index) of the series of source row `row`.
  int64_t scaler_of(int64_t row) const;
  // The normalised features of window `start`, (lookback, F), into `out`.
  void copy_window(int64_t start, float* out) const;
  // Whether source row `row` holds every feature (data.missing mask leaves cells missing).
  bool row_complete(int64_t row) const;
  // The normalised targets of window `start`, (steps_ahead, O, quantiles: each the same value),
  // into `out` (forecast); with every_step, those of every step of the window, (lookback, ...).
  void copy_target(int64_t start, float* out) const;
  // Rows of model output per window: lookback with every_step, else 1; the last is the forecast.
  int64_t output_rows() const { return every_step ? lookback : 1; }
  // Target j at step k of window `start` as the model learns it: transformed, not normalised.
  double step_target(int64_t start, int64_t k, int64_t j) const;
  // Target j at step k of window `start` forecast by the outputs `o` (num_outputs), in the
  // target's units: a value per quantile into `out`, ascending (quantiles never cross).
  void forecasts(int64_t start, int64_t k, int64_t j, const float* o, double* out) const;
  // A model output `y` (normalised; target j at step k) of window `start` in the target's units.
  double prediction(int64_t start, int64_t k, int64_t j, double y) const;
  // Target j at step k of window `start` in its own units.
  double actual(int64_t start, int64_t k, int64_t j) const;
  // Target column j at source row `row`, in its own units (NaN where the file leaves it empty).
  double target_value(int64_t row, int64_t j) const;
};

// Reads options.path (CSV or .npy). With `stored`, uses its normalizers, classes and label
// threshold (eval, predict) instead of fitting new ones. Errors name the file and line or the
// config key.
SeriesData load_series(const DataOptions& options, const SeriesData* stored = nullptr,
                       WindowSet windows = WindowSet::splits);

// Character-level text: ids over a sorted vocabulary of Unicode characters (the file is read as
// UTF-8). charlm: the whole text, in chunks of seq_len + 1 characters. text_classify: one example
// per CSV row, its text (or text A, the separator and text B) at most seq_len characters.
struct TextData {
  std::u32string vocab;         // charlm: the distinct characters (code points), sorted
  std::string tokenizer;        // lm: the tokenizer.json its ids come from (vocab is empty)
  int64_t token_vocab = 0;      // lm: the tokenizer's vocabulary size
  uint64_t tokenizer_hash = 0;  // lm: a fingerprint of the tokenizer file's bytes
  std::vector<int64_t> ids;     // the whole text, or the examples one after another
  int64_t seq_len = 0;
  Split split;  // charlm: chunk starts, input ids[s, s+T), target ids[s+1, s+T+1); else examples
  // text_classify, per example i: ids [offsets[i], offsets[i + 1]), of which the first
  // first_lengths[i] are segment 0 (text A and the separator); its class (-1: none, predict).
  std::vector<int64_t> offsets, first_lengths, classes;  // (n + 1), (n), (n)
  std::vector<int64_t> lines;                            // (n) file line of each example
  std::vector<std::string> class_names;                  // sorted
  int64_t segments = 0;                                  // 2 for pairs, else 0
  int64_t truncated = 0;                                 // examples cut to seq_len
  bool has_classes = true;                               // the file holds the class column
  std::vector<std::string> notes;                        // rows left out (eval --data, predict)
  int64_t examples() const { return static_cast<int64_t>(first_lengths.size()); }
};

// With `vocab`, the characters of a stored model (one that is missing is an error). With
// `every_sequence` (eval --data), every sequence of the file is in split.test, none in the others.
TextData load_text(const DataOptions& options, const std::u32string& vocab = {},
                   bool every_sequence = false);
// A language model's text as token ids of options.text.tokenizer, cut into sequences as
// load_text cuts characters. With `stored`, the tokenizer must be the file the stored run used.
TextData load_tokens(const DataOptions& options, const TextData* stored = nullptr,
                     bool every_sequence = false);
// The tokenizer at `path`, and its fingerprint into *hash. A stored run's fingerprint
// (`expected`, 0: none) that differs is an error: its ids would mean other tokens.
text::Tokenizer read_tokenizer(const std::string& path, uint64_t expected, uint64_t* hash);
// The note for `dropped` characters (text::Encoding::dropped) of `what` that the tokenizer at
// `path` left out, the first of them in `first` (a file's line); "" when none were.
std::string dropped_characters_note(int64_t dropped, const std::string& path,
                                    const std::string& what, const std::string& first);
// text_classify's examples from a CSV. With `stored`, its vocabulary and classes (when not
// empty). `which` as for a series: splits (training) needs a known class in every row; with_targets
// (eval --data) and every_window (predict) note the rows of an empty or unseen class (-1), and
// predict needs no class column.
TextData load_text_examples(const DataOptions& options, const TextData* stored, WindowSet which);

// UTF-8 text as code points; a malformed sequence (overlong, a surrogate, past U+10FFFF, cut
// short) is an error naming `what` and the byte offset.
std::u32string decode_utf8(std::string_view text, const std::string& what);
std::string encode_utf8(std::u32string_view text);
// One character for a message: quoted, with its code point where it is no visible ASCII ('é'
// U+00E9, '\r' U+000D), so an invisible or look-alike one can be told.
std::string shown_character(char32_t c);

// Fails when texts hold characters outside a stored model's vocabulary, naming each (up to 8)
// with how often it occurs and where it is first, `where(text index, position)` (called only for
// those named).
void check_vocabulary(const std::vector<std::u32string>& texts, const std::u32string& vocab,
                      const std::string& what,
                      const std::function<std::string(size_t, size_t)>& where);

// A task's data and where it came from.
struct Dataset {
  TaskKind kind = TaskKind::forecast;
  double mask_ratio = 0.15;  // mae: the share of time steps masked
  SeriesData series;
  TextData text;
  std::string path;     // data.path
  io::FileStamp stamp;  // of `path` when it was read; none for an array in memory (io::MemoryNpy)
  bool is_text() const {
    return kind == TaskKind::charlm || kind == TaskKind::lm || kind == TaskKind::text_classify;
  }
  bool is_lm() const { return kind == TaskKind::charlm || kind == TaskKind::lm; }
  const Split& split() const { return is_text() ? text.split : series.split; }
  int64_t steps() const { return is_text() ? text.seq_len : series.lookback; }
  // Facts worth a line at start-up (gaps, cut dates, rows left out).
  const std::vector<std::string>& notes() const { return is_text() ? text.notes : series.notes; }
  // Throws when the source file changed or disappeared since it was read: a run must not
  // silently continue on different data.
  void check_source() const;
};

// Loads options.path; with `from`, reuses its normalisation, classes and vocabulary.
Dataset load_dataset(const DataOptions& options, const Dataset* from = nullptr,
                     WindowSet windows = WindowSet::splits);

}  // namespace seqforge
