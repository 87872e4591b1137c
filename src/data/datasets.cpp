#include "seqforge/data/datasets.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "data/calendar.hpp"
#include "data/data_file.hpp"
#include "data/series_stages.hpp"
#include "data/splits.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/file_stamp.hpp"
#include "seqforge/io/npy.hpp"

namespace seqforge {

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
      derived += (series::is_calendar(o, name) ? 2 : 1) * d.steps_ahead;
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
    if (series::is_calendar(o, column)) continue;  // from the dates
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
      if (series::needs_base(series::transform_of(o, name)) && !table.has_column(name))
        fail(opt.path, ": has no column '", name,
             "', which predictions need to undo data.transform ",
             transform_name(series::transform_of(o, name)), " of the target");
  const series::RowOrder order = series::order_rows(table, built, opt.path);
  series::static_categories(table, opt, order, stored, &d);
  d.layout = "date " + o.date_col + "; series " + o.series_col + "; transforms";
  for (const auto& [column, t] : o.transforms) d.layout += " " + column + ":" + transform_name(t);
  d.notes = order.notes;
  if (auto note = table.separator_note(named)) file_notes.insert(file_notes.begin(), *note);
  d.notes.insert(d.notes.begin(), file_notes.begin(), file_notes.end());
  series::categorical_columns(table, opt, stored, &d);
  const std::string label_col =
      opt.task == TaskKind::classify && o.label != "column" && d.has_targets ? o.label_col : "";
  const std::vector<int64_t> file_rows = series::build_source(
      table, built, order, d.target_names, label_col, which != WindowSet::splits, &d);
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
      if (series::is_calendar(o, name)) {
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
    series::label_rows(table, o, file_rows, stored, which != WindowSet::splits, &d, &volatility);
  series::list_windows(opt, which, &d);
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
    series::fit_normalizers(o, &d);
  }
  series::assign_scalers(opt, stored != nullptr, &d);
  series::check_float_range(table, file_rows, d);
  series::label_volatility(volatility, stored, &d);
  if (which == WindowSet::with_targets) {
    const size_t all = d.split.test.size(),
                 left_out = series::keep_windows_with_truth(&d, &d.split.test);
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
      left_out += series::keep_windows_with_truth(&d, list);
    if (left_out > 0)
      d.notes.push_back("data.missing mask: " + std::to_string(left_out) +
                        " windows whose target is missing are left out of training and "
                        "evaluation");
  }
  if (which != WindowSet::splits) return d;
  if (!stored) series::keep_labeled_fraction(opt, &d);
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
