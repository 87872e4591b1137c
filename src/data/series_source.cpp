#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "data/calendar.hpp"
#include "data/series_stages.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/csv.hpp"

namespace seqforge::series {

namespace {

// Span s of column v without the cells after the series' last value (its rows to come) where
// `leave_trailing`.
SeriesSpan known_span(SeriesSpan s, const std::vector<double>& v, const RowOrder& order,
                      bool leave_trailing) {
  if (leave_trailing)
    while (s.end > s.begin && std::isnan(v[order.rows[s.end - 1]])) --s.end;
  return s;
}

// Fills the missing cells (NaN) of column x (by file row) per data.missing, each series walked in
// time order; returns how many it filled. Cells it cannot fill (ffill: none before them) are an
// error, or with `leave_unfillable` (predict --last, which checks its windows) stay missing.
// With `leave_trailing`, the cells after a series' last value stay missing: the rows to come of
// a file that gives data.known_future values, whose other cells are not known yet.
int64_t fill_missing(std::vector<double>* x, const RowOrder& order, const std::string& how,
                     const DataFile& table, const std::string& name, bool leave_unfillable,
                     bool leave_trailing = false) {
  int64_t filled = 0;
  std::vector<double>& v = *x;
  if (!leave_unfillable && std::all_of(v.begin(), v.end(), [](double c) { return std::isnan(c); }))
    fail(table.path(), ": column '", name, "' has no value in any row");
  for (SeriesSpan s : order.spans) {
    s = known_span(s, v, order, leave_trailing);
    auto at = [&](int64_t p) -> double& { return v[order.rows[p]]; };
    int64_t last = -1;  // the position of the last value seen
    for (int64_t p = s.begin; p < s.end; ++p) {
      if (!std::isnan(at(p))) {
        last = p;
        continue;
      }
      if (how == "ffill") {
        if (last < 0 && leave_unfillable) continue;
        if (last < 0 && std::all_of(order.rows.begin() + p, order.rows.begin() + s.end,
                                    [&](int64_t r) { return std::isnan(v[r]); }))
          fail(table.where(order.rows[p]), ": column '", name, "' has no value in its series",
               s.name.empty() ? "" : " '" + s.name + "'");
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
      if (last < 0 && next == s.end && leave_unfillable) break;
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

// The missing cells of a column in its series, with leave_trailing those after a series' last
// value left out (rows to come, which nothing is asked of).
int64_t count_missing(const std::vector<double>& v, const RowOrder& order, bool leave_trailing) {
  int64_t missing = 0;
  for (SeriesSpan s : order.spans) {
    s = known_span(s, v, order, leave_trailing);
    for (int64_t p = s.begin; p < s.end; ++p) missing += std::isnan(v[order.rows[p]]);
  }
  return missing;
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
         text(code->first) + "] (eval and predict: --missing-values " + text(code->first) +
         ") makes such cells missing";
}

// One cell so far outside the column's other values that beside it they collapse: their whole
// range is under a hundredth of the column's standard deviation, so scaled with it they all but
// coincide (a mistyped 1e300, a value in other units). On a log scale where the column is learnt
// as its log (values over many orders of magnitude are then no outliers). Named in a note; it is
// kept as it is.
std::optional<std::string> lone_outlier_note(const std::vector<double>& values, bool log_scale,
                                             const std::string& column, const DataFile& table) {
  std::vector<double> logs;
  if (log_scale) {
    logs.resize(values.size());
    for (size_t r = 0; r < values.size(); ++r) logs[r] = values[r] > 0 ? std::log(values[r]) : NAN;
  }
  const std::vector<double>& x = log_scale ? logs : values;
  int64_t lowest = -1, highest = -1, count = 0;
  for (int64_t r = 0; r < int64_t(x.size()); ++r) {
    if (std::isnan(x[r])) continue;
    if (lowest < 0 || x[r] < x[lowest]) lowest = r;
    if (highest < 0 || x[r] > x[highest]) highest = r;
    ++count;
  }
  if (count < 3) return std::nullopt;
  // Welford's updates on the values over the largest magnitude: the squares of 1e200 overflow.
  const double unit = std::max(std::fabs(x[lowest]), std::fabs(x[highest]));
  if (!(unit > 0) || !std::isfinite(unit)) return std::nullopt;
  double mean = 0, m2 = 0, n = 0;
  for (const double v : x) {
    if (std::isnan(v)) continue;
    const double delta = v / unit - mean;
    mean += delta / ++n;
    m2 += delta * (v / unit - mean);
  }
  const double deviation = std::sqrt(m2 / n) * unit;
  for (const int64_t cell : {highest, lowest}) {
    int64_t lo = -1, hi = -1;  // the other values' extremes
    for (int64_t r = 0; r < int64_t(x.size()); ++r)
      if (r != cell && !std::isnan(x[r])) {
        if (lo < 0 || x[r] < x[lo]) lo = r;
        if (hi < 0 || x[r] > x[hi]) hi = r;
      }
    if (!(x[hi] > x[lo]) || !(x[hi] - x[lo] < 0.01 * deviation)) continue;
    auto text = [](double v) {
      char buf[32];
      return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    };
    return "column '" + column + "': " + text(values[cell]) + " at " + table.where(cell) +
           " lies so far outside its other values (" + text(values[lo]) + " to " +
           text(values[hi]) + (log_scale ? ", on the log scale of data.transform" : "") +
           ") that beside it they all but coincide: a mistyped cell? data.missing_values: [" +
           text(values[cell]) + "] makes it missing";
  }
  return std::nullopt;
}

// How a file's missing cells are filled: by eval's and predict's --missing (`at_inference`), or
// by the config's data.missing.
const char* missing_hint(bool at_inference) {
  return at_inference
             ? " (--missing ffill or interpolate fills the file's missing cells)"
             : " (data.missing: ffill or interpolate fills missing cells, mask masks them)";
}

// Whether most of a CSV column's cells are numbers: a cell that is none is then a code for a
// missing value ("?", "#DIV/0!"), not a category.
bool mostly_numbers(const DataFile& table, const std::string& name) {
  if (table.is_array()) return false;
  int64_t numbers = 0, others = 0;
  for (const std::string_view cell : table.text(name))
    if (!table.is_missing(cell)) {
      std::string point(cell);  // a decimal comma's column too
      std::replace(point.begin(), point.end(), ',', '.');
      ++(io::parse_finite(point) ? numbers : others);
    }
  return numbers > others;
}

}  // namespace

std::vector<int64_t> build_source(const DataFile& table, const SeriesOptions& o,
                                  const RowOrder& order,
                                  const std::vector<std::string>& target_names,
                                  const std::string& label_col, bool missing_targets,
                                  bool missing_inputs, SeriesData* d) {
  // The mapped array itself, never loaded whole, where nothing is to be transformed, filled or
  // reordered.
  if (table.is_array() && o.transforms.empty() && o.missing == "error" && o.known_future.empty() &&
      !table.has_missing_codes() && o.date_col.empty() && !missing_inputs) {
    std::vector<std::string> names = o.features;
    names.insert(names.end(), target_names.begin(), target_names.end());
    if (!label_col.empty()) names.push_back(label_col);
    std::vector<int64_t> cols;
    try {
      d->source = table.array(names, &cols);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.ends_with("missing value, not a number")) fail(what, missing_hint(missing_targets));
      throw;
    }
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
  d->one_hot_begin = statics_at;
  d->one_hot_end = known_at;
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
    // predict: targets to come (and with data.known_future the rows to come's other features,
    // which stay missing as the series' last cells)
    const bool not_known_yet =
        (is_target && missing_targets) || (missing_inputs && o.missing == "error");
    const bool leave_trailing = !o.known_future.empty() && missing_targets;
    // Without data.missing, the rows to come may still leave the cells after a series' last value
    // empty; none before it.
    const bool only_trailing = leave_trailing && o.missing == "error" && !not_known_yet;
    std::vector<double> x;
    try {
      x = table.column(name, not_known_yet || only_trailing || o.missing != "error");
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.ends_with("empty cell is not a number") ||
          what.ends_with("missing value, not a number"))
        fail(what, missing_hint(missing_targets));
      if (what.ends_with("is not a number") && mostly_numbers(table, name))
        fail(what, missing_targets
                       ? " (a code for a missing value? --missing-values lists it, "
                         "--missing fills it)"
                       : " (a code for a missing value? List it in data.missing_values, and "
                         "fill or mask it with data.missing)");
      if (what.ends_with("is not a number") && !is_target && name == o.class_col)
        fail(what,
             " (it is data.class_column, the class to predict: drop it from "
             "data.features)");
      if (what.ends_with("is not a number") && !is_target)
        fail(what,
             " (a column of categories? name it in data.categorical, or data.static if it "
             "holds one value per series)");
      throw;
    }
    if (only_trailing)
      for (const SeriesSpan& span : order.spans) {
        const SeriesSpan known = known_span(span, x, order, true);
        for (int64_t p = known.begin; p < known.end; ++p)
          if (std::isnan(x[order.rows[p]]))
            fail(table.where(order.rows[p]), ": column '", name,
                 "': a missing cell before its series' last value (only the rows to come, after "
                 "it, may leave it empty; --missing ffill or interpolate fills the file's missing "
                 "cells)");
      }
    auto note = nines_note(x, name, table);
    if (!note)
      note = lone_outlier_note(x, t == Transform::log || t == Transform::log_return, name, table);
    if (note && std::find(d->notes.begin(), d->notes.end(), *note) == d->notes.end())
      d->notes.push_back(*note);
    if (o.missing != "error" && !not_known_yet) {
      const int64_t empty =
          mask ? count_missing(x, order, leave_trailing)
               : fill_missing(&x, order, o.missing, table, name, missing_inputs, leave_trailing);
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
      const auto [sin, cos] = calendar_features(
          o.calendar[i], whole_seconds(order.times[keep[k]], order.subsecond_times));
      (*values)[k * width + file_features + 2 * int64_t(i)] = sin;
      (*values)[k * width + file_features + 2 * int64_t(i) + 1] = cos;
    }
  // One-hot categories: a 1 at the row's category (the matrix starts at zeros), found by a
  // lookup rather than a comparison with every category.
  int64_t at = statics_at;
  for (const auto* list : {&d->static_categories, &d->categories})
    for (const auto& [column, categories] : *list) {
      std::unordered_map<std::string_view, int64_t> slot;
      for (size_t c = 0; c < categories.size(); ++c) slot.emplace(categories[c], int64_t(c));
      const io::CsvColumn& text = table.text(column);
      for (int64_t k = 0; k < n; ++k)
        if (const auto it = slot.find(text[order.rows[keep[k]]]); it != slot.end())
          (*values)[k * width + at + it->second] = 1;
      at += static_cast<int64_t>(categories.size());
    }
  if (!order.times.empty()) {
    d->numeric_times = order.numeric_times;
    d->numeric_decimals = order.numeric_decimals;
    d->utc_times = order.utc_times;
    d->date_order = order.date_order;
    d->subsecond_times = order.subsecond_times;
    for (int64_t p : keep) {
      d->times.push_back(order.times[p]);
      d->gap_before.push_back(order.gap_before[size_t(p)]);
      const int64_t row = order.rows[p];
      d->dates.push_back(table.is_array()           ? numeric_time_text(order.times[p])
                         : !order.iso_dates.empty() ? order.iso_dates[row]
                                                    : std::string(table.text(o.date_col)[row]));
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
      // Gaps filled as in training; at predict, past the file's last known value stays unknown.
      if (o.missing != "error" && o.missing != "mask")
        fill_missing(&x, order, o.missing, table, name, missing_inputs, missing_targets);
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t end = d->series_of(k).end;
      for (int64_t a = 0; a < K; ++a) {
        const int64_t ahead = o.horizon - K + 1 + a;  // step a's forecast is for row k + ahead
        double* out = values->data() + k * width + at + (calendar ? 2 : 1) * a;
        if (!calendar) {
          *out = k + ahead < end ? x[order.rows[keep[k + ahead]]] : NAN;
        } else if (const auto when = d->time_ahead(k, ahead)) {
          std::tie(out[0], out[1]) =
              calendar_features(name, whole_seconds(*when, order.subsecond_times));
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

}  // namespace seqforge::series
