#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/calendar.hpp"
#include "data/series_stages.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/data/datasets.hpp"
#include "seqforge/io/dates.hpp"

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

const SeriesSpan& SeriesData::series_of(int64_t row) const {
  SF_CHECK(!series.empty() && row >= 0 && row < rows, "row ", row, " of ", rows);
  const auto it = std::upper_bound(series.begin(), series.end(), row,
                                   [](int64_t r, const SeriesSpan& s) { return r < s.begin; });
  return *(it - 1);
}

int64_t SeriesData::last_observed_row(const SeriesSpan& s) const {
  // The file's features that are data.known_future columns too ("<column>+n" ahead).
  std::vector<char> known(size_t(file_features), 0);
  for (int64_t k = known_begin; k < known_end; ++k) {
    const std::string& ahead = feature_names[size_t(k)];
    const std::string column = ahead.substr(0, ahead.rfind('+'));
    for (int64_t j = 0; j < file_features; ++j)
      if (feature_names[size_t(j)] == column) known[size_t(j)] = 1;
  }
  const auto observed = [&](int64_t r) {
    for (int64_t col : target_cols)
      if (std::isfinite(source.at(r, col))) return true;
    if (masks_missing) {
      for (int64_t j = 0; j < file_features; ++j)
        if (!known[size_t(j)] && std::isfinite(source.at(r, feature_cols[size_t(j)]))) return true;
      return false;
    }
    for (int64_t j = 0; j < known_begin; ++j)
      if (!std::isfinite(source.at(r, feature_cols[size_t(j)]))) return false;
    return true;
  };
  int64_t end = s.end - 1;
  while (end >= s.begin && !observed(end)) --end;
  return end;
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
  if (task == TaskKind::mae) return file_features;
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

bool SeriesData::row_complete(int64_t row) const {
  return std::all_of(feature_cols.begin(), feature_cols.end(),
                     [&](int64_t col) { return std::isfinite(source.at(row, col)); });
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
  return series::needs_base(t)
             ? apply_transform(t, raw_targets[row * O + j], raw_targets[last_row(start) * O + j])
             : source.at(row, target_cols[j]);
}

std::optional<int64_t> SeriesData::time_ahead(int64_t row, int64_t ahead) const {
  if (times.empty()) return std::nullopt;
  const SeriesSpan& s = series_of(row);
  if (row + ahead < s.end) return times[row + ahead];
  if (!s.regular || s.step <= 0) return std::nullopt;
  const int64_t last = s.end - 1, n = row + ahead - last;  // steps past the series' last row
  if (s.business_days) return BusinessCalendar(holidays).add(times[last], n);
  if (s.months > 0) return io::add_months(times[last], n * s.months, s.month_end);
  if (s.exact_step > 0) return times[last] + std::llround(double(n) * s.exact_step);
  return times[last] + n * s.step;
}

std::string SeriesData::time_text(int64_t when, const std::string& like) const {
  if (numeric_times) return series::numeric_time_text(when, numeric_decimals);
  return series::date_in_style_of(
      like, series::date_time_text(when, like.size() <= 10, utc_times, subsecond_times));
}

int64_t SeriesData::scaler_of(int64_t row) const {
  if (series_scaler.empty()) return -1;
  return series_scaler[static_cast<size_t>(&series_of(row) - series.data())];
}

namespace series {

std::string format_duration(int64_t ticks, int64_t per_second) {
  const std::pair<int64_t, const char*> units[] = {
      {86400 * per_second, "day"}, {3600 * per_second, "hour"},        {60 * per_second, "minute"},
      {per_second, "second"},      {per_second / 1000, "millisecond"}, {1, "microsecond"}};
  for (const auto& [size, name] : units)
    if (size >= 1 && (ticks % size == 0 || size == 1)) {
      const int64_t n = ticks / size;
      return std::to_string(n) + " " + name + (n == 1 ? "" : "s");
    }
  return std::to_string(ticks) + " seconds";
}

// date_in_style_of without a mark of UTC: a space before the time, no seconds, a fraction of
// zeros ("12:00:00.000"); so that a column of dates holds one format (pandas 2 reads a column in
// its first cell's format).
static std::string in_style_of(const std::string& like, std::string text) {
  const bool minutes = like.size() == 16, seconds = like.size() == 19;
  const bool fraction = like.size() > 20 && like[19] == '.' &&
                        like.find_first_not_of("0123456789", 20) == std::string::npos;
  const bool zeros = fraction && like.find_first_not_of('0', 20) == std::string::npos;
  const bool text_fraction = text.size() > 20 && text[19] == '.' &&
                             text.find_first_not_of("0123456789", 20) == std::string::npos;
  if (!(text.size() == 19 || text_fraction) || text[10] != 'T' ||
      !(minutes || seconds || fraction) || like[4] != '-' || like[7] != '-' || like[13] != ':' ||
      (like[10] != ' ' && like[10] != 'T'))
    return text;
  text[10] = like[10];
  if (text.size() == 19 && minutes && text.ends_with(":00")) text.resize(16);
  if (text.size() == 19 && zeros) text += like.substr(19);
  if (text_fraction && fraction && like.size() - 20 == 6 && text.size() - 20 == 3)
    text += "000";  // the file's six digits
  return text;
}

// The same, where `like` ends in a mark of UTC ("Z", "+00:00", PostgreSQL's "+00", " UTC"): the
// date made here, in UTC as the file's are, gets the same mark.
std::string date_in_style_of(const std::string& like, const std::string& text) {
  if (like.size() > 16 && text.size() >= 16 && text.back() != 'Z')
    for (const std::string_view zone : {"Z", "z", "+00:00", "+0000", "+00", " UTC", "UTC"})
      if (like.ends_with(zone))
        return in_style_of(like.substr(0, like.size() - zone.size()), text) + std::string(zone);
  return in_style_of(like, text);
}

std::string date_time_text(int64_t when, bool date_only, bool utc, bool subsecond) {
  const int64_t seconds = whole_seconds(when, subsecond);
  std::string text = io::format_datetime(seconds, date_only && !utc && !subsecond);
  if (subsecond) {
    const int64_t micros = when - seconds * static_cast<int64_t>(SeriesData::kNumericTimeScale);
    char buf[8];
    std::snprintf(buf, sizeof buf, micros % 1000 == 0 ? ".%03lld" : ".%06lld",
                  static_cast<long long>(micros % 1000 == 0 ? micros / 1000 : micros));
    text += buf;
  }
  return utc ? text + "Z" : text;
}

}  // namespace series

std::string SeriesData::usual_step() const {
  if (times.empty() || numeric_times) return "";
  const int64_t ticks = subsecond_times ? static_cast<int64_t>(kNumericTimeScale) : 1;
  std::map<std::string, int64_t> rows;  // step -> rows of the series taking it
  for (const SeriesSpan& s : series) {
    if (s.step <= 0 && s.months <= 0) continue;
    const std::string step = s.months > 0
                                 ? std::to_string(s.months) + (s.months == 1 ? " month" : " months")
                             : s.business_days ? "1 business day"
                                               : series::format_duration(s.step, ticks);
    rows[step] += s.end - s.begin;
  }
  std::string most;
  for (const auto& [step, n] : rows)
    if (most.empty() || n > rows[most]) most = step;
  return most;
}

namespace series {

// Written as the file wrote it: whole units and the millionths there are (at least `decimals`
// digits of them), never in scientific notation (1700000000000, not 1.7e+12) and never through a
// double (past 2^53 it would round).
std::string numeric_time_text(int64_t when, int decimals) {
  static_assert(SeriesData::kNumericTimeScale == 1e6, "six digits of millionths");
  const int64_t scale = static_cast<int64_t>(SeriesData::kNumericTimeScale);
  const bool negative = when < 0;
  const uint64_t magnitude = negative ? 0 - uint64_t(when) : uint64_t(when);
  std::string text = (negative ? "-" : "") + std::to_string(magnitude / scale);
  if (const uint64_t millionths = magnitude % scale; millionths != 0) {
    std::string digits = std::to_string(millionths);
    digits.insert(0, 6 - digits.size(), '0');
    text += "." + digits.substr(0, digits.find_last_not_of('0') + 1);
  }
  const size_t point = text.find('.');
  const int written = point == std::string::npos ? 0 : int(text.size() - point - 1);
  if (written < decimals)
    text += (written ? "" : ".") + std::string(size_t(decimals - written), '0');
  return text;
}

}  // namespace series
}  // namespace seqforge
