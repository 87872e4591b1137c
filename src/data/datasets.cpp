#include "seqforge/data/datasets.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "data/calendar.hpp"
#include "data/splits.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/dates.hpp"
#include "seqforge/io/file_stamp.hpp"
#include "seqforge/io/npy.hpp"

namespace seqforge {

Transform parse_transform(const std::string& name) {
  if (name.empty() || name == "none") return Transform::none;
  if (name == "log") return Transform::log;
  if (name == "diff") return Transform::diff;
  if (name == "log_return") return Transform::log_return;
  if (name == "pct_change") return Transform::pct_change;
  fail("unknown transform '", name, "' (expected log, diff, log_return or pct_change)");
}

const char* transform_name(Transform t) {
  switch (t) {
    case Transform::none:
      return "none";
    case Transform::log:
      return "log";
    case Transform::diff:
      return "diff";
    case Transform::log_return:
      return "log_return";
    case Transform::pct_change:
      return "pct_change";
  }
  return "";
}

double apply_transform(Transform t, double x, double base) {
  switch (t) {
    case Transform::none:
      return x;
    case Transform::log:
      return x > 0 ? std::log(x) : NAN;
    case Transform::diff:
      return x - base;
    case Transform::log_return:
      return x > 0 && base > 0 ? std::log(x / base) : NAN;
    case Transform::pct_change:
      return base != 0 ? x / base - 1 : NAN;
  }
  return NAN;
}

double invert_transform(Transform t, double y, double base) {
  switch (t) {
    case Transform::none:
      return y;
    case Transform::log:
      return std::exp(y);
    case Transform::diff:
      return base + y;
    case Transform::log_return:
      return base * std::exp(y);
    case Transform::pct_change:
      return base * (1 + y);
  }
  return NAN;
}

namespace {
// A data.known_future name that is one of data.calendar's features (computed from the dates).
bool is_calendar(const SeriesOptions& o, const std::string& name) {
  return std::find(o.calendar.begin(), o.calendar.end(), name) != o.calendar.end();
}

// A transform that takes a base: the previous row's value, or the window's last one.
bool needs_base(Transform t) {
  return t == Transform::diff || t == Transform::log_return || t == Transform::pct_change;
}

}  // namespace

const SeriesSpan& SeriesData::series_of(int64_t row) const {
  SF_CHECK(!series.empty() && row >= 0 && row < rows, "row ", row, " of ", rows);
  const auto it = std::upper_bound(series.begin(), series.end(), row,
                                   [](int64_t r, const SeriesSpan& s) { return r < s.begin; });
  return *(it - 1);
}

double SeriesData::prediction(int64_t start, int64_t k, int64_t j, double y) const {
  const int64_t column = target_norm.steps > 1 ? k * num_targets() + j : j;
  const double v = target_norm.invert(y, column, scaler_of(last_row(start)));
  const Transform t = target_transforms.empty() ? Transform::none : target_transforms[j];
  if (t == Transform::none || t == Transform::log) return invert_transform(t, v, 0);
  const int64_t O = static_cast<int64_t>(target_names.size());
  return invert_transform(t, v, raw_targets[last_row(start) * O + j]);
}

double SeriesData::actual(int64_t start, int64_t k, int64_t j) const {
  return target_value(target_row(start, k), j);
}

double SeriesData::target_value(int64_t row, int64_t j) const {
  const int64_t O = static_cast<int64_t>(target_names.size());
  if (!raw_targets.empty()) return raw_targets[row * O + j];
  return source.at(row, target_cols[j]);
}

int64_t SeriesData::num_outputs() const {
  if (task == TaskKind::mae) return num_features();
  return task == TaskKind::classify ? static_cast<int64_t>(class_names.size())
                                    : num_targets() * steps_ahead * num_quantiles();
}

int64_t SeriesData::point_quantile() const {
  int64_t best = 0;
  for (size_t q = 1; q < quantiles.size(); ++q)
    if (std::fabs(quantiles[q] - 0.5) < std::fabs(quantiles[best] - 0.5)) best = int64_t(q);
  return best;
}

void SeriesData::forecasts(int64_t start, int64_t k, int64_t j, const float* o, double* out) const {
  const int64_t Q = num_quantiles();
  const float* at = o + (k * num_targets() + j) * Q;
  bool finite = true;
  for (int64_t q = 0; q < Q; ++q) finite &= std::isfinite(out[q] = prediction(start, k, j, at[q]));
  if (finite) std::sort(out, out + Q);
}

namespace {

// Rows [first, first + n) of columns `cols`, normalised, into out (n, cols.size()).
template <typename T>
void copy_normalized(const SourceMatrix& m, int64_t first, int64_t n,
                     const std::vector<int64_t>& cols, const double* shift, const double* scale,
                     float* out) {
  const T* src = reinterpret_cast<const T*>(m.data) + first * m.cols;
  const size_t width = cols.size();
  for (int64_t r = 0; r < n; ++r, src += m.cols)
    for (size_t j = 0; j < width; ++j)
      *out++ = static_cast<float>((static_cast<double>(src[cols[j]]) - shift[j]) / scale[j]);
}

// With the scaler of the rows' series (`scaler`: Normalizer::series_index).
void copy_rows(const SourceMatrix& m, int64_t first, int64_t n, const std::vector<int64_t>& cols,
               const Normalizer& norm, int64_t scaler, float* out) {
  if (m.dtype == DType::f32) {
    copy_normalized<float>(m, first, n, cols, norm.shifts(scaler), norm.scales(scaler), out);
  } else {
    copy_normalized<double>(m, first, n, cols, norm.shifts(scaler), norm.scales(scaler), out);
  }
}

}  // namespace

void SeriesData::copy_window(int64_t start, float* out) const {
  copy_rows(source, start, lookback, feature_cols, feature_norm, scaler_of(start), out);
  if (masks_missing)  // a missing input is 0, the features' mean; its indicator says it is missing
    std::replace_if(
        out, out + lookback * num_features(), [](float x) { return std::isnan(x); }, 0.0f);
}

namespace {

// The normalised targets that follow row `last` (those of the window ending there), with the
// given scaler, into `out` (steps_ahead, O, quantiles).
void copy_targets_after(const SeriesData& d, int64_t last, int64_t scaler, float* out) {
  const int64_t start = last - d.lookback + 1, Q = d.num_quantiles();
  if (d.steps_ahead == 1 && Q == 1)
    return copy_rows(d.source, d.target_row(start), 1, d.target_cols, d.target_norm, scaler, out);
  const int64_t O = d.num_targets();
  const double *shift = d.target_norm.shifts(scaler), *scale = d.target_norm.scales(scaler);
  for (int64_t k = 0; k < d.steps_ahead; ++k)
    for (int64_t j = 0; j < O; ++j) {
      const int64_t c = d.target_norm.steps > 1 ? k * O + j : j;
      const double v = (d.step_target(start, k, j) - shift[c]) / scale[c];
      std::fill_n(out + (k * O + j) * Q, Q, static_cast<float>(v));
    }
}

}  // namespace

void SeriesData::copy_target(int64_t start, float* out) const {
  const int64_t scaler = scaler_of(start), last = last_row(start);
  if (!every_step) return copy_targets_after(*this, last, scaler, out);
  const int64_t outputs = num_outputs();
  for (int64_t t = 0; t < lookback; ++t)  // step t's: those after row start + t
    copy_targets_after(*this, last - (lookback - 1 - t), scaler, out + t * outputs);
}

double SeriesData::step_target(int64_t start, int64_t k, int64_t j) const {
  // Every step's change is taken from the window's last row (its transform's base).
  const int64_t O = num_targets(), row = target_row(start, k);
  const Transform t = target_transforms[j];
  return needs_base(t)
             ? apply_transform(t, raw_targets[row * O + j], raw_targets[last_row(start) * O + j])
             : source.at(row, target_cols[j]);
}

namespace {

// A number of the date column's times (millionths of its unit) as the shortest text reading back.
std::string numeric_time_text(int64_t when) {
  char buf[32];
  const auto end =
      std::to_chars(buf, buf + sizeof buf, double(when) / SeriesData::kNumericTimeScale).ptr;
  return std::string(buf, end);
}

}  // namespace

std::optional<int64_t> SeriesData::time_ahead(int64_t row, int64_t ahead) const {
  if (times.empty()) return std::nullopt;
  const SeriesSpan& s = series_of(row);
  if (row + ahead < s.end) return times[row + ahead];
  if (!s.regular || s.step <= 0) return std::nullopt;
  const int64_t last = s.end - 1, n = row + ahead - last;  // steps past the series' last row
  if (s.business_days) return BusinessCalendar(holidays).add(times[last], n);
  if (s.months > 0) return io::add_months(times[last], n * s.months, s.month_end);
  return times[last] + n * s.step;
}

std::string SeriesData::time_text(int64_t when, bool date_only) const {
  if (numeric_times) return numeric_time_text(when);
  return io::format_datetime(when, date_only && !utc_times) + (utc_times ? "Z" : "");
}

int64_t SeriesData::scaler_of(int64_t row) const {
  if (series_scaler.empty()) return -1;
  return series_scaler[static_cast<size_t>(&series_of(row) - series.data())];
}

void Dataset::check_source() const {
  if (stamp == io::FileStamp{}) return;  // an array in memory
  io::FileStamp now;
  try {
    now = io::stamp_of(path);
  } catch (const Error&) {
    fail(path, ": the data file disappeared during the run");
  }
  if (!(now == stamp))
    fail(path, ": the data file changed during the run (size ", stamp.size, " -> ", now.size,
         " bytes, or a new modification time); restart the run on the new data");
}

// Split boundaries [0, a), [a, b), [b, n) from the train and val shares. A share times n that is
// a whole number in decimal (0.7 + 0.2 of 100) may come out just below it in binary: the relative
// nudge keeps it whole.
std::string untrained_classes_note(const std::vector<std::string>& names,
                                   const std::vector<int64_t>& train_classes, const char* item) {
  std::vector<int64_t> count(names.size(), 0);
  for (int64_t c : train_classes)
    if (c >= 0) ++count[size_t(c)];
  std::string listed;
  int64_t untrained = 0;
  for (size_t c = 0; c < count.size(); ++c)
    if (count[c] == 0 && untrained++ < 5) listed += (listed.empty() ? "'" : ", '") + names[c] + "'";
  if (untrained == 0) return "";
  return std::to_string(untrained) + " of " + std::to_string(names.size()) + " classes (" + listed +
         (untrained > 5 ? ", ..." : "") + ") in no training " + item +
         ", only in validation or test: the model cannot learn them (data.split.mode: random "
         "deals " +
         item + "s of every class to the training split)";
}

std::pair<int64_t, int64_t> boundaries(const SplitOptions& o, int64_t n) {
  auto rows = [&](double share) {
    return static_cast<int64_t>(std::floor(share * double(n) * (1 + 1e-12)));
  };
  const int64_t a = rows(o.train);
  const int64_t b = std::min<int64_t>(n, rows(o.train + o.val));
  return {a, b};
}

// Whole windows (or chunks) dealt at random, with the split's seed, by its shares.
void random_split(const SplitOptions& o, std::vector<int64_t> all, Split* out) {
  Rng rng(o.seed ^ 0x5b117ull);
  for (int64_t i = static_cast<int64_t>(all.size()) - 1; i > 0; --i)
    std::swap(all[i], all[rng.next() % (i + 1)]);
  const auto [a, b] = boundaries(o, static_cast<int64_t>(all.size()));
  out->train.assign(all.begin(), all.begin() + a);
  out->val.assign(all.begin() + a, all.begin() + b);
  out->test.assign(all.begin() + b, all.end());
  for (auto* v : {&out->train, &out->val, &out->test}) std::sort(v->begin(), v->end());
}

namespace {

// A mapped file cut short under the process makes reading it raise SIGBUS: say which file it was
// and exit (checkpoints are written atomically, so the last one stays whole).
char sigbus_message[512];
void report_sigbus(int) {
  const ssize_t n = ::write(STDERR_FILENO, sigbus_message, std::strlen(sigbus_message));
  (void)n;
  ::_exit(1);
}
void on_sigbus_report(const std::string& path) {
  std::snprintf(
      sigbus_message, sizeof sigbus_message,
      "seqforge: error: %.400s: the memory-mapped data file was truncated during the run\n",
      path.c_str());
  struct sigaction action {};
  action.sa_handler = report_sigbus;
  ::sigaction(SIGBUS, &action, nullptr);
}

// A data file: a CSV (named columns, read whole) or a 2-D .npy array (columns "0", "1", ...;
// float arrays stay memory-mapped).
class DataFile {
 public:
  DataFile(const std::string& path, const std::vector<std::string>& missing_codes) : path_(path) {
    if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0) {
      io::MappedNpy mapped = io::map_npy(path);
      if (mapped.shape.size() != 2)
        fail(path, ": expected a 2-D array (rows, columns), got ", mapped.shape.size(),
             " dimensions");
      matrix_.rows = mapped.shape[0];
      matrix_.cols = mapped.shape[1];
      if (mapped.dtype == DType::f32 || mapped.dtype == DType::f64) {
        matrix_.dtype = mapped.dtype;
        matrix_.data = mapped.data;
        matrix_.owner = mapped.mapping;
        on_sigbus_report(path);
      } else {  // integers: converted in memory
        auto values = std::make_shared<std::vector<double>>(matrix_.rows * matrix_.cols);
        convert(mapped.data, mapped.dtype, values->data(), DType::f64, values->size());
        matrix_.dtype = DType::f64;
        matrix_.data = reinterpret_cast<const std::byte*>(values->data());
        matrix_.owner = values;
      }
      for (int64_t j = 0; j < matrix_.cols; ++j) names_.push_back(std::to_string(j));
      for (const std::string& code : missing_codes) {
        const std::optional<double> v = io::parse_finite(code);  // as a CSV cell reads
        if (!v)
          fail(path, ": data.missing_values: '", code,
               "' is no number, and a .npy array holds only numbers");
        missing_numbers_.push_back(*v);
      }
    } else {
      csv_ = std::make_unique<io::CsvTable>(io::CsvTable::read(path));
      csv_->set_missing_codes(missing_codes);
      names_ = csv_->columns();
    }
  }
  int64_t rows() const { return csv_ ? csv_->rows() : matrix_.rows; }
  const std::vector<std::string>& columns() const { return names_; }
  bool has_column(const std::string& name) const {
    return std::find(names_.begin(), names_.end(), name) != names_.end();
  }
  const std::vector<std::string>& text(const std::string& name) const {
    if (!csv_) fail(path_, ": a .npy array has no text column '", name, "'");
    return csv_->text(name);
  }
  bool is_array() const { return !csv_; }
  // Where the file is not comma-separated: which separator its header told, and which of
  // `numeric` write decimal commas.
  std::optional<std::string> separator_note(const std::vector<std::string>& numeric) const {
    if (!csv_ || csv_->delimiter() == ',') return std::nullopt;
    std::string note =
        path_ + ": fields separated by " + csv_->delimiter_name() + " (the header has no comma)";
    std::string decimal;
    for (const std::string& name : numeric)
      if (csv_->has_column(name) && csv_->decimal_commas(name) &&
          decimal.find("'" + name + "'") == std::string::npos)
        decimal += (decimal.empty() ? "" : ", ") + ("'" + name + "'");
    if (!decimal.empty()) note += "; decimal commas in " + decimal;
    return note;
  }
  std::string columns_hint() const {
    return csv_ ? csv_->columns_hint()
                : " (a .npy array's columns are 0 to " + std::to_string(matrix_.cols - 1) + ")";
  }
  // A numeric column, one finite value per file row (or NaN for a missing cell, with
  // `missing_allowed`).
  std::vector<double> column(const std::string& name, bool missing_allowed = false) const {
    if (csv_) return missing_allowed ? csv_->numeric_or_missing(name) : csv_->numeric(name);
    const int64_t j = std::stoll(name);
    std::vector<double> x(matrix_.rows);
    for (int64_t r = 0; r < matrix_.rows; ++r) {
      const double v = matrix_.at(r, j);
      const bool code =
          std::find(missing_numbers_.begin(), missing_numbers_.end(), v) != missing_numbers_.end();
      if (code && !missing_allowed)
        fail(path_, ": row ", r, ", column ", j, ": ", v,
             " marks a missing value (data.missing_values), not a number");
      x[r] = missing_allowed && (code || std::isnan(v)) ? NAN : checked(r, j);
    }
    return x;
  }
  // Whether the array is used as it is: no value of it marks a missing one.
  bool has_missing_codes() const { return !missing_numbers_.empty(); }
  // The mapped array itself and the indices of the named columns, every value used checked.
  SourceMatrix array(const std::vector<std::string>& names, std::vector<int64_t>* cols) const {
    for (const auto& name : names) cols->push_back(std::stoll(name));
    for (int64_t r = 0; r < matrix_.rows; ++r)
      for (int64_t j : *cols) checked(r, j);
    return matrix_;
  }
  // "<path>:<line>" for a CSV row, "<path>: row <r>" for an array row.
  const std::string& path() const { return path_; }
  std::string where(int64_t row) const {
    return csv_ ? path_ + ":" + std::to_string(csv_->line_of_row(row))
                : path_ + ": row " + std::to_string(row);
  }

 private:
  double checked(int64_t r, int64_t j) const {
    const double x = matrix_.at(r, j);
    if (!std::isfinite(x))
      fail(path_, ": row ", r, ", column ", j, ": ", x, " is not a finite number");
    return x;
  }
  std::string path_;
  std::unique_ptr<io::CsvTable> csv_;
  SourceMatrix matrix_;
  std::vector<std::string> names_;
  std::vector<double> missing_numbers_;  // .npy: data.missing_values
};

}  // namespace

namespace {

Transform transform_of(const SeriesOptions& o, const std::string& column) {
  const auto it = o.transforms.find(column);
  return it == o.transforms.end() ? Transform::none : it->second;
}

std::string format_duration(int64_t seconds) {
  const std::pair<int64_t, const char*> units[] = {
      {86400, "day"}, {3600, "hour"}, {60, "minute"}, {1, "second"}};
  for (const auto& [size, name] : units)
    if (seconds % size == 0 || size == 1) {
      const int64_t n = seconds / size;
      return std::to_string(n) + " " + name + (n == 1 ? "" : "s");
    }
  return std::to_string(seconds) + " seconds";
}

// The file's rows in the order the data takes: grouped by series (sorted by name), each series
// by its dates (file order without a date column). Checks duplicate dates and counts gaps.
struct RowOrder {
  std::vector<int64_t> rows;  // file rows, ordered
  std::vector<SeriesSpan> spans;
  std::vector<int64_t> times;          // (rows) with a date column
  bool numeric_times = false;          // the date column holds numbers (SeriesData::numeric_times)
  bool utc_times = false;              // times with UTC offsets (SeriesData::utc_times)
  std::vector<std::string> iso_dates;  // (file rows) dates the file writes otherwise, as ISO
  std::vector<std::string> notes;
};

// How the date column of a CSV writes its dates: its first cell tells ISO, YYYYMMDD or day and
// month first, whose order a field past 12 anywhere in the column tells (or data.date_order).
// nullopt: the column holds numbers, not dates.
std::optional<io::DateLayout> date_layout(const DataFile& table, const SeriesOptions& o) {
  const std::vector<std::string>& cells = table.text(o.date_col);
  const std::string& first = cells[0];
  if (io::parse_datetime(first)) return io::DateLayout::iso;
  if (io::parse_date(first, io::DateLayout::compact)) return io::DateLayout::compact;
  if (io::parse_date(first, io::DateLayout::named_month)) return io::DateLayout::named_month;
  if (io::parse_finite(first)) return std::nullopt;
  if (!io::day_month_fields(first)) return io::DateLayout::iso;  // each cell's error says why
  if (o.date_order != "auto")
    return o.date_order == "dmy" ? io::DateLayout::day_first : io::DateLayout::month_first;
  int64_t day_past_12 = -1, month_past_12 = -1;  // rows whose first or second field is past 12
  for (int64_t r = 0; r < table.rows() && (day_past_12 < 0 || month_past_12 < 0); ++r)
    if (const auto f = io::day_month_fields(cells[r])) {
      if (f->first > 12 && day_past_12 < 0) day_past_12 = r;
      if (f->second > 12 && month_past_12 < 0) month_past_12 = r;
    }
  if (day_past_12 >= 0 && month_past_12 >= 0)
    fail(table.where(month_past_12), ": column '", o.date_col, "': '", cells[month_past_12],
         "' has its month first where '", cells[day_past_12], "' (", table.where(day_past_12),
         ") has its day first: one order per column");
  if (day_past_12 >= 0) return io::DateLayout::day_first;
  if (month_past_12 >= 0) return io::DateLayout::month_first;
  fail(table.where(0), ": column '", o.date_col, "': '", first,
       "' may have its day or its month first, and no date of the column has a field past 12 "
       "to tell: set data.date_order: dmy (day first) or mdy (month first)");
}

std::string layout_note(const DataFile& table, const SeriesOptions& o, io::DateLayout layout) {
  const std::string column = "column '" + o.date_col + "' writes its dates ";
  if (layout == io::DateLayout::compact)
    return column + "as YYYYMMDD; predictions write them as ISO dates";
  if (layout == io::DateLayout::named_month)
    return column + "with the months' names; predictions write them as ISO dates";
  const bool day = layout == io::DateLayout::day_first;
  std::string why = "data.date_order";
  if (o.date_order == "auto")
    for (int64_t r = 0; r < table.rows(); ++r)
      if (const auto f = io::day_month_fields(table.text(o.date_col)[r]);
          f && (day ? f->first : f->second) > 12) {
        why = "'" + table.text(o.date_col)[r] + "' at " + table.where(r);
        break;
      }
  return column + (day ? "day first (day/month/year: " : "month first (month/day/year: ") + why +
         "); predictions write them as ISO dates";
}

RowOrder order_rows(const DataFile& table, const SeriesOptions& o, const std::string& path) {
  RowOrder out;
  const BusinessCalendar business(o.holidays);
  const int64_t n = table.rows();
  std::vector<int64_t> when(n, 0);
  // A date column of numbers (elapsed seconds, a Unix time, a sample index) orders the rows in
  // its own units, kept in millionths so that fractional steps survive; it has no calendar.
  std::optional<io::DateLayout> layout;  // a CSV's dates; nullopt: numbers
  if (!o.date_col.empty() && n > 0 && !table.is_array()) layout = date_layout(table, o);
  out.numeric_times = !o.date_col.empty() && n > 0 && !layout;
  if (out.numeric_times) {
    const std::string numbers = "column '" + o.date_col + "' holds numbers, not dates";
    if (!o.calendar.empty()) fail(path, ": data.calendar needs dates; ", numbers);
    for (const std::string& name : o.known_future)
      if (is_calendar(o, name))
        fail(path, ": data.known_future '", name, "' needs dates; ", numbers);
    if (o.frequency.kind != Frequency::automatic)
      fail(path, ": data.frequency ", o.frequency.text, " needs dates; ", numbers);
    if (!o.holidays.empty()) fail(path, ": data.holidays need dates; ", numbers);
    const std::vector<double> x = table.column(o.date_col);  // names a cell that is no number
    for (int64_t r = 0; r < n; ++r) {
      if (!(std::fabs(x[r]) < 9e12))
        fail(table.where(r), ": column '", o.date_col, "': ", x[r],
             " is too large a time (at most 9e12 in magnitude)");
      when[r] = std::llround(x[r] * SeriesData::kNumericTimeScale);
    }
    out.notes.push_back(path + ": " + numbers +
                        ", times in its own units (ISO dates give a calendar)");
  } else if (!o.date_col.empty() && n > 0) {
    const auto& dates = table.text(o.date_col);
    std::vector<int64_t> offsets(n, 0);  // the UTC offsets written (seconds)
    for (int64_t r = 0; r < n; ++r) {
      const auto t = io::parse_date(dates[r], *layout, &offsets[r]);
      if (!t && r == 0)
        fail(table.where(r), ": column '", o.date_col, "': '", dates[r],
             "' is neither a date (2012-01-31, 2012-01-31 13:45, 2012/01/31, 20120131, "
             "31/01/2012, 01/31/2012 1:45 PM, 31.01.2012, Jan 31, 2012, 31-Jan-2012) nor a "
             "number");
      if (!t)
        fail(table.where(r), ": column '", o.date_col, "': '", dates[r],
             "' is not a date written as the column's first, '", dates[0], "'",
             layout == io::DateLayout::iso ? "" : " (" + layout_note(table, o, *layout) + ")");
      when[r] = *t;
    }
    // Days at local midnight with their UTC offsets (a pandas frame's dates in a time zone): the
    // offset changes with daylight saving time, so in UTC the steps would be 23 and 25 hours.
    // Such dates are read as the local days they name; other times stay instants (UTC), whose
    // order and steps hold across the clock's changes.
    const bool offsets_written =
        std::any_of(offsets.begin(), offsets.end(), [](int64_t o) { return o != 0; });
    bool local_days = offsets_written;
    for (int64_t r = 0; r < n && local_days; ++r) local_days = (when[r] + offsets[r]) % 86400 == 0;
    if (local_days) {
      for (int64_t r = 0; r < n; ++r) when[r] += offsets[r];
      out.notes.push_back(path + ": column '" + o.date_col +
                          "' holds local midnights with UTC offsets: read as the days they name");
    } else if (offsets_written) {
      out.utc_times = true;
      out.notes.push_back(path + ": column '" + o.date_col +
                          "' holds times with UTC offsets: read as instants, written in UTC "
                          "(2021-11-07T06:30:00Z), data.calendar's hours and days UTC's");
    }
    bool midnights = true;
    for (int64_t r = 0; r < n; ++r) midnights = midnights && when[r] % 86400 == 0;
    if (layout != io::DateLayout::iso)
      out.notes.push_back(path + ": " + layout_note(table, o, *layout));
    // Predictions write every date one way: 2012/01/31 and a month's 2012-01 as 2012-01-31 and
    // 2012-01-01, like the dates they add past a series' end.
    const std::string_view first = io::trim(dates[0]);
    const bool month = first.size() == 7;
    const bool padded =
        first.size() >= 10 && first[7] == '-' && std::isdigit(static_cast<unsigned char>(first[9]));
    if (layout != io::DateLayout::iso || first.find('/') != std::string::npos || month || !padded ||
        offsets_written)
      for (int64_t r = 0; r < n; ++r)
        out.iso_dates.push_back(io::format_datetime(when[r], midnights && !out.utc_times) +
                                (out.utc_times ? "Z" : ""));
  }
  // A file row's date as the file writes it.
  auto date_text = [&](int64_t r) {
    return table.is_array() ? numeric_time_text(when[r]) : table.text(o.date_col)[r];
  };
  static const std::vector<std::string> no_names;
  const std::vector<std::string>& names =
      o.series_col.empty() ? no_names : table.text(o.series_col);
  out.rows.resize(n);
  std::iota(out.rows.begin(), out.rows.end(), 0);
  std::stable_sort(out.rows.begin(), out.rows.end(), [&](int64_t a, int64_t b) {
    if (!names.empty() && names[a] != names[b]) return names[a] < names[b];
    return when[a] < when[b];
  });
  int64_t gaps = 0, largest = 0;
  std::string largest_at;
  for (int64_t p = 0; p < n;) {
    SeriesSpan span;
    span.name = names.empty() ? "" : names[out.rows[p]];
    span.begin = p;
    int64_t q = p + 1;
    while (q < n && (names.empty() || names[out.rows[q]] == span.name)) ++q;
    span.end = q;
    if (!o.date_col.empty()) {
      std::vector<int64_t> steps;
      for (int64_t k = p + 1; k < q; ++k) {
        const int64_t a = out.rows[k - 1], b = out.rows[k];
        if (when[a] == when[b]) {
          const std::string date = date_text(b);
          const std::string set_back =
              clock_set_back(when[b], date)
                  ? ": a local clock set back an hour for daylight saving time? Write the times "
                    "in UTC or with their UTC offsets (2021-11-07T01:30-04:00)"
                  : "";
          if (o.series_col.empty())
            fail(table.where(b), ": date '", date, "' appears again (first at ", table.where(a),
                 ")",
                 set_back.empty() ? ": several series in one file? Name the column that tells "
                                    "them apart in data.series_column"
                                  : set_back);
          fail(table.where(b), ": series '", span.name, "': duplicate date '", date, "' (first at ",
               table.where(a), ")", set_back);
        }
        steps.push_back(when[b] - when[a]);
      }
      if (!steps.empty()) {
        const Frequency& f = o.frequency;
        // How many steps of the calendar each one spans: 1, or more across a gap.
        std::vector<int64_t> spanned(steps.size());
        if (!out.numeric_times)
          span.months = calendar_months(when, out.rows, p, q,
                                        f.kind == Frequency::calendar_months ? f.months : 0,
                                        &span.month_end, &spanned);
        std::vector<int64_t> sorted = steps;
        std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
        span.step = sorted[sorted.size() / 2];
        // On a grid: every step a whole number of the usual one (or of calendar months).
        span.regular = span.months > 0 || std::all_of(steps.begin(), steps.end(), [&](int64_t s) {
                         return s % span.step == 0;
                       });
        auto where = [&](int64_t k) { return table.where(out.rows[p + k]); };
        auto date = [&](int64_t k) { return "'" + date_text(out.rows[p + k]) + "'"; };
        auto is_business = [&] {
          for (int64_t k = p; k < q; ++k)
            if (!business.is_business_day(when[out.rows[k]])) return false;
          return true;
        };
        if (f.kind == Frequency::business ||
            (f.kind == Frequency::automatic && !out.numeric_times && span.months == 0 &&
             span.step == 86400 &&
             std::any_of(steps.begin(), steps.end(), [](int64_t s) { return s != 86400; }) &&
             is_business())) {
          span.business_days = true;
          for (int64_t k = 0; k < q - p; ++k)
            if (const int64_t t = when[out.rows[p + k]]; !business.is_business_day(t))
              fail(where(k), ": ", date(k), " is ",
                   business.is_holiday(t) ? "listed in data.holidays" : "on a weekend",
                   ", not a business day (data.frequency B)");
          for (size_t k = 0; k < steps.size(); ++k) {
            spanned[k] = business.between(when[out.rows[p + k]], when[out.rows[p + k + 1]]);
            if (steps[k] % 86400 != 0)
              fail(where(int64_t(k) + 1), ": ", date(int64_t(k) + 1),
                   " is not at the time of day of the row before (data.frequency B)");
          }
          span.regular = true;
          span.step = 86400;
          span.months = 0;
        } else if (f.kind == Frequency::fixed) {
          for (size_t k = 0; k < steps.size(); ++k) {
            if (steps[k] % f.seconds != 0)
              fail(where(int64_t(k) + 1), ": ", date(int64_t(k) + 1), " is ",
                   format_duration(steps[k]), " after the row before, not a whole number of ",
                   "data.frequency ", o.frequency.text);
            spanned[k] = steps[k] / f.seconds;
          }
          span.step = f.seconds;
          span.months = 0;
          span.regular = true;
        } else if (f.kind == Frequency::calendar_months) {
          if (span.months != f.months && q - p > 1)
            fail(path, ": ", span.name.empty() ? "the" : "series '" + span.name + "':",
                 " dates do not step by whole multiples of ", f.months, " calendar month",
                 f.months > 1 ? "s" : "", " on one day of the month (data.frequency ",
                 o.frequency.text, "): see ", where(1));
        } else if (span.months == 0) {
          for (size_t k = 0; k < steps.size(); ++k)
            spanned[k] = span.regular ? steps[k] / span.step : 2 * steps[k] > 3 * span.step ? 2 : 1;
        }
        for (size_t k = 0; k < steps.size(); ++k)
          if (spanned[k] > 1) {
            ++gaps;
            if (steps[k] > largest) {
              largest = steps[k];
              largest_at = date_text(out.rows[p + k]);
              if (!span.name.empty())
                largest_at = "series '" + span.name + "' after " + largest_at;
              else
                largest_at = "after " + largest_at;
            }
          }
      }
    }
    out.spans.push_back(span);
    p = q;
  }
  if (!o.date_col.empty()) {
    out.times.resize(n);
    for (int64_t p = 0; p < n; ++p) out.times[p] = when[out.rows[p]];
  }
  if (gaps > 0)
    out.notes.push_back(
        path + ": " + std::to_string(gaps) + " gap" + (gaps == 1 ? "" : "s") + " in the " +
        (out.numeric_times ? "times" : "dates") + " longer than the usual step (the largest " +
        (out.numeric_times ? numeric_time_text(largest) + " in column '" + o.date_col + "'"
                           : format_duration(largest)) +
        ", " + largest_at + ")");
  return out;
}

// Start positions of the windows in rows [begin, end) of the source, every `stride`: with
// `targets`, those whose target row lies inside, else every complete input window.
void add_windows(const SeriesData& d, int64_t begin, int64_t end, int64_t stride, bool targets,
                 std::vector<int64_t>* out) {
  for (int64_t s = begin; (targets ? d.target_row(s) : d.last_row(s)) < end; s += stride)
    out->push_back(s);
}

// Split boundaries of every span: [begin, a), [a, b), [b, end), by row shares or shared dates.
std::vector<std::pair<int64_t, int64_t>> split_points(const SplitOptions& o, const SeriesData& d) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (o.by == "rows") {
    for (const SeriesSpan& s : d.series) {
      const auto [a, b] = boundaries(o, s.end - s.begin);
      out.emplace_back(s.begin + a, s.begin + b);
    }
    return out;
  }
  std::vector<int64_t> pooled = d.times;
  std::sort(pooled.begin(), pooled.end());
  const auto [a, b] = boundaries(o, static_cast<int64_t>(pooled.size()));
  const int64_t n = static_cast<int64_t>(pooled.size());
  const int64_t cut_a = a < n ? pooled[a] : INT64_MAX, cut_b = b < n ? pooled[b] : INT64_MAX;
  for (const SeriesSpan& s : d.series) {
    auto first_at = [&](int64_t cut) {
      return std::lower_bound(d.times.begin() + s.begin, d.times.begin() + s.end, cut) -
             d.times.begin();
    };
    out.emplace_back(first_at(cut_a), first_at(cut_b));
  }
  return out;
}

// The value of file row `r` of a column: the CSV's numbers or the array's.
struct ColumnValues {
  std::vector<double> values;  // (file rows)
  std::string name;
};

// The source matrix: features transformed against the previous row, targets against the row
// `horizon` before (the window's last row), the label column as it is. When a feature has a
// differencing transform, each series' first row is dropped. Returns the file row of each source
// row.
// Fills the missing cells (NaN) of column x (by file row) per data.missing, each series walked in
// time order; returns how many it filled.
int64_t fill_missing(std::vector<double>* x, const RowOrder& order, const std::string& how,
                     const DataFile& table, const std::string& name) {
  int64_t filled = 0;
  std::vector<double>& v = *x;
  for (const SeriesSpan& s : order.spans) {
    auto at = [&](int64_t p) -> double& { return v[order.rows[p]]; };
    int64_t last = -1;  // the position of the last value seen
    for (int64_t p = s.begin; p < s.end; ++p) {
      if (!std::isnan(at(p))) {
        last = p;
        continue;
      }
      if (how == "ffill") {
        if (last < 0)
          fail(table.where(order.rows[p]), ": column '", name,
               "': a missing cell with no value before it in its series, which data.missing ffill "
               "needs (data.missing: interpolate takes the nearest value)");
        at(p) = at(last);
        ++filled;
        continue;
      }
      int64_t next = p;  // interpolate: the next value, if any
      while (next < s.end && std::isnan(at(next))) ++next;
      if (last < 0 && next == s.end)
        fail(table.where(order.rows[p]), ": column '", name, "' has no value in its series",
             s.name.empty() ? "" : " '" + s.name + "'");
      for (int64_t q = p; q < next; ++q, ++filled) {
        if (last < 0)
          at(q) = at(next);
        else if (next == s.end)
          at(q) = at(last);
        else
          at(q) = at(last) + (at(next) - at(last)) * double(q - last) / double(next - last);
      }
      p = next - 1;
    }
  }
  return filled;
}

// A number of nines (-99.99, -999, 9999) in column x lying farther outside the range of the
// column's other values than that range is wide: the usual code for a missing measurement, which
// taken as a value would swamp the column's scale. Named in a note, the most frequent one.
std::optional<std::string> nines_note(const std::vector<double>& x, const std::string& column,
                                      const DataFile& table) {
  std::map<double, std::pair<int64_t, int64_t>> nines;  // value -> (cells, first row)
  double lo = INFINITY, hi = -INFINITY;
  for (int64_t r = 0; r < int64_t(x.size()); ++r) {
    const double v = x[r];
    if (std::isnan(v)) continue;
    if (io::is_nines(v)) {
      auto [it, added] = nines.try_emplace(v, 0, r);
      ++it->second.first;
    } else {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (!(lo <= hi)) return std::nullopt;
  const double width = hi - lo;
  const std::pair<const double, std::pair<int64_t, int64_t>>* code = nullptr;
  for (const auto& entry : nines) {
    const double v = entry.first;
    if ((v < lo - width || v > hi + width) && (!code || entry.second.first > code->second.first))
      code = &entry;
  }
  if (!code) return std::nullopt;
  auto text = [](double v) {
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    return std::string(buf, end);
  };
  const int64_t cells = code->second.first;
  return "column '" + column + "': " + std::to_string(cells) +
         (cells == 1 ? " cell holds " : " cells hold ") + text(code->first) + " (the first at " +
         table.where(code->second.second) + "), far outside its other values (" + text(lo) +
         " to " + text(hi) + "): a code for a missing value? data.missing_values: [" +
         text(code->first) + "] makes such cells missing";
}

std::vector<int64_t> build_source(const DataFile& table, const SeriesOptions& o,
                                  const RowOrder& order,
                                  const std::vector<std::string>& target_names,
                                  const std::string& label_col, bool missing_targets,
                                  SeriesData* d) {
  // The mapped array itself, never loaded whole, where nothing is to be transformed, filled or
  // reordered.
  if (table.is_array() && o.transforms.empty() && o.missing == "error" && o.known_future.empty() &&
      !table.has_missing_codes() && o.date_col.empty()) {
    std::vector<std::string> names = o.features;
    names.insert(names.end(), target_names.begin(), target_names.end());
    if (!label_col.empty()) names.push_back(label_col);
    std::vector<int64_t> cols;
    d->source = table.array(names, &cols);
    d->rows = d->source.rows;
    d->series = order.spans;
    const size_t F = o.features.size();
    d->feature_cols.assign(cols.begin(), cols.begin() + F);
    d->target_cols.assign(cols.begin() + F, cols.begin() + F + target_names.size());
    d->target_transforms.assign(target_names.size(), Transform::none);
    if (!label_col.empty()) d->label_col = cols.back();
    return order.rows;
  }
  bool& drop_first = d->drops_first_rows;
  for (const auto& f : o.features) drop_first |= needs_base(transform_of(o, f));
  std::vector<int64_t> keep;  // positions in order.rows
  for (const SeriesSpan& s : order.spans) {
    SeriesSpan kept = s;
    kept.begin = static_cast<int64_t>(keep.size());
    for (int64_t p = s.begin + (drop_first ? 1 : 0); p < s.end; ++p) keep.push_back(p);
    kept.end = static_cast<int64_t>(keep.size());
    d->series.push_back(kept);
  }
  const int64_t n = static_cast<int64_t>(keep.size());
  d->rows = n;
  const int64_t file_features = static_cast<int64_t>(o.features.size());
  const bool mask = o.missing == "mask";  // an indicator per file feature, after the statics'
  int64_t one_hots = 0;
  for (const auto* list : {&d->static_categories, &d->categories})
    for (const auto& [column, categories] : *list)
      one_hots += static_cast<int64_t>(categories.size());
  const int64_t statics_at = file_features + 2 * static_cast<int64_t>(o.calendar.size());
  const int64_t known_at = statics_at + one_hots, K = d->steps_ahead;
  int64_t known = 0;  // a column's value, or a calendar feature's sine and cosine, per step
  for (const std::string& name : o.known_future) known += (is_calendar(o, name) ? 2 : 1) * K;
  const int64_t F = known_at + known + (mask ? file_features : 0);
  d->known_begin = known_at;
  d->known_end = known_at + known;
  const int64_t O = static_cast<int64_t>(target_names.size());
  std::vector<int64_t> present;  // targets in the file (predict needs none)
  for (int64_t j = 0; j < O; ++j)
    if (table.has_column(target_names[j])) present.push_back(j);
  const int64_t width = F + static_cast<int64_t>(present.size()) + (label_col.empty() ? 0 : 1);
  // Derived features multiply: a static category's one-hots, a known column per step ahead.
  if (const double bytes = 8.0 * double(n) * double(width);
      bytes > 0.5 * double(available_memory_bytes()))
    fail(table.path(), ": ", n, " rows of ", width, " values (", file_features, " features, ",
         2 * o.calendar.size(), " of data.calendar, ", one_hots, " one-hot of data.static, ", known,
         " of data.known_future over ", K, " steps ahead) need ", int64_t(bytes / (1 << 20)),
         " MB, more than half the ", available_memory_bytes() >> 20,
         " MB available: fewer derived features, or fewer steps ahead");
  auto values = std::make_shared<std::vector<double>>(n * width);
  for (const auto& t : target_names) d->target_transforms.push_back(transform_of(o, t));
  const bool keep_raw = std::any_of(d->target_transforms.begin(), d->target_transforms.end(),
                                    [](Transform t) { return t != Transform::none; });
  if (keep_raw) d->raw_targets.assign(n * O, NAN);
  // Column `name` into source column `j`, transformed against the row `lag` source rows before
  // (a feature: the file's previous row of the series, dropped or not; a target: the row
  // `horizon` before); `raw` receives the values as they are, every O-th.
  // Empty target cells (values not known yet) are NaN with `missing_targets`.
  auto column = [&](const std::string& name, int64_t j, Transform t, bool is_target, double* raw) {
    // predict: targets to come, and with data.known_future the future rows' other features
    const bool not_known_yet = (is_target || !o.known_future.empty()) && missing_targets;
    std::vector<double> x;
    try {
      x = table.column(name, not_known_yet || o.missing != "error");
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.ends_with("empty cell is not a number") ||
          what.ends_with("missing value, not a number"))
        fail(what, " (data.missing: ffill or interpolate fills missing cells, mask masks them)");
      throw;
    }
    if (auto note = nines_note(x, name, table);
        note && std::find(d->notes.begin(), d->notes.end(), *note) == d->notes.end())
      d->notes.push_back(*note);
    if (o.missing != "error" && !not_known_yet) {
      const int64_t empty =
          mask ? std::count_if(x.begin(), x.end(), [](double v) { return std::isnan(v); })
               : fill_missing(&x, order, o.missing, table, name);
      const std::string note = "data.missing " + o.missing + ": " + std::to_string(empty) +
                               " missing cells of '" + name + "' " + (mask ? "masked" : "filled");
      if (empty > 0 && std::find(d->notes.begin(), d->notes.end(), note) == d->notes.end())
        d->notes.push_back(note);  // once for a column that is a feature and a target
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t p = keep[k], row = order.rows[p];
      double v = x[row];
      if (raw) raw[k * O] = v;
      if (t != Transform::none && !std::isnan(v)) {
        const int64_t first = d->series_of(k).begin;
        double base = NAN;
        bool defined = true;
        if (!is_target) {
          base = p > 0 ? x[order.rows[p - 1]] : NAN;
        } else if (k - o.horizon >= first) {
          base = x[order.rows[keep[k - o.horizon]]];
        } else {
          defined = !needs_base(t);  // the series' first rows are no window's target
        }
        v = defined ? apply_transform(t, v, base) : NAN;
        if (defined && !std::isfinite(v) && (!needs_base(t) || !std::isnan(base)))
          fail(table.where(row), ": column '", name, "': data.transform ", transform_name(t),
               " is undefined for ", x[row],
               needs_base(t) ? " after " + std::to_string(base) : std::string());
      }
      (*values)[k * width + j] = v;
    }
  };
  for (int64_t j = 0; j < file_features; ++j)
    column(o.features[j], j, transform_of(o, o.features[j]), false, nullptr);
  for (int64_t k = 0; k < n; ++k)  // the calendar's, from each row's date
    for (size_t i = 0; i < o.calendar.size(); ++i) {
      const auto [sin, cos] = calendar_features(o.calendar[i], order.times[keep[k]]);
      (*values)[k * width + file_features + 2 * int64_t(i)] = sin;
      (*values)[k * width + file_features + 2 * int64_t(i) + 1] = cos;
    }
  for (int64_t k = 0, at = statics_at; k < n; ++k, at = statics_at)  // one-hot categories
    for (const auto* list : {&d->static_categories, &d->categories})
      for (const auto& [column, categories] : *list) {
        const std::string& value = table.text(column)[order.rows[keep[k]]];
        for (const std::string& category : categories)
          (*values)[k * width + at++] = value == category;
      }
  if (!order.times.empty()) {
    d->numeric_times = order.numeric_times;
    d->utc_times = order.utc_times;
    for (int64_t p : keep) {
      d->times.push_back(order.times[p]);
      const int64_t row = order.rows[p];
      d->dates.push_back(table.is_array()           ? numeric_time_text(order.times[p])
                         : !order.iso_dates.empty() ? order.iso_dates[row]
                                                    : table.text(o.date_col)[row]);
    }
  }
  // The known values at the forecasts' rows: a column's from the file (NaN past a series' end),
  // a calendar feature's from the rows' dates (past the end too, where the dates are regular).
  for (int64_t i = 0, at = known_at; i < int64_t(o.known_future.size()); ++i) {
    const std::string& name = o.known_future[i];
    const bool calendar = is_calendar(o, name);
    std::vector<double> x;
    if (!calendar) {
      x = table.column(name, missing_targets || o.missing != "error");
      if (!missing_targets && o.missing != "error" && o.missing != "mask")
        fill_missing(&x, order, o.missing, table, name);
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t end = d->series_of(k).end;
      for (int64_t a = 0; a < K; ++a) {
        const int64_t ahead = o.horizon - K + 1 + a;  // step a's forecast is for row k + ahead
        double* out = values->data() + k * width + at + (calendar ? 2 : 1) * a;
        if (!calendar) {
          *out = k + ahead < end ? x[order.rows[keep[k + ahead]]] : NAN;
        } else if (const auto when = d->time_ahead(k, ahead)) {
          std::tie(out[0], out[1]) = calendar_features(name, *when);
        } else {
          out[0] = out[1] = NAN;
        }
      }
    }
    at += (calendar ? 2 : 1) * K;
  }
  if (mask)  // 1 where a file feature is missing (its value, zero once normalised, says nothing)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < file_features; ++j)
        (*values)[k * width + F - file_features + j] =
            std::isnan((*values)[k * width + j]) ? 1.0 : 0.0;
  for (size_t i = 0; i < present.size(); ++i) {
    const int64_t j = present[i];
    column(target_names[j], F + static_cast<int64_t>(i), d->target_transforms[j], true,
           keep_raw ? d->raw_targets.data() + j : nullptr);
  }
  if (!label_col.empty()) {
    d->label_col = width - 1;
    column(label_col, d->label_col, Transform::none, false, nullptr);
  }
  d->source.dtype = DType::f64;
  d->source.rows = n;
  d->source.cols = width;
  d->source.data = reinterpret_cast<const std::byte*>(values->data());
  d->source.owner = values;
  for (int64_t j = 0; j < F; ++j) d->feature_cols.push_back(j);
  if (present.size() == target_names.size())
    for (int64_t j = 0; j < O; ++j) d->target_cols.push_back(F + j);
  d->rows = n;
  std::vector<int64_t> file_rows(n);
  for (int64_t k = 0; k < n; ++k) file_rows[k] = order.rows[keep[k]];
  return file_rows;
}

// Class ids per source row (classify; -1 where a row has none). Volatility classes need the
// training windows' median and are set by label_volatility once the split is known.
// With `lenient` (predict, eval --data), a class not seen in training or an empty cell is -1, not
// an error; unseen classes are counted in a note.
void label_rows(const DataFile& table, const SeriesOptions& o,
                const std::vector<int64_t>& file_rows, const SeriesData* stored, bool lenient,
                SeriesData* d, std::vector<double>* volatility) {
  d->classes.assign(d->rows, -1);
  if (o.label != "column") {
    d->class_names = o.label == "direction" ? std::vector<std::string>{"down", "up"}
                                            : std::vector<std::string>{"low", "high"};
    if (!d->has_targets) return;
    const int64_t col = d->label_col, h = o.horizon;
    if (o.label == "volatility") volatility->assign(d->rows, NAN);
    for (const SeriesSpan& s : d->series)
      for (int64_t r = s.begin + h; r < s.end; ++r) {
        if (o.label == "direction") {
          d->classes[r] = d->source.at(r, col) > d->source.at(r - h, col) ? 1 : 0;
          continue;
        }
        double sq = 0;  // realised volatility: the log returns over rows (r - h, r]
        for (int64_t i = r - h + 1; i <= r; ++i) {
          const double a = d->source.at(i - 1, col), b = d->source.at(i, col);
          if (!(a > 0 && b > 0))
            fail(table.where(file_rows[a > 0 ? i : i - 1]), ": column '", o.label_col,
                 "': data.label volatility needs positive values for log returns, got ",
                 a > 0 ? b : a);
          sq += std::log(b / a) * std::log(b / a);
        }
        (*volatility)[r] = std::sqrt(sq);
      }
    return;
  }
  if (stored) d->class_names = stored->class_names;
  if (!d->has_targets) return;
  const auto& names = table.text(o.class_col);
  for (int64_t row : file_rows) {  // not a class named "", nor one JSON cannot store
    if (!lenient && names[row].empty())
      fail(table.where(row), ": column '", o.class_col, "' is empty (every row needs a class)");
    decode_utf8(names[row], table.where(row) + ": column '" + o.class_col + "'");
  }
  if (!stored) {
    for (int64_t row : file_rows) d->class_names.push_back(names[row]);
    std::sort(d->class_names.begin(), d->class_names.end());
    d->class_names.erase(std::unique(d->class_names.begin(), d->class_names.end()),
                         d->class_names.end());
  }
  std::map<std::string, int64_t> unseen;  // class name -> rows
  for (int64_t r = 0; r < d->rows; ++r) {
    const auto& name = names[file_rows[r]];
    const auto it = std::lower_bound(d->class_names.begin(), d->class_names.end(), name);
    if (it != d->class_names.end() && *it == name) {
      d->classes[r] = it - d->class_names.begin();
    } else if (!lenient) {
      fail(table.where(file_rows[r]), ": class '", name, "' was not seen in training");
    } else if (!name.empty()) {
      ++unseen[name];
    }
  }
  for (const auto& [name, rows] : unseen)
    d->notes.push_back(std::to_string(rows) + (rows == 1 ? " row has" : " rows have") + " class '" +
                       name + "' in column '" + o.class_col +
                       "', which the model was not trained on: no actual class for " +
                       (rows == 1 ? "it" : "them"));
}

// Leaves out the windows of `list` whose truth the file does not hold (an empty target cell, a
// class the model was not trained on); returns how many.
size_t keep_windows_with_truth(SeriesData* d, std::vector<int64_t>* list) {
  std::vector<float> targets(static_cast<size_t>(d->output_rows() * d->num_outputs()));
  auto has_truth = [&](int64_t start) {
    if (d->task == TaskKind::classify) return d->classes[d->target_row(start)] >= 0;
    d->copy_target(start, targets.data());
    return std::all_of(targets.begin(), targets.end(), [](float y) { return std::isfinite(y); });
  };
  const size_t before = list->size();
  list->erase(std::remove_if(list->begin(), list->end(), [&](int64_t s) { return !has_truth(s); }),
              list->end());
  return before - list->size();
}

// Volatility classes: high above the threshold (the training windows' median, or the stored one).
void label_volatility(const std::vector<double>& volatility, const SeriesData* stored,
                      SeriesData* d) {
  if (volatility.empty()) return;
  if (stored) {
    d->label_threshold = stored->label_threshold;
  } else {
    std::vector<double> v;
    for (int64_t s : d->split.train) v.push_back(volatility[d->target_row(s)]);
    if (v.empty()) return;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    d->label_threshold = v[v.size() / 2];
  }
  for (int64_t r = 0; r < d->rows; ++r)
    if (!std::isnan(volatility[r])) d->classes[r] = volatility[r] > d->label_threshold ? 1 : 0;
}

// data.static: each column's value per series (one per series: checked) and the categories (the
// file's, sorted; with `stored`, the model's, where an unknown one is an error naming the series).
void static_categories(const DataFile& table, const DataOptions& opt, const RowOrder& order,
                       const SeriesData* stored, SeriesData* d) {
  const SeriesOptions& o = opt.series;
  if (!o.statics.empty() && table.is_array())
    fail(opt.source, ": data.static: ", opt.path, " is an array; static categories are a CSV's");
  if (stored && stored->static_categories.size() != o.statics.size())
    fail(opt.source, ": data.static names ", o.statics.size(),
         " columns; the model was trained on ", stored->static_categories.size());
  for (size_t i = 0; i < o.statics.size(); ++i) {
    const std::string& column = o.statics[i];
    if (stored && stored->static_categories[i].first != column)
      fail(opt.source, ": data.static names '", column, "' where the model was trained on '",
           stored->static_categories[i].first, "'");
    if (!table.has_column(column))
      fail(opt.source, ": data.static: ", opt.path, " has no column '", column, "'",
           table.columns_hint());
    const std::vector<std::string>& text = table.text(column);
    std::vector<std::string> values;  // per series
    for (const SeriesSpan& s : order.spans) {
      const int64_t first = order.rows[s.begin];
      if (text[first].empty())
        fail(table.where(first), ": column '", column, "' (data.static) is empty");
      for (int64_t p = s.begin + 1; p < s.end; ++p)
        if (text[order.rows[p]] != text[first])
          fail(table.where(order.rows[p]), ": column '", column, "' (data.static) is '",
               text[order.rows[p]], "' where ", table.where(first), " of the same series has '",
               text[first], "': a static column holds one value per series");
      values.push_back(text[first]);
    }
    std::vector<std::string> categories = values;
    if (stored) {
      categories = stored->static_categories[i].second;
      for (size_t k = 0; k < values.size(); ++k)
        if (!std::binary_search(categories.begin(), categories.end(), values[k]))
          fail(opt.path, ": ",
               order.spans[k].name.empty() ? "the series"
                                           : "series " + io::quoted(order.spans[k].name),
               " has ", column, " '", values[k],
               "', which the model was not trained on (data.static)");
    } else {
      std::sort(categories.begin(), categories.end());
      categories.erase(std::unique(categories.begin(), categories.end()), categories.end());
    }
    d->static_categories.emplace_back(column, std::move(categories));
  }
}

// data.categorical: each column's categories (the training file's, sorted; a stored model's at
// inference, where a category it was not trained on is all 0 with a note).
void categorical_columns(const DataFile& table, const DataOptions& opt, const SeriesData* stored,
                         SeriesData* d) {
  const SeriesOptions& o = opt.series;
  constexpr size_t kMaxCategories = 256;
  if (!o.categorical.empty() && table.is_array())
    fail(opt.source, ": data.categorical: ", opt.path,
         " is an array; categorical columns are a CSV's");
  if (stored && stored->categories.size() != o.categorical.size())
    fail(opt.source, ": data.categorical names ", o.categorical.size(),
         " columns; the model was trained on ", stored->categories.size());
  for (size_t i = 0; i < o.categorical.size(); ++i) {
    const std::string& column = o.categorical[i];
    if (stored && stored->categories[i].first != column)
      fail(opt.source, ": data.categorical names '", column, "' where the model was trained on '",
           stored->categories[i].first, "'");
    if (!table.has_column(column))
      fail(opt.source, ": data.categorical: ", opt.path, " has no column '", column, "'",
           table.columns_hint());
    for (const std::string* other : {&o.date_col, &o.series_col, &o.class_col})
      if (column == *other)
        fail(opt.source, ": data.categorical: '", column,
             "' is the date, series or class column, which cannot be a feature");
    using Names = const std::vector<std::string>*;
    for (Names names : {Names{&d->feature_names}, Names{&o.targets}, Names{&o.statics}})
      if (std::find(names->begin(), names->end(), column) != names->end())
        fail(opt.source, ": data.categorical: '", column,
             "' is also a feature, a target or a static column (data.features, data.targets, "
             "data.static): a column is one of them");
    const std::vector<std::string>& text = table.text(column);
    if (stored) {
      const std::vector<std::string>& known = stored->categories[i].second;
      std::map<std::string, int64_t> unseen;
      for (const std::string& v : text)
        if (!io::is_missing_cell(v) && !std::binary_search(known.begin(), known.end(), v))
          ++unseen[v];
      for (const auto& [value, rows] : unseen)
        d->notes.push_back(std::to_string(rows) + (rows == 1 ? " row has " : " rows have ") +
                           column + " '" + value +
                           "', which the model was not trained on (data.categorical): all its "
                           "one-hot features 0");
      d->categories.emplace_back(column, known);
      continue;
    }
    std::vector<std::string> categories;
    for (const std::string& v : text)
      if (!io::is_missing_cell(v)) categories.push_back(v);
    std::sort(categories.begin(), categories.end());
    categories.erase(std::unique(categories.begin(), categories.end()), categories.end());
    if (categories.empty())
      fail(opt.path, ": column '", column,
           "' (data.categorical) holds no category: every cell is empty");
    if (categories.size() > kMaxCategories)
      fail(opt.path, ": column '", column, "' (data.categorical) holds ", categories.size(),
           " categories, more than the ", kMaxCategories,
           " that one-hot features take (an identifier, or free text?)");
    d->categories.emplace_back(column, std::move(categories));
  }
}

// Names the series of a file of several that give no window at all: too short for one.
void note_windowless_series(const DataOptions& opt, bool targets, SeriesData* d) {
  if (d->series.size() < 2) return;
  std::vector<char> starts(d->rows, 0);
  for (const auto* list : {&d->split.train, &d->split.val, &d->split.test})
    for (int64_t start : *list) starts[start] = 1;
  std::vector<std::string> names;
  for (const SeriesSpan& s : d->series) {
    if (std::find(starts.begin() + s.begin, starts.begin() + s.end, 1) == starts.begin() + s.end)
      names.push_back(io::quoted(s.name) + " (" + std::to_string(s.end - s.begin) + " rows)");
  }
  if (names.empty()) return;
  const int64_t span = (targets ? d->target_row(0) : d->last_row(0)) + 1;
  const bool one = names.size() == 1;
  std::ostringstream note;
  note << names.size() << " of " << d->series.size() << " series in " << opt.path << " ("
       << opt.series.series_col << ") " << (one ? "is" : "are") << " shorter than one window ("
       << span << " rows: data.lookback " << d->lookback;
  if (span > d->lookback) note << " + data.horizon " << span - d->lookback;
  note << ") and " << (one ? "gives" : "give") << " none: ";
  for (size_t i = 0; i < names.size() && i < 5; ++i) note << (i ? ", " : "") << names[i];
  if (names.size() > 5) note << " and " << names.size() - 5 << " more";
  d->notes.push_back(note.str());
}

// The windows of each series: the splits, or every window of the file.
void list_windows(const DataOptions& opt, WindowSet which, SeriesData* d) {
  const SeriesOptions& o = opt.series;
  if (which != WindowSet::splits) {
    for (const SeriesSpan& s : d->series)
      add_windows(*d, s.begin, s.end, 1, which == WindowSet::with_targets, &d->split.test);
    note_windowless_series(opt, which == WindowSet::with_targets, d);
    return;
  }
  if (opt.split.mode == "random") {
    std::vector<int64_t> all;
    for (const SeriesSpan& s : d->series) add_windows(*d, s.begin, s.end, o.stride, true, &all);
    random_split(opt.split, all, &d->split);
    note_windowless_series(opt, true, d);
    return;
  }
  const auto points = split_points(opt.split, *d);
  // With history context, a validation or test window may start in the parts before its own:
  // its first target is the part's first row that has a full window behind it in the series.
  const bool history = opt.split.context == "history" && d->task != TaskKind::mae;
  auto first_start = [&](const SeriesSpan& s, int64_t part_begin) {
    if (!history) return part_begin;
    return std::max(s.begin, part_begin - d->target_row(0, 0));
  };
  for (size_t i = 0; i < d->series.size(); ++i) {
    const SeriesSpan& s = d->series[i];
    const auto [a, b] = points[i];
    add_windows(*d, s.begin, a, o.stride, true, &d->split.train);
    add_windows(*d, first_start(s, a), b, o.stride, true, &d->split.val);
    add_windows(*d, first_start(s, b), s.end, o.stride, true, &d->split.test);
  }
  for (auto* v : {&d->split.train, &d->split.val, &d->split.test}) std::sort(v->begin(), v->end());
  note_windowless_series(opt, true, d);
  if (opt.split.by == "date" && !d->times.empty()) {
    std::vector<int64_t> pooled = d->times;
    std::sort(pooled.begin(), pooled.end());
    const auto [a, b] = boundaries(opt.split, static_cast<int64_t>(pooled.size()));
    const int64_t n = static_cast<int64_t>(pooled.size());
    d->notes.push_back("split by date: validation from " +
                       (a < n ? d->time_text(pooled[a], true) : std::string("(none)")) +
                       ", test from " +
                       (b < n ? d->time_text(pooled[b], true) : std::string("(none)")));
  }
}

// Normalisation from the rows the training windows cover (inputs and targets), and no others.
void fit_normalizers(const SeriesOptions& o, SeriesData* d) {
  std::vector<char> used(d->rows, 0);
  for (int64_t s : d->split.train)
    for (int64_t r = s; r <= std::max(d->target_row(s), d->last_row(s)); ++r) used[r] = 1;
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < d->rows; ++r)
    if (used[r]) rows.push_back(r);
  d->feature_norm.fit(o.normalize, d->source, d->feature_cols, rows);
  const bool per_step = d->task == TaskKind::forecast && d->steps_ahead > 1;
  // A direct forecast's targets per step ahead over the given training windows, (windows,
  // steps * targets), for a scaler per step.
  auto fit_steps = [&](Normalizer* norm, const std::vector<int64_t>& windows) {
    const int64_t O = d->num_targets();
    norm->fit_values(o.normalize, size_t(d->steps_ahead * O), [&](const auto& add) {
      for (int64_t w : windows)
        for (int64_t k = 0; k < d->steps_ahead; ++k)
          for (int64_t j = 0; j < O; ++j) add(size_t(k * O + j), d->step_target(w, k, j));
    });
    norm->steps = d->steps_ahead;
  };
  if (per_step)
    fit_steps(&d->target_norm, d->split.train);
  else if (d->task == TaskKind::forecast)
    d->target_norm.fit(o.normalize, d->source, d->target_cols, rows);
  if (o.normalize_per != "series") return;
  for (const SeriesSpan& s : d->series) {  // each series' own training rows
    std::vector<int64_t> own;
    for (int64_t r = s.begin; r < s.end; ++r)
      if (used[r]) own.push_back(r);
    if (own.empty()) continue;  // no training window: the pooled scaler serves it
    for (Normalizer* norm : {&d->feature_norm, &d->target_norm}) {
      if (norm == &d->target_norm && d->task != TaskKind::forecast) continue;
      Normalizer one;
      if (norm == &d->target_norm && per_step) {
        std::vector<int64_t> windows;
        for (int64_t w : d->split.train)
          if (w >= s.begin && w < s.end) windows.push_back(w);
        fit_steps(&one, windows);
      } else {
        one.fit(o.normalize, d->source, norm == &d->feature_norm ? d->feature_cols : d->target_cols,
                own);
      }
      norm->series.push_back(s.name);
      norm->series_shift.push_back(one.shift);
      norm->series_scale.push_back(one.scale);
    }
  }
}

// Which scaler each series takes: its own, or (a series without one) the pooled one, if
// data.normalize_fallback allows (said once), else an error naming it.
void assign_scalers(const DataOptions& opt, bool stored, SeriesData* d) {
  const Normalizer& norm = d->feature_norm;
  d->series_scaler.assign(d->series.size(), -1);
  if (norm.series.empty()) return;  // one scaler for all
  std::vector<std::string> pooled;
  for (size_t i = 0; i < d->series.size(); ++i) {
    const std::string& name = d->series[i].name;
    d->series_scaler[i] = norm.series_index(name);
    if (d->series_scaler[i] >= 0) continue;
    if (opt.series.normalize_fallback != "pooled")
      fail(opt.path, ": series ", io::quoted(name),
           stored ? " was not in the training data" : " has no training window",
           ", so data.normalize_per series has no scaler for it; set data.normalize_fallback: "
           "pooled to scale it by all series' training rows");
    pooled.push_back(io::quoted(name));
  }
  if (pooled.empty()) return;
  std::string names;
  for (size_t i = 0; i < pooled.size() && i < 5; ++i) names += (i ? ", " : "") + pooled[i];
  d->notes.push_back(std::to_string(pooled.size()) + " series (" + names +
                     (pooled.size() > 5 ? ", ..." : "") +
                     ") without a scaler of their own: scaled by all series' training rows "
                     "(data.normalize_fallback: pooled)");
}

// Every feature and target as the model sees it, scaled, is a float32: a value beyond its range
// (data.normalize none on 1e39) is named here rather than met as an infinite loss.
void check_float_range(const DataFile& table, const std::vector<int64_t>& file_rows,
                       const SeriesData& d) {
  const bool targets = d.task == TaskKind::forecast && d.target_norm.steps == 1 &&
                       d.target_norm.shift.size() == d.target_cols.size();
  for (int64_t r = 0; r < d.rows; ++r) {
    const int64_t scaler = d.scaler_of(r);
    const auto check = [&](const Normalizer& norm, const std::vector<int64_t>& cols,
                           const std::vector<std::string>& names) {
      const double *shift = norm.shifts(scaler), *scale = norm.scales(scaler);
      for (size_t j = 0; j < cols.size(); ++j) {
        const double x = d.source.at(r, cols[j]);
        if (std::fabs((x - shift[j]) / scale[j]) <= std::numeric_limits<float>::max() ||
            std::isnan(x))
          continue;
        fail(table.where(file_rows[r]), ": column ", io::quoted(names[j]), ": ", x,
             " is beyond float32's range (the model computes in float32)",
             norm.kind == "none" ? "; scale it, or set data.normalize: zscore" : "");
      }
    };
    check(d.feature_norm, d.feature_cols, d.feature_names);
    if (targets) check(d.target_norm, d.target_cols, d.target_names);
  }
}

// A fixed random subset of the training windows (data.label_fraction), kept in order.
void keep_labeled_fraction(const DataOptions& opt, SeriesData* d) {
  const double fraction = opt.series.label_fraction;
  if (fraction == 1) return;
  Rng rng(opt.split.seed ^ 0x1abe1ull);
  std::vector<int64_t> pick(d->split.train.size());
  std::iota(pick.begin(), pick.end(), 0);
  for (int64_t i = static_cast<int64_t>(pick.size()) - 1; i > 0; --i)
    std::swap(pick[i], pick[rng.next() % (i + 1)]);
  pick.resize(std::max<size_t>(1, static_cast<size_t>(std::ceil(fraction * pick.size()))));
  std::sort(pick.begin(), pick.end());
  std::vector<int64_t> kept;
  for (int64_t i : pick) kept.push_back(d->split.train[i]);
  d->split.train = std::move(kept);
}

}  // namespace

SeriesData load_series(const DataOptions& given, const SeriesData* stored, WindowSet which) {
  DataOptions opt = given;  // with pandas' index of dates as the date column where none is named
  const SeriesOptions& o = opt.series;
  if (opt.task == TaskKind::charlm || opt.task == TaskKind::lm)
    fail(opt.source, ": data.task: '", task_name(opt.task),
         "' is not a time-series task (forecast, classify, mae)");
  SeriesData d;
  d.task = opt.task;
  d.lookback = o.lookback;
  d.horizon = o.horizon;
  if (opt.task == TaskKind::forecast && o.horizon_mode == "direct") d.steps_ahead = o.horizon;
  if (opt.task == TaskKind::forecast) d.quantiles = o.quantiles;
  d.every_step = o.every_step;
  d.masks_missing = o.missing == "mask";
  d.holidays = o.holidays;
  d.season = o.season;
  const DataFile table(opt.path, o.missing_values);
  std::vector<std::string> file_notes;
  if (const std::string index = io::CsvTable::kIndexColumn; table.has_column(index)) {
    const std::string what = opt.path + ": column 1 has no name, as pandas writes a frame's index";
    if (o.date_col.empty() && is_date_cell(table.text(index)[0])) {
      opt.series.date_col = index;
      file_notes.push_back(what + ", and holds dates: they order the rows (data.date_column '" +
                           index + "')");
    } else if (o.features.empty() && !stored && o.date_col != index) {
      file_notes.push_back(what + ": not a feature (data.features: ['" + index +
                           "', ...] makes it one)");
    }
  }
  auto require = [&](const char* key, const std::string& col) {
    if (!col.empty() && !table.has_column(col))
      fail(opt.source, ": ", key, ": ", opt.path, " has no column '", col, "'",
           table.columns_hint());
  };
  require("data.date_column", o.date_col);
  require("data.series_column", o.series_col);
  d.feature_names = o.features;
  // A stored model's features by name: a file with more columns, or in another order, feeds the
  // model the columns it was trained on.
  if (d.feature_names.empty() && stored) {
    // The file's: the calendar's, the statics', the known values ahead and the missing
    // indicators (one per file feature) are derived.
    d.feature_names = stored->feature_names;
    size_t derived = 2 * o.calendar.size();
    for (const std::string& name : o.known_future)
      derived += (is_calendar(o, name) ? 2 : 1) * d.steps_ahead;
    for (const auto* list : {&stored->static_categories, &stored->categories})
      for (const auto& [column, categories] : *list) derived += categories.size();
    size_t file = d.feature_names.size() - std::min(d.feature_names.size(), derived);
    if (o.missing == "mask") file /= 2;
    d.feature_names.resize(file);
  }
  if (d.feature_names.empty())
    for (const auto& col : table.columns())
      if (col != o.date_col && col != o.class_col && col != o.series_col &&
          col != io::CsvTable::kIndexColumn &&
          std::find(o.statics.begin(), o.statics.end(), col) == o.statics.end() &&
          std::find(o.categorical.begin(), o.categorical.end(), col) == o.categorical.end())
        d.feature_names.push_back(col);
  std::vector<std::string> named = d.feature_names;  // kept in a checkpoint's JSON
  named.insert(named.end(), o.targets.begin(), o.targets.end());
  for (const auto& name : named) decode_utf8(name, opt.path + ": column name '" + name + "'");
  for (const auto& name : d.feature_names)
    if (!table.has_column(name))
      fail(opt.source, ": data.features: ", opt.path, " has no column '", name, "'",
           stored && o.features.empty() ? ", a feature of the trained model" : "",
           table.columns_hint());
  if (!table.is_array() && table.rows() > 0)
    for (const std::string& name : named) {
      if (!table.has_column(name)) continue;
      const std::string& cell = table.text(name)[0];
      if (o.date_col.empty() && is_date_cell(cell))
        fail(table.where(0), ": column '", name, "' holds dates ('", cell,
             "'): name it in data.date_column, which orders the rows (dates are no feature)");
      const bool defaulted_feature =
          o.features.empty() && !stored &&
          std::find(o.targets.begin(), o.targets.end(), name) == o.targets.end();
      if (defaulted_feature && !io::is_missing_cell(cell) && !io::parse_finite(cell)) {
        try {
          table.column(name, true);  // the first cell may be one of data.missing_values
        } catch (const Error& e) {
          fail(e.what(),
               " (without data.features, every column but the date, series and class "
               "columns is a feature: list the features in data.features, or make a text "
               "column one-hot features with data.categorical)");
        }
      }
    }
  if (!o.date_col.empty())  // the times order the rows, nothing more
    for (const auto& [key, columns] :
         {std::pair<const char*, const std::vector<std::string>*>{"feature", &d.feature_names},
          std::pair<const char*, const std::vector<std::string>*>{"target", &o.targets}})
      if (std::find(columns->begin(), columns->end(), o.date_col) != columns->end())
        fail(opt.source, ": data.", key, "s: '", o.date_col,
             "' is data.date_column, which orders the rows and cannot be a ", key);
  if (!o.series_col.empty()) {  // the series' names say which series a row is of, nothing more
    using Columns = const std::vector<std::string>*;
    for (const auto& [key, columns] : {std::pair<const char*, Columns>{"feature", &d.feature_names},
                                       std::pair<const char*, Columns>{"target", &o.targets}})
      if (std::find(columns->begin(), columns->end(), o.series_col) != columns->end())
        fail(opt.source, ": data.", key, "s: '", o.series_col,
             "' is data.series_column, which names the series and cannot be a ", key);
    const auto& names = table.text(o.series_col);
    for (int64_t r = 0; r < table.rows(); ++r)
      if (names[r].empty())
        fail(table.where(r), ": column '", o.series_col,
             "' (data.series_column) is empty: every row needs its series' name");
  }
  for (const auto& [column, t] : o.transforms)
    if (std::find(d.feature_names.begin(), d.feature_names.end(), column) ==
            d.feature_names.end() &&
        std::find(o.targets.begin(), o.targets.end(), column) == o.targets.end())
      fail(opt.source, ": data.transform: '", column, "' is neither a feature nor a target");
  for (const std::string& column : o.known_future) {
    if (is_calendar(o, column)) continue;  // from the dates
    const bool cycle = column == "hour" || column == "dayofweek" || column == "dayofmonth" ||
                       column == "dayofyear" || column == "month";
    if (!table.has_column(column) && cycle)
      fail(opt.source, ": data.known_future: '", column, "' is a calendar feature only when ",
           "data.calendar lists it too (data.calendar: [", column, "])");
    if (!table.has_column(column))
      fail(opt.source, ": data.known_future: ", opt.path, " has no column '", column, "'",
           table.columns_hint());
    if (std::find(o.targets.begin(), o.targets.end(), column) != o.targets.end())
      fail(opt.source, ": data.known_future: '", column,
           "' is a target: its future values are what the model forecasts");
  }
  // The truth: target columns, the class column or the label's column. Predict needs none.
  std::vector<std::string> truth = o.targets;
  if (opt.task == TaskKind::classify) truth = {o.label == "column" ? o.class_col : o.label_col};
  for (const auto& name : truth) {
    if (which == WindowSet::every_window && !table.has_column(name)) {
      d.has_targets = false;
      continue;
    }
    require(opt.task == TaskKind::forecast ? "data.targets"
            : o.label == "column"          ? "data.class_column"
                                           : "data.label_column",
            name);
  }
  if (opt.task == TaskKind::forecast) d.target_names = o.targets;
  SeriesOptions built = o;
  built.features = d.feature_names;
  if (!d.has_targets &&
      opt.task == TaskKind::forecast)  // predictions are inverted against the last input
    for (const auto& name : o.targets)
      if (needs_base(transform_of(o, name)) && !table.has_column(name))
        fail(opt.path, ": has no column '", name,
             "', which predictions need to undo data.transform ",
             transform_name(transform_of(o, name)), " of the target");
  const RowOrder order = order_rows(table, built, opt.path);
  static_categories(table, opt, order, stored, &d);
  d.layout = "date " + o.date_col + "; series " + o.series_col + "; transforms";
  for (const auto& [column, t] : o.transforms) d.layout += " " + column + ":" + transform_name(t);
  d.notes = order.notes;
  if (auto note = table.separator_note(named)) file_notes.insert(file_notes.begin(), *note);
  d.notes.insert(d.notes.begin(), file_notes.begin(), file_notes.end());
  categorical_columns(table, opt, stored, &d);
  const std::string label_col =
      opt.task == TaskKind::classify && o.label != "column" && d.has_targets ? o.label_col : "";
  const std::vector<int64_t> file_rows =
      build_source(table, built, order, d.target_names, label_col, which != WindowSet::splits, &d);
  const size_t file_features = d.feature_names.size();
  for (const std::string& name : o.calendar)
    for (const char* part : {"_sin", "_cos"}) d.feature_names.push_back(name + part);
  for (const auto* list : {&d.static_categories, &d.categories})
    for (const auto& [column, categories] : *list)
      for (const std::string& category : categories)
        d.feature_names.push_back(column + "=" + category);
  for (const std::string& name : o.known_future)
    for (int64_t a = 0; a < d.steps_ahead; ++a) {
      const std::string ahead = "+" + std::to_string(o.horizon - d.steps_ahead + 1 + a);
      if (is_calendar(o, name)) {
        d.feature_names.push_back(name + "_sin" + ahead);
        d.feature_names.push_back(name + "_cos" + ahead);
      } else {
        d.feature_names.push_back(name + ahead);
      }
    }
  if (o.missing == "mask")
    for (size_t j = 0; j < file_features; ++j)
      d.feature_names.push_back(d.feature_names[j] + "_missing");
  bool identity = true;
  for (size_t r = 0; r < file_rows.size() && identity; ++r) identity = file_rows[r] == int64_t(r);
  if (!identity) d.file_rows = file_rows;
  std::vector<double> volatility;
  if (opt.task == TaskKind::classify)
    label_rows(table, o, file_rows, stored, which != WindowSet::splits, &d, &volatility);
  list_windows(opt, which, &d);
  if (stored) {
    d.feature_norm = stored->feature_norm;
    d.target_norm = stored->target_norm;
    const size_t targets = opt.task == TaskKind::forecast ? d.target_cols.size() : 0;
    const int64_t steps = d.steps_ahead > 1 ? d.steps_ahead : 1;
    if (targets && d.target_norm.steps != steps)
      fail(opt.path, ": the model's target scalers are for ", d.target_norm.steps,
           " steps ahead, its config says ", steps);
    if (d.feature_norm.shift.size() != d.feature_cols.size() ||
        (targets && d.target_norm.shift.size() != targets * steps))
      fail(opt.path, ": ", d.feature_cols.size(), " features and ", targets,
           " targets, where the model was trained on ", d.feature_norm.shift.size(), " and ",
           d.target_norm.shift.size());
  } else {
    fit_normalizers(o, &d);
  }
  assign_scalers(opt, stored != nullptr, &d);
  check_float_range(table, file_rows, d);
  label_volatility(volatility, stored, &d);
  if (which == WindowSet::with_targets) {
    const size_t all = d.split.test.size(), left_out = keep_windows_with_truth(&d, &d.split.test);
    if (left_out > 0)
      d.notes.push_back(std::to_string(left_out) + " of " + std::to_string(all) +
                        " windows are left out: the file holds no target for them (an empty "
                        "cell, or a class the model was not trained on)");
  }
  if (which != WindowSet::splits && !o.known_future.empty()) {
    // Only windows whose known values ahead the file holds, and (unless masked) their inputs.
    const size_t all = d.split.test.size();
    std::erase_if(d.split.test, [&](int64_t start) {
      for (int64_t r = start; r <= d.last_row(start); ++r)
        for (int64_t f = 0; f < d.num_features(); ++f)
          if (!std::isfinite(d.source.at(r, d.feature_cols[f])) &&
              (!d.masks_missing || (f >= d.known_begin && f < d.known_end)))
            return true;
      return false;
    });
    if (d.split.test.size() < all)
      d.notes.push_back(std::to_string(all - d.split.test.size()) + " of " + std::to_string(all) +
                        " windows are left out: the file lacks their inputs or their "
                        "data.known_future values at the rows they forecast (add the future "
                        "rows at each series' end, the known columns filled)");
  }
  if (which == WindowSet::splits && d.masks_missing) {  // no loss on a missing target
    size_t left_out = 0;
    for (auto* list : {&d.split.train, &d.split.val, &d.split.test})
      left_out += keep_windows_with_truth(&d, list);
    if (left_out > 0)
      d.notes.push_back("data.missing mask: " + std::to_string(left_out) +
                        " windows whose target is missing are left out of training and "
                        "evaluation");
  }
  if (which != WindowSet::splits) return d;
  if (!stored) keep_labeled_fraction(opt, &d);
  if (d.split.train.empty()) {
    // A classifier of whole series (one example each: digits read row by row, say) has its
    // class on every row: horizon 0 takes the class at the window's last row.
    const bool whole_series =
        d.task == TaskKind::classify && d.horizon > 0 &&
        std::all_of(d.series.begin(), d.series.end(), [&](const auto& s) {
          return s.end - s.begin <= d.lookback + d.horizon - 1 && s.end - s.begin >= d.lookback;
        });
    fail(opt.path, ": ", d.rows,
         " rows give no training window: the training split is shorter "
         "than data.lookback + data.horizon = ",
         d.lookback + d.horizon, d.series.size() > 1 ? " in every series" : "",
         whole_series ? "; when each series is one example, set data.horizon: 0 (the class at "
                        "its window's last row)"
                      : "",
         whole_series && opt.split.mode == "time"
             ? " and data.split.mode: random (whole examples dealt to the splits)"
             : "");
  }
  if (d.task == TaskKind::classify) {
    std::vector<int64_t> train_classes;
    for (int64_t start : d.split.train) train_classes.push_back(d.classes[d.target_row(start)]);
    if (std::string note = untrained_classes_note(d.class_names, train_classes, "window");
        !note.empty())
      d.notes.push_back(std::move(note));
  }
  return d;
}

const char* task_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::forecast:
      return "forecast";
    case TaskKind::classify:
      return "classify";
    case TaskKind::mae:
      return "mae";
    case TaskKind::charlm:
      return "charlm";
    case TaskKind::text_classify:
      return "text_classify";
    case TaskKind::lm:
      return "lm";
  }
  return "?";
}

TaskKind parse_task(const std::string& name, const std::string& source) {
  for (TaskKind k : {TaskKind::forecast, TaskKind::classify, TaskKind::mae, TaskKind::charlm,
                     TaskKind::text_classify, TaskKind::lm})
    if (name == task_name(k)) return k;
  fail(source, ": data.task: unknown task '", name,
       "' (expected forecast, classify, mae, charlm, lm or text_classify)");
}

Dataset load_dataset(const DataOptions& opt, const Dataset* from, WindowSet windows) {
  Dataset d;
  d.path = opt.path;
  d.kind = opt.task;
  if (d.kind == TaskKind::charlm) {
    d.text = load_text(opt, from ? from->text.vocab : std::u32string());
  } else if (d.kind == TaskKind::lm) {
    d.text = load_tokens(opt, from ? &from->text : nullptr);
  } else if (d.kind == TaskKind::text_classify) {
    d.text = load_text_examples(opt, from ? &from->text : nullptr, windows);
    if (windows != WindowSet::splits) {  // every example of the file, evaluated or predicted
      Split& s = d.text.split;
      s.test.clear();
      for (int64_t i = 0; i < d.text.examples(); ++i)
        if (windows == WindowSet::every_window || d.text.classes[i] >= 0) s.test.push_back(i);
      s.train.clear();
      s.val.clear();
    }
  } else {
    d.series = load_series(opt, from ? &from->series : nullptr, windows);
    d.mask_ratio = opt.mask_ratio;
  }
  if (!io::MemoryNpy::is_registered(d.path)) d.stamp = io::stamp_of(d.path);
  return d;
}

}  // namespace seqforge
