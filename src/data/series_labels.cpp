#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/series_stages.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/csv.hpp"

namespace seqforge::series {

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
  // An empty cell (or NA, ...) is a row without a class, never a class named "" or "NaN": a few
  // labelled rows among many train a classifier on the windows whose class they give.
  auto unlabeled = [&](int64_t row) { return table.is_missing(names[row]); };
  int64_t unlabeled_rows = 0, first_unlabeled = -1;
  for (int64_t row : file_rows) {  // not a class JSON cannot store
    if (unlabeled(row)) {
      if (unlabeled_rows++ == 0) first_unlabeled = row;
      continue;
    }
    decode_utf8(std::string(names[row]), table.where(row) + ": column '" + o.class_col + "'");
  }
  if (!lenient && unlabeled_rows == static_cast<int64_t>(file_rows.size()))
    fail(table.path(), ": column '", o.class_col, "' (data.class_column) holds no class");
  if (!lenient && unlabeled_rows > 0)
    d->notes.push_back(std::to_string(unlabeled_rows) + " of " + std::to_string(file_rows.size()) +
                       " rows have no class in column '" + o.class_col +
                       "' (an empty or missing cell, the first at " + table.where(first_unlabeled) +
                       "): the windows whose class they would give are left out");
  if (!stored) {
    for (int64_t row : file_rows)
      if (!unlabeled(row)) d->class_names.emplace_back(names[row]);
    d->class_names = io::ordered_class_names(std::move(d->class_names));
    if (const std::string alike = io::names_alike(d->class_names); !alike.empty())
      d->notes.push_back("classes " + alike + " in column '" + o.class_col +
                         "' differ only in case, spaces or how a number is written: each trains "
                         "as a class of its own");
  }
  std::unordered_map<std::string_view, int64_t> index;  // class name -> number
  for (size_t k = 0; k < d->class_names.size(); ++k) index.emplace(d->class_names[k], int64_t(k));
  std::map<std::string, int64_t> unseen;  // class name -> rows
  for (int64_t r = 0; r < d->rows; ++r) {
    const std::string_view name = names[file_rows[r]];
    if (const auto it = index.find(name); it != index.end()) {
      d->classes[r] = it->second;
    } else if (unlabeled(file_rows[r])) {
      continue;
    } else if (!lenient) {
      fail(table.where(file_rows[r]), ": class '", name, "' was not seen in training");
    } else if (!name.empty()) {
      ++unseen[std::string(name)];
    }
  }
  for (const auto& [name, rows] : unseen)
    d->notes.push_back(std::to_string(rows) + (rows == 1 ? " row has" : " rows have") + " class '" +
                       name + "' in column '" + o.class_col +
                       "', which the model was not trained on" +
                       io::known_otherwise(name, d->class_names) + ": no actual class for " +
                       (rows == 1 ? "it" : "them"));
}

size_t keep_windows_with_truth(SeriesData* d, std::vector<int64_t>* list) {
  std::vector<float> targets(static_cast<size_t>(d->output_rows() * d->num_outputs()));
  auto has_truth = [&](int64_t start) {
    if (d->task == TaskKind::classify) return d->classes[d->target_row(start)] >= 0;
    if (d->task == TaskKind::mae) {  // a step to reconstruct
      for (int64_t r = start; r <= d->last_row(start); ++r)
        if (d->row_complete(r)) return true;
      return false;
    }
    d->copy_target(start, targets.data());
    return std::all_of(targets.begin(), targets.end(), [](float y) { return std::isfinite(y); });
  };
  const size_t before = list->size();
  list->erase(std::remove_if(list->begin(), list->end(), [&](int64_t s) { return !has_truth(s); }),
              list->end());
  return before - list->size();
}

void label_volatility(const std::vector<double>& volatility, const SeriesData* stored,
                      SeriesData* d) {
  if (volatility.empty()) return;
  if (stored) {
    d->label_threshold = stored->label_threshold;
  } else {
    std::vector<double> v;  // the training windows' volatilities, and their median
    for (int64_t s : d->split.train)
      if (const double x = volatility[d->target_row(s)]; !std::isnan(x)) v.push_back(x);
    if (v.empty()) return;
    const size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + mid, v.end());
    d->label_threshold = v[mid];
    if (v.size() % 2 == 0)  // between the two middle values, as an even count's median is
      d->label_threshold =
          0.5 * (*std::max_element(v.begin(), v.begin() + mid) + d->label_threshold);
  }
  for (int64_t r = 0; r < d->rows; ++r)
    if (!std::isnan(volatility[r])) d->classes[r] = volatility[r] > d->label_threshold ? 1 : 0;
}

}  // namespace seqforge::series
