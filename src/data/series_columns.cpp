#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "data/calendar.hpp"
#include "data/series_stages.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/dates.hpp"

namespace seqforge::series {
namespace {

// A text column no role takes whose names run in blocks, each name once (a file of series one
// after another), or take turns in a fixed order (series interleaved row by row): the names of
// series that no data.series_column tells apart, so the rows are read as one. A category (the
// weather of each day) changes irregularly and is no such column.
std::optional<std::string> series_names_note(const DataFile& table, const SeriesOptions& o,
                                             const std::vector<std::string>& named) {
  const int64_t n = table.rows();
  if (n < 4) return std::nullopt;
  for (const std::string& name : table.columns()) {
    if (name == o.date_col || name == o.class_col || name == o.label_col ||
        std::find(named.begin(), named.end(), name) != named.end() ||
        std::find(o.statics.begin(), o.statics.end(), name) != o.statics.end() ||
        std::find(o.categorical.begin(), o.categorical.end(), name) != o.categorical.end())
      continue;
    const auto& cells = table.text(name);
    const std::string_view first = cells[0];
    if (table.is_missing(first) || io::parse_finite(first) || is_date_cell(first)) continue;
    std::vector<std::string_view> names = {first};  // in order of first appearance
    std::unordered_set<std::string_view> seen = {first};
    int64_t changes = 0, shortest_block = n, block = 1;
    for (int64_t r = 1; r <= n; ++r) {
      if (r < n && cells[r] == cells[r - 1]) {
        ++block;
        continue;
      }
      shortest_block = std::min(shortest_block, block);
      block = 1;
      if (r == n) break;
      ++changes;
      if (seen.insert(cells[r]).second) names.push_back(cells[r]);
    }
    const int64_t k = static_cast<int64_t>(names.size());
    if (k < 2) continue;
    const bool stacked = changes == k - 1 && shortest_block >= 2;
    bool interleaved = k <= n / 2 && changes == n - 1;
    for (int64_t r = k; interleaved && r < n; ++r) interleaved = cells[r] == cells[r - k];
    if (!stacked && !interleaved) continue;
    std::string listed;
    for (int64_t i = 0; i < std::min<int64_t>(k, 3); ++i)
      listed += (i ? ", " : "") + io::quoted(names[i]);
    if (k > 3) listed += ", ...";
    return table.path() + ": column '" + name + "' holds " + std::to_string(k) + " names (" +
           listed + ") " + (stacked ? "in blocks one after another" : "taking turns row by row") +
           ", but no data.series_column names it: the rows are read as one series, windows "
           "across the names; if they are series, data.series_column: " +
           name;
  }
  return std::nullopt;
}

}  // namespace

void name_columns(const DataFile& table, const SeriesData* stored, WindowSet which,
                  DataOptions* options, SeriesData* out, std::vector<std::string>* notes) {
  DataOptions& opt = *options;
  const SeriesOptions& o = opt.series;
  SeriesData& d = *out;
  if (const std::string index = io::CsvTable::kIndexColumn; table.has_column(index)) {
    const std::string what = opt.path + ": column 1 has no name, as pandas writes a frame's index";
    if (o.date_col.empty() && is_date_cell(table.text(index)[0])) {
      opt.series.date_col = index;
      notes->push_back(what + ", and holds dates: they order the rows (data.date_column '" + index +
                       "')");
    } else if (o.features.empty() && !stored && o.date_col != index) {
      notes->push_back(what + ": not a feature (data.features: ['" + index +
                       "', ...] makes it one)");
    }
  }
  auto require = [&](const char* key, const std::string& col) {
    if (!col.empty() && !table.has_column(col))
      fail(opt.where(key), ": ", key, ": ", opt.path, " has no column '", col, "'",
           table.columns_hint(col));
  };
  require("data.date_column", o.date_col);
  require("data.series_column", o.series_col);
  if (table.is_array() && !o.series_col.empty())
    fail(opt.where("data.series_column"), ": data.series_column: ", opt.path,
         " is an array; several series in one file are a CSV's, with a column naming each "
         "series");
  if (table.is_array() && !stored) d.array_columns = static_cast<int64_t>(table.columns().size());
  if (table.is_array() && stored && stored->array_columns > 0 &&
      static_cast<int64_t>(table.columns().size()) != stored->array_columns)
    fail(opt.path, ": an array of ", table.columns().size(), " columns, where the run trained on ",
         "one of ", stored->array_columns,
         ": an array's columns are named by position (0, 1, ...), so a column more or fewer "
         "gives the columns after it other names; give ",
         stored->array_columns, " columns in the training array's order");
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
      fail(opt.where("data.features"), ": data.features: ", opt.path, " has no column '", name, "'",
           stored && o.features.empty() ? ", a feature of the trained model" : "",
           table.columns_hint(name));
  // A column of dates that orders nothing: the rows go in the file's order, newest first too.
  if (!table.is_array() && table.rows() > 1 && o.date_col.empty() && !stored)
    for (const std::string& name : table.columns()) {
      if (std::find(named.begin(), named.end(), name) != named.end() ||
          !is_date_cell(table.text(name)[0]))
        continue;
      const auto first = io::parse_datetime(table.text(name)[0]);
      const auto last = io::parse_datetime(table.text(name)[table.rows() - 1]);
      const bool newest_first = first && last && *first > *last;
      notes->push_back(opt.path + ": column '" + name + "' holds dates, but no data.date_column " +
                       "names it: the rows are taken in the file's order" +
                       (newest_first
                            ? ", which runs newest first (" + std::string(table.text(name)[0]) +
                                  " to " + std::string(table.text(name)[table.rows() - 1]) +
                                  "): validation and test take the oldest rows"
                            : "") +
                       " (data.date_column: " + name + " orders them by it)");
      break;
    }
  if (!table.is_array() && o.series_col.empty() && !stored)
    if (auto note = series_names_note(table, o, named)) notes->push_back(*note);
  if (!table.is_array() && table.rows() > 0)
    for (const std::string& name : named) {
      if (!table.has_column(name)) continue;
      const std::string cell(table.text(name)[0]);
      if (o.date_col.empty() && is_date_cell(cell))
        fail(table.where(0), ": column '", name, "' holds dates ('", cell,
             "'): name it in data.date_column, which orders the rows (dates are no feature)");
      const bool defaulted_feature =
          o.features.empty() && !stored &&
          std::find(o.targets.begin(), o.targets.end(), name) == o.targets.end();
      if (defaulted_feature && !table.is_missing(cell) && !io::parse_finite(cell)) {
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
        fail(opt.where(std::string("data.") + key + "s"), ": data.", key, "s: '", o.date_col,
             "' is data.date_column, which orders the rows and cannot be a ", key);
  if (!o.series_col.empty()) {  // the series' names say which series a row is of, nothing more
    using Columns = const std::vector<std::string>*;
    for (const auto& [key, columns] : {std::pair<const char*, Columns>{"feature", &d.feature_names},
                                       std::pair<const char*, Columns>{"target", &o.targets}})
      if (std::find(columns->begin(), columns->end(), o.series_col) != columns->end())
        fail(opt.where(std::string("data.") + key + "s"), ": data.", key, "s: '", o.series_col,
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
      fail(opt.where("data.transform"), ": data.transform: '", column,
           "' is neither a feature nor a target");
  for (const std::string& column : o.known_future) {
    if (is_calendar(o, column)) continue;  // from the dates
    if (std::find(o.categorical.begin(), o.categorical.end(), column) != o.categorical.end() ||
        std::find(o.statics.begin(), o.statics.end(), column) != o.statics.end())
      fail(opt.where("data.known_future"), ": data.known_future: '", column,
           "' is a column of categories (data.categorical, data.static); the values known ahead "
           "are numbers (a 0/1 column per category works)");
    if (const auto t = o.transforms.find(column);
        t != o.transforms.end() && t->second != Transform::none && !stored)
      notes->push_back("data.known_future '" + column + "': its values ahead ('" + column +
                       "+n') are read as written; data.transform " + transform_name(t->second) +
                       " changes only its feature in the window");
    const bool cycle = column == "hour" || column == "dayofweek" || column == "dayofmonth" ||
                       column == "dayofyear" || column == "month";
    if (!table.has_column(column) && cycle)
      fail(opt.where("data.known_future"), ": data.known_future: '", column,
           "' is a calendar feature only when ", "data.calendar lists it too (data.calendar: [",
           column, "])");
    if (!table.has_column(column))
      fail(opt.where("data.known_future"), ": data.known_future: ", opt.path, " has no column '",
           column, "'", table.columns_hint(column));
    if (std::find(o.targets.begin(), o.targets.end(), column) != o.targets.end())
      fail(opt.where("data.known_future"), ": data.known_future: '", column,
           "' is a target: its future values are what the model forecasts");
  }
  // The truth: target columns, the class column or the label's column. Predict needs none.
  std::vector<std::string> truth = o.targets;
  if (opt.task == TaskKind::classify) truth = {o.label == "column" ? o.class_col : o.label_col};
  for (const auto& name : truth) {
    if ((which == WindowSet::every_window || which == WindowSet::last_windows) &&
        !table.has_column(name)) {
      d.has_targets = false;
      continue;
    }
    require(opt.task == TaskKind::forecast ? "data.targets"
            : o.label == "column"          ? "data.class_column"
                                           : "data.label_column",
            name);
  }
  if (opt.task == TaskKind::forecast) d.target_names = o.targets;
  if (!d.has_targets &&
      opt.task == TaskKind::forecast)  // predictions are inverted against the last input
    for (const auto& name : o.targets)
      if (needs_base(transform_of(o, name)) && !table.has_column(name))
        fail(opt.path, ": has no column '", name,
             "', which predictions need to undo data.transform ",
             transform_name(transform_of(o, name)), " of the target");
}

void name_derived_features(const SeriesOptions& o, SeriesData* out) {
  SeriesData& d = *out;
  const size_t file_features = d.feature_names.size();
  d.file_features = static_cast<int64_t>(file_features);
  d.value_features.assign(file_features, 1);
  auto derived = [&](const std::string& name) {
    d.feature_names.push_back(name);
    d.value_features.push_back(0);
  };
  for (const std::string& name : o.calendar)
    for (const char* part : {"_sin", "_cos"}) derived(name + part);
  for (const auto* list : {&d.static_categories, &d.categories})
    for (const auto& [column, categories] : *list)
      for (const std::string& category : categories) derived(column + "=" + category);
  for (const std::string& name : o.known_future)
    for (int64_t a = 0; a < d.steps_ahead; ++a) {
      std::string ahead(1, '+');  // built in place (GCC 12 warns on "+" + text)
      ahead += std::to_string(o.horizon - d.steps_ahead + 1 + a);
      if (is_calendar(o, name)) {
        derived(name + "_sin" + ahead);
        derived(name + "_cos" + ahead);
      } else {
        d.feature_names.push_back(name + ahead);
        d.value_features.push_back(1);
      }
    }
  if (o.missing == "mask")
    for (size_t j = 0; j < file_features; ++j) derived(d.feature_names[j] + "_missing");
}

}  // namespace seqforge::series
