// Feature and target scaling: fitted on the training rows, pooled or per series, kept as JSON in
// a checkpoint and checked when read back.
#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/data/datasets.hpp"

namespace seqforge {

void Normalizer::fit(const std::string& k, const SourceMatrix& m, const std::vector<int64_t>& cols,
                     const std::vector<int64_t>& rows) {
  fit_values(k, cols.size(), [&](const std::function<void(size_t, double)>& add) {
    for (int64_t r : rows)  // row by row: one pass over a memory-mapped source
      for (size_t j = 0; j < cols.size(); ++j) add(j, m.at(r, cols[j]));
  });
}

void Normalizer::fit_values(
    const std::string& k, size_t n_cols,
    const std::function<void(const std::function<void(size_t, double)>&)>& each) {
  if (k != "zscore" && k != "minmax" && k != "none")
    fail("data.normalize: unknown value '", k, "' (expected zscore, minmax or none)");
  kind = k;
  shift.assign(n_cols, 0.0);
  scale.assign(n_cols, 1.0);
  if (k == "none") return;
  // A column with values past 2^500 in magnitude (their squares near a double's overflow) is
  // summed divided by a power of two, the largest at most its largest magnitude (2^1024 is past
  // a double): exact, and every other column's figures stay as they were.
  std::vector<double> unit(n_cols, 1.0);
  each([&](size_t j, double x) {
    if (std::fabs(x) > 0x1p500 && std::fabs(x) >= 2 * unit[j])
      unit[j] = std::ldexp(1.0, std::ilogb(x));
  });
  // Mean and variance by Welford's updates: the sum of squares less the squared mean cancels to
  // noise on columns far from zero (timestamps, meter counters: 1e8 +- 1). The updates run on
  // each value less the column's first, exact for values near it: a running mean near 2^53 would
  // round to its neighbours 2 apart at every update (a spread of 24.30 came out 24.71).
  std::vector<double> lo(n_cols, INFINITY), hi(n_cols, -INFINITY), mean(n_cols), m2(n_cols),
      count(n_cols), origin(n_cols);
  each([&](size_t j, double x) {
    if (std::isnan(x)) return;  // a target transformed over the horizon, at a series' start
    x /= unit[j];
    lo[j] = std::min(lo[j], x);
    hi[j] = std::max(hi[j], x);
    if (count[j] == 0) origin[j] = x;
    count[j] += 1;
    const double delta = (x - origin[j]) - mean[j];
    mean[j] += delta / count[j];
    m2[j] += delta * ((x - origin[j]) - mean[j]);
  });
  for (size_t j = 0; j < n_cols; ++j) {
    if (count[j] == 0) continue;
    if (k == "zscore") {
      const double var = std::max(0.0, m2[j] / count[j]);
      shift[j] = (origin[j] + mean[j]) * unit[j];
      scale[j] = hi[j] > lo[j] && var > 0 ? std::sqrt(var) * unit[j] : 1.0;  // a constant: 1
    } else {
      shift[j] = lo[j] * unit[j];
      scale[j] = hi[j] > lo[j] ? (hi[j] - lo[j]) * unit[j] : 1.0;
      if (!std::isfinite(scale[j]))
        fail("data.normalize: minmax: column ", j, " of the data spans ", lo[j] * unit[j], " to ",
             hi[j] * unit[j], ", a range beyond what a double holds; scale it, or use zscore");
    }
  }
}

int64_t Normalizer::series_index(const std::string& name) const {
  const auto it = std::find(series.begin(), series.end(), name);
  return it == series.end() ? -1 : static_cast<int64_t>(it - series.begin());
}

std::string Normalizer::to_json() const {
  nlohmann::json j{{"kind", kind}, {"shift", shift}, {"scale", scale}};
  if (steps != 1) j["steps"] = steps;
  if (!series.empty()) {
    j["series"] = series;
    j["series_shift"] = series_shift;
    j["series_scale"] = series_scale;
  }
  return j.dump();
}

Normalizer Normalizer::from_json(const std::string& json, const std::string& where) {
  Normalizer n;
  try {
    const auto j = nlohmann::json::parse(json);
    n.kind = j.at("kind").get<std::string>();
    n.shift = j.at("shift").get<std::vector<double>>();
    n.scale = j.at("scale").get<std::vector<double>>();
    n.steps = j.value("steps", int64_t{1});
    if (j.contains("series")) {
      n.series = j.at("series").get<std::vector<std::string>>();
      n.series_shift = j.at("series_shift").get<std::vector<std::vector<double>>>();
      n.series_scale = j.at("series_scale").get<std::vector<std::vector<double>>>();
    }
  } catch (const nlohmann::json::exception&) {
    fail(where, ": not a normalizer (JSON with kind, shift and scale, and per series)");
  }
  if (n.series_shift.size() != n.series.size() || n.series_scale.size() != n.series.size())
    fail(where, ": ", n.series.size(), " series with ", n.series_shift.size(), " shifts and ",
         n.series_scale.size(), " scales");
  for (size_t i = 0; i < n.series.size(); ++i) {
    if (n.series_shift[i].size() != n.shift.size() || n.series_scale[i].size() != n.shift.size())
      fail(where, ": series ", io::quoted(n.series[i]), " has ", n.series_shift[i].size(),
           " shifts and ", n.series_scale[i].size(), " scales for ", n.shift.size(), " columns");
    for (size_t c = 0; c < n.shift.size(); ++c)
      if (!std::isfinite(n.series_shift[i][c]) || !std::isfinite(n.series_scale[i][c]) ||
          n.series_scale[i][c] == 0)
        fail(where, ": series ", io::quoted(n.series[i]), ", column ", c, ": shift ",
             n.series_shift[i][c], " and scale ", n.series_scale[i][c],
             " (finite, and a scale not 0)");
  }
  if (n.kind != "zscore" && n.kind != "minmax" && n.kind != "none")
    fail(where, ": unknown kind '", n.kind, "'");
  if (n.shift.size() != n.scale.size())
    fail(where, ": ", n.shift.size(), " shifts and ", n.scale.size(), " scales");
  if (n.steps < 1 || n.shift.size() % static_cast<size_t>(n.steps) != 0)
    fail(where, ": steps ", n.steps, " does not divide its ", n.shift.size(), " columns");
  for (size_t i = 0; i < n.shift.size(); ++i)
    if (!std::isfinite(n.shift[i]) || !std::isfinite(n.scale[i]) || n.scale[i] == 0)
      fail(where, ": column ", i, ": shift ", n.shift[i], " and scale ", n.scale[i],
           " (finite, and a scale not 0)");
  return n;
}

}  // namespace seqforge
