#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "data/series_stages.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::series {

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
      // One-hot columns keep the pooled scaler: a static category is constant within its series,
      // so its own scaler would make it 0 in every series, and the model could learn nothing
      // from it.
      if (norm == &d->feature_norm)
        for (int64_t j = d->one_hot_begin; j < d->one_hot_end; ++j) {
          one.shift[size_t(j)] = norm->shift[size_t(j)];
          one.scale[size_t(j)] = norm->scale[size_t(j)];
        }
      norm->series.push_back(s.name);
      norm->series_shift.push_back(one.shift);
      norm->series_scale.push_back(one.scale);
    }
  }
}

// " (the training data has 'SPX': names match as written)" where stored series' names differ
// from `name` only in case, spaces or how a number is written ('1' for '1.0'), else "".
std::string alike_hint(const Normalizer& norm, const std::string& name) {
  std::string alike;
  int count = 0;
  for (const std::string& known : norm.series)
    if (!io::names_alike({known, name}).empty() && count++ < 4)
      alike += (alike.empty() ? "" : " and ") + io::quoted(known);
  if (alike.empty()) return "";
  return " (the training data has " + alike + ": names match as written)";
}

void assign_scalers(const DataOptions& opt, bool stored, SeriesData* d) {
  const Normalizer& norm = d->feature_norm;
  d->series_scaler.assign(d->series.size(), -1);
  if (norm.series.empty()) return;  // one scaler for all
  std::vector<std::string> pooled;
  for (size_t i = 0; i < d->series.size(); ++i) {
    const std::string& name = d->series[i].name;
    d->series_scaler[i] = norm.series_index(name);
    if (d->series_scaler[i] >= 0) continue;
    const std::string hint = stored ? alike_hint(norm, name) : "";
    if (opt.series.normalize_fallback != "pooled")
      fail(opt.path, ": series ", io::quoted(name),
           stored ? " was not in the training data" : " has no training window", hint,
           ", so data.normalize_per series has no scaler for it; ",
           stored ? "a run trained with data.normalize_fallback: pooled scales it by all series' "
                    "training rows"
                  : "set data.normalize_fallback: pooled to scale it by all series' training rows");
    pooled.push_back(io::quoted(name) + hint);
  }
  if (pooled.empty()) return;
  std::string names;
  for (size_t i = 0; i < pooled.size() && i < 5; ++i) names += (i ? ", " : "") + pooled[i];
  d->notes.push_back(std::to_string(pooled.size()) + " series (" + names +
                     (pooled.size() > 5 ? ", ..." : "") +
                     ") without a scaler of their own: scaled by all series' training rows "
                     "(data.normalize_fallback: pooled)");
}

void note_values_far_from_training(const std::string& path, size_t file_features, SeriesData* d) {
  const Normalizer& norm = d->feature_norm;
  if (norm.kind != "zscore" && norm.kind != "minmax") return;
  constexpr double kFar = 8;
  for (size_t j = 0; j < file_features && j < d->feature_cols.size(); ++j) {
    double scaled = 0, raw = 0;
    int64_t n = 0, scaler = -2;  // the rows' one scaler, or -3 where they have several
    for (int64_t r = 0; r < d->rows; ++r) {
      const double x = d->source.at(r, d->feature_cols[j]);
      if (!std::isfinite(x)) continue;
      const int64_t s = d->scaler_of(r);
      scaler = scaler == -2 || scaler == s ? s : -3;
      scaled += (x - norm.shifts(s)[j]) / norm.scales(s)[j];
      raw += x;
      ++n;
    }
    if (n == 0) continue;
    const double mean = scaled / double(n);
    // minmax's training values scale to [0, 1]: the distance is from that range.
    const double away = norm.kind == "zscore" ? std::fabs(mean)
                        : mean < 0            ? -mean
                                              : std::max(0.0, mean - 1);
    if (!(away >= kFar)) continue;
    char line[400];
    // Each series' own scaler where the rows have several: their figures are not one pair.
    const bool one = scaler != -3;
    const double shift = one ? norm.shifts(scaler)[j] : 0, scale = one ? norm.scales(scaler)[j] : 0;
    const char* whose = one ? "its" : "each series'";
    char figures[96] = "";
    if (one && norm.kind == "zscore")
      std::snprintf(figures, sizeof figures, " (%.6g +- %.3g)", shift, scale);
    else if (one)
      std::snprintf(figures, sizeof figures, " (%.6g to %.6g)", shift, shift + scale);
    if (norm.kind == "zscore")
      std::snprintf(line, sizeof line,
                    "averages %.6g, %.3g standard deviations from %s training values%s",
                    raw / double(n), away, whose, figures);
    else
      std::snprintf(line, sizeof line,
                    "averages %.6g, %.3g times the range of %s training values%s away from them",
                    raw / double(n), away, whose, figures);
    d->notes.push_back("column " + io::quoted(d->feature_names[j]) + " of " + path + " " + line +
                       ": far outside what the model was trained on (another unit? other data?)");
  }
}

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
    if (!targets) continue;
    check(d.target_norm, d.target_cols, d.target_names);
    // In its own units too: a forecast, its error and the error's square stay finite numbers.
    for (size_t j = 0; j < d.target_cols.size(); ++j)
      if (const double x = d.source.at(r, d.target_cols[j]);
          std::fabs(x) > std::numeric_limits<float>::max())
        fail(table.where(file_rows[r]), ": column ", io::quoted(d.target_names[j]), ": ", x,
             " is beyond float32's range: a target must stay within it in its own units too, "
             "so that forecasts' errors and their squares are numbers; give it in larger units");
  }
}

}  // namespace seqforge::series
