#pragma once
// Datasets built from a config: windows over a time series (forecast, classify, mae) and chunks
// of a text (charlm), with time-ordered splits and normalisation fitted on the training split
// only. Windows are read from the source when a batch is assembled and normalised as they are
// copied, so a memory-mapped .npy source is never loaded whole.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "seqforge/core/dtype.hpp"
#include "seqforge/io/file_stamp.hpp"
#include "seqforge/train/config.hpp"

namespace seqforge {

// (rows, cols) source values, rows in time order: in memory (a CSV) or memory-mapped (a float
// .npy file).
struct SourceMatrix {
  DType dtype = DType::f64;  // f32 or f64
  int64_t rows = 0, cols = 0;
  const std::byte* data = nullptr;
  std::shared_ptr<const void> owner;  // the memory or the mapping
  double at(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    return dtype == DType::f32 ? reinterpret_cast<const float*>(data)[i]
                               : reinterpret_cast<const double*>(data)[i];
  }
};

// Per column: normalized = (x - shift) / scale.
struct Normalizer {
  std::string kind = "none";  // zscore | minmax | none
  std::vector<double> shift, scale;
  // Fits on the given rows of the given columns of `m`.
  void fit(const std::string& kind, const SourceMatrix& m, const std::vector<int64_t>& cols,
           const std::vector<int64_t>& rows);
  double invert(double y, int64_t col) const { return y * scale[col] + shift[col]; }
  std::string to_json() const;
  static Normalizer from_json(const std::string& json);
};

struct Split {
  std::vector<int64_t> train, val, test;  // window (or chunk) starts, ascending
};

// A time series as windows: input rows [s, s + lookback), target at row s + lookback - 1 + horizon
// (mae: horizon 0; the window's own features, some steps masked, are the target).
struct SeriesData {
  std::string task;  // forecast | classify | mae
  int64_t rows = 0, lookback = 0, horizon = 0;
  std::vector<std::string> feature_names, target_names, class_names;
  SourceMatrix source;
  std::vector<int64_t> feature_cols, target_cols;  // columns of `source`
  std::vector<int64_t> classes;                    // (rows) class ids (classify)
  Normalizer feature_norm, target_norm;
  Split split;
  int64_t num_features() const { return static_cast<int64_t>(feature_names.size()); }
  int64_t num_outputs() const;  // targets (forecast), classes (classify) or features (mae)
  int64_t target_row(int64_t start) const { return start + lookback - 1 + horizon; }
  // The normalised features of window `start`, (lookback, F), into `out`.
  void copy_window(int64_t start, float* out) const;
  // The normalised targets of window `start`, (O), into `out` (forecast).
  void copy_target(int64_t start, float* out) const;
};

// Reads data.path (CSV or .npy) per the config. With `norms`, uses those normalizers (eval,
// predict) instead of fitting new ones. Errors name the file and line or the config key.
SeriesData load_series(const Config& config, const SeriesData* norms = nullptr);

// Character-level text: ids over a sorted vocabulary, chunks of seq_len + 1 characters.
struct TextData {
  std::string vocab;         // the distinct characters, sorted
  std::vector<int64_t> ids;  // the whole text
  int64_t seq_len = 0;
  Split split;  // chunk starts; input ids[s, s+T), target ids[s+1, s+T+1)
};

TextData load_text(const Config& config, const std::string& vocab = "");

// A task's data and where it came from.
struct Dataset {
  std::string kind;          // forecast | classify | mae | charlm
  double mask_ratio = 0.15;  // mae: the share of time steps masked
  SeriesData series;
  TextData text;
  std::string path;     // data.path
  io::FileStamp stamp;  // of `path` when it was read
  const Split& split() const { return kind == "charlm" ? text.split : series.split; }
  int64_t steps() const { return kind == "charlm" ? text.seq_len : series.lookback; }
  // Throws when the source file changed or disappeared since it was read: a run must not
  // silently continue on different data.
  void check_source() const;
};

// Loads data.path per the config; with `from`, reuses its normalisation, classes and vocabulary.
Dataset load_dataset(const Config& config, const Dataset* from = nullptr);

}  // namespace seqforge
