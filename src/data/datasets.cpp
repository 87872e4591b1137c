#include "seqforge/data/datasets.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "data/data_file.hpp"
#include "data/series_stages.hpp"
#include "data/splits.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/file_stamp.hpp"
#include "seqforge/io/npy.hpp"

namespace seqforge {

namespace {

// The categories of data.categorical that no training window's rows hold. Kept, their one-hot
// feature would be 0 wherever the model learns, its weights would stay as initialised, and the
// windows that hold them would be forecast from those weights: the model leaves them out instead,
// so they are all 0 as a category new to predict is.
series::CategorySet untrained_categories(const SeriesData& d) {
  series::CategorySet untrained;
  if (d.categories.empty() || d.split.train.empty()) return untrained;
  std::vector<int64_t> cover(size_t(d.rows) + 1, 0);  // windows over each row, as differences
  for (int64_t s : d.split.train) {
    ++cover[size_t(s)];
    --cover[size_t(std::min(d.last_row(s) + 1, d.rows))];
  }
  for (size_t r = 1; r < cover.size(); ++r) cover[r] += cover[r - 1];
  for (const auto& [column, categories] : d.categories)
    for (const std::string& category : categories) {
      const auto name =
          std::find(d.feature_names.begin(), d.feature_names.end(), column + "=" + category);
      if (name == d.feature_names.end()) continue;
      const int64_t col = d.feature_cols[size_t(name - d.feature_names.begin())];
      bool trained = false;
      for (int64_t r = 0; r < d.rows && !trained; ++r)
        trained = d.source.at(r, col) != 0 && cover[size_t(r)] > 0;
      if (!trained) untrained.emplace(column, category);
    }
  return untrained;
}

}  // namespace

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

static SeriesData load_series_leaving_out(const DataOptions& given, const SeriesData* stored,
                                          WindowSet which, const series::CategorySet& left_out);

SeriesData load_series(const DataOptions& opt, const SeriesData* stored, WindowSet which) {
  SeriesData d = load_series_leaving_out(opt, stored, which, {});
  if (stored || which != WindowSet::splits) return d;
  const series::CategorySet untrained = untrained_categories(d);
  if (untrained.empty()) return d;
  d = load_series_leaving_out(opt, stored, which, untrained);
  for (const auto& [column, category] : untrained)
    d.notes.push_back("data.categorical: column " + io::quoted(column) + " holds " +
                      io::quoted(category) +
                      " in no row a training window reads: the model leaves it out of its "
                      "categories, and the rows that hold it have all their one-hot features 0, "
                      "as a category new to the model has (merge it into another category, or "
                      "make its cells missing)");
  return d;
}

static SeriesData load_series_leaving_out(const DataOptions& given, const SeriesData* stored,
                                          WindowSet which, const series::CategorySet& left_out) {
  DataOptions opt = given;  // with pandas' index of dates as the date column where none is named
  if (stored && !stored->holidays.empty()) opt.series.holidays = stored->holidays;  // the run's
  const SeriesOptions& o = opt.series;
  if (opt.task == TaskKind::charlm || opt.task == TaskKind::lm)
    fail(opt.where("data.task"), ": data.task: '", task_name(opt.task),
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
  const DataFile table(opt.path, o.missing_values, o.missing_words);
  std::vector<std::string> file_notes;
  series::name_columns(table, stored, which, &opt, &d, &file_notes);
  const size_t file_features = d.feature_names.size();
  if (opt.task == TaskKind::mae && file_features == 0)
    fail(opt.where("data.features"), ": data.task mae reconstructs the file's features, and ",
         opt.path,
         " gives none beside its dates and categories: name its numeric columns in "
         "data.features");
  SeriesOptions built = o;
  built.features = d.feature_names;
  const series::RowOrder order = series::order_rows(table, built, opt.path);
  series::static_categories(table, opt, order, stored, &d);
  d.layout = "date " + o.date_col + "; series " + o.series_col + "; transforms";
  for (const auto& [column, t] : o.transforms) d.layout += " " + column + ":" + transform_name(t);
  d.notes = order.notes;
  std::vector<std::string> named = d.feature_names;  // the file's numeric columns
  named.insert(named.end(), o.targets.begin(), o.targets.end());
  if (auto note = table.separator_note(named)) file_notes.insert(file_notes.begin(), *note);
  d.notes.insert(d.notes.begin(), file_notes.begin(), file_notes.end());
  if (!stored && !d.quantiles.empty() &&
      std::find(d.quantiles.begin(), d.quantiles.end(), 0.5) == d.quantiles.end())
    d.notes.push_back(
        detail::concat("train.quantiles has no 0.5: the errors, the skill and MASE score the ",
                       d.quantiles[size_t(d.point_quantile())],
                       " quantile, the nearest to the median (the lower of two as near; add 0.5 to "
                       "score the median)"));
  series::categorical_columns(table, opt, stored, left_out, &d);
  const std::string label_col =
      opt.task == TaskKind::classify && o.label != "column" && d.has_targets ? o.label_col : "";
  const std::vector<int64_t> file_rows =
      series::build_source(table, built, order, d.target_names, label_col,
                           which != WindowSet::splits, which == WindowSet::last_windows, &d);
  series::name_derived_features(o, &d);
  if (!stored) {  // a derived feature named as a column ("c=x" beside data.categorical [c])
    std::unordered_set<std::string_view> seen;
    for (const std::string& name : d.feature_names)
      if (!seen.insert(name).second)
        fail(opt.path, ": the model would have two features named ", io::quoted(name),
             ": a column of the file and a feature derived from data.calendar, "
             "data.known_future, data.categorical or data.missing mask; rename the column");
  }
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
  if (stored && which != WindowSet::splits) {
    series::note_values_far_from_training(opt.path, file_features, &d);
    const std::string step = d.usual_step();
    if (!step.empty() && !stored->trained_step.empty() && step != stored->trained_step)
      d.notes.push_back(opt.path + ": its rows are " + step +
                        " apart, the model's training data's " + stored->trained_step +
                        ": the model takes each row for one of its training steps");
  }
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
    // Only windows whose known values ahead the file holds, and (unless masked) their inputs;
    // masked, none that ends in the future rows (its inputs there are not known yet).
    const size_t all = d.split.test.size();
    std::vector<int64_t> observed_end;
    if (d.masks_missing)
      for (const SeriesSpan& s : d.series) observed_end.push_back(d.last_observed_row(s));
    std::erase_if(d.split.test, [&](int64_t start) {
      if (const SeriesSpan& s = d.series_of(start);
          d.masks_missing && d.last_row(start) > observed_end[size_t(&s - d.series.data())])
        return true;
      for (int64_t r = start; r <= d.last_row(start); ++r)
        for (int64_t f = 0; f < d.num_features(); ++f)
          if (!std::isfinite(d.source.at(r, d.feature_cols[f])) &&
              (!d.masks_missing || (f >= d.known_begin && f < d.known_end)))
            return true;
      return false;
    });
    if (d.split.test.size() < all && which != WindowSet::last_windows)  // --last: said per series
      d.notes.push_back(std::to_string(all - d.split.test.size()) + " of " + std::to_string(all) +
                        " windows are left out: the file lacks their inputs or their "
                        "data.known_future values at the rows they forecast (add the future "
                        "rows at each series' end, the known columns filled)");
  }
  if (which == WindowSet::last_windows) series::keep_last_windows(table, file_rows, &d);
  // No loss on a missing target, nor on a class the class column leaves empty (said already).
  size_t train_without_truth = 0;
  if (which == WindowSet::splits && (d.masks_missing || d.task == TaskKind::classify)) {
    size_t left_out = 0;
    for (auto* list : {&d.split.train, &d.split.val, &d.split.test}) {
      const size_t dropped = series::keep_windows_with_truth(&d, list);
      if (list == &d.split.val) d.val_without_truth = dropped;
      if (list == &d.split.train) train_without_truth = dropped;
      left_out += dropped;
    }
    if (left_out > 0 && d.masks_missing)
      d.notes.push_back("data.missing mask: " + std::to_string(left_out) +
                        " windows whose target is missing are left out of training and "
                        "evaluation");
  }
  if (which != WindowSet::splits) return d;
  if (d.split.train.empty() && train_without_truth > 0)
    fail(opt.path, ": no training window is left: each of the training split's ",
         train_without_truth, " windows lacks what it would be trained on (",
         d.task == TaskKind::classify ? "its class cell is empty"
         : d.task == TaskKind::mae    ? "every row of it has an empty cell"
                                      : "a target cell it forecasts is empty",
         "), and windows without it are left out");
  // A stored run's too: its training split is what it trained on (the majority baseline, MASE's
  // scale).
  series::keep_labeled_fraction(opt, &d);
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
    if (std::string note = untrained_classes_note(d.class_names, train_classes, "window",
                                                  opt.series.label_fraction);
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
    d.text = load_text(opt, from ? from->text.vocab : std::u32string(),
                       windows == WindowSet::with_targets);
  } else if (d.kind == TaskKind::lm) {
    d.text = load_tokens(opt, from ? &from->text : nullptr, windows == WindowSet::with_targets);
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
