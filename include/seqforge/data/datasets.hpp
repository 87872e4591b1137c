#pragma once
// Datasets built from a config: windows over a time series (forecast, classify) and chunks of a
// text (charlm), with time-ordered splits and normalisation fitted on the training split only.
#include <cstdint>
#include <string>
#include <vector>

#include "seqforge/train/config.hpp"

namespace seqforge {

// Per column: normalized = (x - shift) / scale.
struct Normalizer {
  std::string kind = "none";  // zscore | minmax | none
  std::vector<double> shift, scale;
  // Fits on the given rows of a (rows, cols) matrix.
  void fit(const std::string& kind, const std::vector<double>& data,
           const std::vector<int64_t>& rows, int64_t cols);
  double apply(double x, int64_t col) const { return (x - shift[col]) / scale[col]; }
  double invert(double y, int64_t col) const { return y * scale[col] + shift[col]; }
  std::string to_json() const;
  static Normalizer from_json(const std::string& json);
};

struct Split {
  std::vector<int64_t> train, val, test;  // window (or chunk) starts
};

// A time series as windows: input rows [s, s + lookback), target at row s + lookback - 1 + horizon
// (mae: horizon 0; the window's own features, some steps masked, are the target).
struct SeriesData {
  std::string task;  // forecast | classify | mae
  int64_t rows = 0, lookback = 0, horizon = 0;
  std::vector<std::string> feature_names, target_names, class_names;
  std::vector<float> features;   // (rows, F) normalized
  std::vector<float> targets;    // (rows, O) normalized (forecast)
  std::vector<int64_t> classes;  // (rows) class ids (classify)
  Normalizer feature_norm, target_norm;
  Split split;
  int64_t num_features() const { return static_cast<int64_t>(feature_names.size()); }
  int64_t num_outputs() const;  // targets (forecast), classes (classify) or features (mae)
  int64_t target_row(int64_t start) const { return start + lookback - 1 + horizon; }
};

// Reads data.path (CSV) per the config. With `norms`, uses those normalizers (eval, predict)
// instead of fitting new ones. Errors name the file and line or the config key.
SeriesData load_series(const Config& config, const SeriesData* norms = nullptr);

// Character-level text: ids over a sorted vocabulary, chunks of seq_len + 1 characters.
struct TextData {
  std::string vocab;         // the distinct characters, sorted
  std::vector<int64_t> ids;  // the whole text
  int64_t seq_len = 0;
  Split split;  // chunk starts; input ids[s, s+T), target ids[s+1, s+T+1)
};

TextData load_text(const Config& config, const std::string& vocab = "");

}  // namespace seqforge
