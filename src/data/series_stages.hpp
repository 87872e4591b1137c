#pragma once
// The stages of the series loader. load_series (datasets.cpp) runs them in this order on a
// DataFile: the columns named and checked (series_columns.cpp); the rows ordered by series and
// date (row_order.cpp); the data.static and
// data.categorical columns' categories (series_categories.cpp); the source matrix of features,
// targets and labels (series_source.cpp); class labels (series_labels.cpp); the windows and their
// splits (series_windows.cpp); the scalers and the float32 range check (series_scalers.cpp).
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "data/data_file.hpp"
#include "seqforge/data/datasets.hpp"

namespace seqforge::series {

// A data.known_future name that is one of data.calendar's features (computed from the dates).
inline bool is_calendar(const SeriesOptions& o, const std::string& name) {
  return std::find(o.calendar.begin(), o.calendar.end(), name) != o.calendar.end();
}

// A transform that takes a base: the previous row's value, or the window's last one.
inline bool needs_base(Transform t) {
  return t == Transform::diff || t == Transform::log_return || t == Transform::pct_change;
}

// data.transform of a column (Transform::none where it names none).
inline Transform transform_of(const SeriesOptions& o, const std::string& column) {
  const auto it = o.transforms.find(column);
  return it == o.transforms.end() ? Transform::none : it->second;
}

// A number of the date column's times (millionths of its unit) as the shortest text reading back.
std::string numeric_time_text(int64_t when, int decimals = 0);

// A duration of `ticks`, `per_second` of them a second, as a whole number of the largest unit
// that divides it: "1 hour", "90 minutes", "250 milliseconds".
std::string format_duration(int64_t ticks, int64_t per_second = 1);

// An ISO date-time made here ("2024-01-13T12:00:00", "2024-01-13T12:00:00.250") written as `like`,
// a date of the file, writes its own (a space before the time, no seconds, a fraction of zeros, a
// mark of UTC), where `like` is ISO; else as it is.
std::string date_in_style_of(const std::string& like, const std::string& text);

// A date's time as ISO text: seconds since 1970, or with `subsecond` microseconds
// ("2024-03-01T10:00:07.250"; six digits where milliseconds do not hold it); a Z with `utc`.
std::string date_time_text(int64_t when, bool date_only, bool utc, bool subsecond);

// The whole seconds since 1970 of a date's time (SeriesData::subsecond_times: of microseconds).
inline int64_t whole_seconds(int64_t when, bool subsecond) {
  if (!subsecond) return when;
  const int64_t scale = static_cast<int64_t>(SeriesData::kNumericTimeScale);
  return when / scale - (when % scale < 0);
}

// The file's columns as the data takes them: pandas' unnamed index column, where it holds dates
// and no date column is named, becomes opt->series.date_col (with a note in `notes`); the file's
// features (data.features, a stored model's by name, or every column but the date, series, class,
// static and categorical ones) go to d->feature_names and a forecast's targets to
// d->target_names. Every named column is checked against the file and against the others' roles;
// with WindowSet::every_window an absent truth column leaves d->has_targets false.
void name_columns(const DataFile& table, const SeriesData* stored, WindowSet which,
                  DataOptions* opt, SeriesData* d, std::vector<std::string>* notes);
// After the file's features, the names of those derived from them: data.calendar's sines and
// cosines, the one-hot categories, the known values ahead, the missing indicators.
void name_derived_features(const SeriesOptions& o, SeriesData* d);

// The file's rows in the order the data takes: grouped by series (sorted by name), each series
// by its dates (file order without a date column). Checks duplicate dates and counts gaps.
struct RowOrder {
  std::vector<int64_t> rows;  // file rows, ordered
  std::vector<SeriesSpan> spans;
  std::vector<int64_t> times;       // (rows) with a date column
  std::vector<uint8_t> gap_before;  // (rows) 1 where a gap in the dates precedes the row
  bool numeric_times = false;       // the date column holds numbers (SeriesData::numeric_times)
  int numeric_decimals = 0;         // (SeriesData::numeric_decimals)
  bool utc_times = false;           // times with UTC offsets (SeriesData::utc_times)
  bool subsecond_times = false;     // dates with fractions of a second (microseconds)
  std::string date_order;  // "dmy" or "mdy" where the dates write a day and a month, else ""
  std::vector<std::string> iso_dates;  // (file rows) dates the file writes otherwise, as ISO
  std::vector<std::string> notes;
};
RowOrder order_rows(const DataFile& table, const SeriesOptions& o, const std::string& path);

// data.static: each column's value per series (one per series: checked) and the categories (the
// file's, sorted; with `stored`, the model's, where an unknown one is an error naming the series).
void static_categories(const DataFile& table, const DataOptions& opt, const RowOrder& order,
                       const SeriesData* stored, SeriesData* d);
// (column, category) pairs of data.categorical that a training file's model leaves out.
using CategorySet = std::set<std::pair<std::string, std::string>>;

// data.categorical: each column's categories (the training file's, sorted, less `left_out`; a
// stored model's at inference). A category the model does not have is all 0 (at inference, with a
// note).
void categorical_columns(const DataFile& table, const DataOptions& opt, const SeriesData* stored,
                         const CategorySet& left_out, SeriesData* d);

// The source matrix: features transformed against the previous row, targets against the row
// `horizon` before (the window's last row), the label column as it is. When a feature has a
// differencing transform, each series' first row is dropped. Empty target cells (values not known
// yet) are NaN with `missing_targets`, and so are empty feature cells with `missing_inputs`
// (data.missing: error; the windows used are checked by keep_last_windows). Returns the file row
// of each source row.
std::vector<int64_t> build_source(const DataFile& table, const SeriesOptions& o,
                                  const RowOrder& order,
                                  const std::vector<std::string>& target_names,
                                  const std::string& label_col, bool missing_targets,
                                  bool missing_inputs, SeriesData* d);

// Class ids per source row (classify; -1 where a row has none). Volatility classes need the
// training windows' median and are set by label_volatility once the split is known.
// With `lenient` (predict, eval --data), a class not seen in training or an empty cell is -1, not
// an error; unseen classes are counted in a note.
void label_rows(const DataFile& table, const SeriesOptions& o,
                const std::vector<int64_t>& file_rows, const SeriesData* stored, bool lenient,
                SeriesData* d, std::vector<double>* volatility);
// Volatility classes: high above the threshold (the training windows' median, or the stored one).
void label_volatility(const std::vector<double>& volatility, const SeriesData* stored,
                      SeriesData* d);
// Leaves out the windows of `list` whose truth the file does not hold (an empty target cell, a
// class the model was not trained on); returns how many.
size_t keep_windows_with_truth(SeriesData* d, std::vector<int64_t>* list);

// The windows of each series: the splits, or every window of the file.
void list_windows(const DataOptions& opt, WindowSet which, SeriesData* d);
// Keeps the last window of each series in `split.test` (predict --last); a missing input in one
// is an error naming the file's cell.
void keep_last_windows(const DataFile& table, const std::vector<int64_t>& file_rows, SeriesData* d);
// A fixed random subset of the training windows (data.label_fraction), kept in order.
void keep_labeled_fraction(const DataOptions& opt, SeriesData* d);

// Normalisation from the rows the training windows cover (inputs and targets), and no others.
void fit_normalizers(const SeriesOptions& o, SeriesData* d);
// Which scaler each series takes: its own, or (a series without one) the pooled one, if
// data.normalize_fallback allows (said once), else an error naming it.
void assign_scalers(const DataOptions& opt, bool stored, SeriesData* d);
// At inference: each of the file's first `file_features` features (the file's own columns) whose
// values average far from its training values once scaled (8 standard deviations, or 8 training
// ranges with minmax: another unit, another sensor) is named in a note.
void note_values_far_from_training(const std::string& path, size_t file_features, SeriesData* d);
// Every feature and target as the model sees it, scaled, is a float32: a value beyond its range
// (data.normalize none on 1e39) is named here rather than met as an infinite loss; so is a
// forecast target beyond it in its own units (the forecasts would be infinite).
void check_float_range(const DataFile& table, const std::vector<int64_t>& file_rows,
                       const SeriesData& d);

}  // namespace seqforge::series
