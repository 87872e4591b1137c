#include "seqforge/data/datasets.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "seqforge/core/error.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/file_stamp.hpp"
#include "seqforge/io/npy.hpp"

namespace seqforge {

void Normalizer::fit(const std::string& k, const SourceMatrix& m, const std::vector<int64_t>& cols,
                     const std::vector<int64_t>& rows) {
  if (k != "zscore" && k != "minmax" && k != "none")
    fail("data.normalize: unknown value '", k, "' (expected zscore, minmax or none)");
  kind = k;
  const size_t n_cols = cols.size();
  shift.assign(n_cols, 0.0);
  scale.assign(n_cols, 1.0);
  if (k == "none" || rows.empty()) return;
  const double n = static_cast<double>(rows.size());
  std::vector<double> lo(n_cols, INFINITY), hi(n_cols, -INFINITY), sum(n_cols), sq(n_cols);
  for (int64_t r : rows)  // row by row: one pass over a memory-mapped source
    for (size_t j = 0; j < n_cols; ++j) {
      const double x = m.at(r, cols[j]);
      lo[j] = std::min(lo[j], x);
      hi[j] = std::max(hi[j], x);
      sum[j] += x;
      sq[j] += x * x;
    }
  for (size_t j = 0; j < n_cols; ++j) {
    if (k == "zscore") {
      const double mean = sum[j] / n, var = std::max(0.0, sq[j] / n - mean * mean);
      shift[j] = mean;
      scale[j] = var > 1e-24 ? std::sqrt(var) : 1.0;  // a constant column stays as it is
    } else {
      shift[j] = lo[j];
      scale[j] = hi[j] > lo[j] ? hi[j] - lo[j] : 1.0;
    }
  }
}

std::string Normalizer::to_json() const {
  return nlohmann::json{{"kind", kind}, {"shift", shift}, {"scale", scale}}.dump();
}

Normalizer Normalizer::from_json(const std::string& json) {
  const auto j = nlohmann::json::parse(json);
  Normalizer n;
  n.kind = j.at("kind").get<std::string>();
  n.shift = j.at("shift").get<std::vector<double>>();
  n.scale = j.at("scale").get<std::vector<double>>();
  return n;
}

int64_t SeriesData::num_outputs() const {
  if (task == "mae") return num_features();
  return task == "classify" ? static_cast<int64_t>(class_names.size())
                            : static_cast<int64_t>(target_names.size());
}

namespace {

// Rows [first, first + n) of columns `cols`, normalised, into out (n, cols.size()).
template <typename T>
void copy_normalized(const SourceMatrix& m, int64_t first, int64_t n,
                     const std::vector<int64_t>& cols, const Normalizer& norm, float* out) {
  const T* src = reinterpret_cast<const T*>(m.data) + first * m.cols;
  const size_t width = cols.size();
  for (int64_t r = 0; r < n; ++r, src += m.cols)
    for (size_t j = 0; j < width; ++j)
      *out++ =
          static_cast<float>((static_cast<double>(src[cols[j]]) - norm.shift[j]) / norm.scale[j]);
}

void copy_rows(const SourceMatrix& m, int64_t first, int64_t n, const std::vector<int64_t>& cols,
               const Normalizer& norm, float* out) {
  if (m.dtype == DType::f32) {
    copy_normalized<float>(m, first, n, cols, norm, out);
  } else {
    copy_normalized<double>(m, first, n, cols, norm, out);
  }
}

}  // namespace

void SeriesData::copy_window(int64_t start, float* out) const {
  copy_rows(source, start, lookback, feature_cols, feature_norm, out);
}

void SeriesData::copy_target(int64_t start, float* out) const {
  copy_rows(source, target_row(start), 1, target_cols, target_norm, out);
}

void Dataset::check_source() const {
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

namespace {

// Split boundaries [0, a), [a, b), [b, n) from the train and val shares.
std::pair<int64_t, int64_t> boundaries(const Config& c, int64_t n) {
  const double train = c.number("data.split.train"), val = c.number("data.split.val");
  if (!(train > 0 && train <= 1))
    fail(c.source(), ": data.split.train must be in (0, 1], got ", train);
  if (!(val >= 0 && train + val <= 1 + 1e-9))
    fail(c.source(), ": data.split.val must be >= 0 with train + val <= 1, got ", val);
  const int64_t a = static_cast<int64_t>(std::floor(train * n));
  const int64_t b = std::min<int64_t>(n, static_cast<int64_t>(std::floor((train + val) * n)));
  return {a, b};
}

// Whole windows (or chunks) dealt at random, with train.seed, by the split shares.
void random_split(const Config& c, std::vector<int64_t> all, Split* out) {
  Rng rng(static_cast<uint64_t>(c.integer("train.seed")) ^ 0x5b117ull);
  for (int64_t i = static_cast<int64_t>(all.size()) - 1; i > 0; --i)
    std::swap(all[i], all[rng.next() % (i + 1)]);
  const auto [a, b] = boundaries(c, static_cast<int64_t>(all.size()));
  out->train.assign(all.begin(), all.begin() + a);
  out->val.assign(all.begin() + a, all.begin() + b);
  out->test.assign(all.begin() + b, all.end());
  for (auto* v : {&out->train, &out->val, &out->test}) std::sort(v->begin(), v->end());
}

int64_t positive(const Config& c, const std::string& key) {
  const int64_t v = c.integer(key);
  if (v <= 0) fail(c.source(), ": ", key, " must be positive, got ", v);
  return v;
}

// A mapped file cut short under the process makes reading it raise SIGBUS: say which file it was
// and exit (checkpoints are written atomically, so the last one stays whole).
char sigbus_message[512];
void report_sigbus(int) {
  const ssize_t n = ::write(STDERR_FILENO, sigbus_message, std::strlen(sigbus_message));
  (void)n;
  ::_exit(1);
}
void on_sigbus_report(const std::string& path) {
  std::snprintf(
      sigbus_message, sizeof sigbus_message,
      "seqforge: error: %.400s: the memory-mapped data file was truncated during the run\n",
      path.c_str());
  struct sigaction action {};
  action.sa_handler = report_sigbus;
  ::sigaction(SIGBUS, &action, nullptr);
}

// A data file: a CSV (named columns, read whole) or a 2-D .npy array (columns "0", "1", ...;
// float arrays stay memory-mapped).
class DataFile {
 public:
  explicit DataFile(const std::string& path) : path_(path) {
    if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0) {
      io::MappedNpy mapped = io::map_npy(path);
      if (mapped.shape.size() != 2)
        fail(path, ": expected a 2-D array (rows, columns), got ", mapped.shape.size(),
             " dimensions");
      matrix_.rows = mapped.shape[0];
      matrix_.cols = mapped.shape[1];
      if (mapped.dtype == DType::f32 || mapped.dtype == DType::f64) {
        matrix_.dtype = mapped.dtype;
        matrix_.data = mapped.data;
        matrix_.owner = mapped.mapping;
        on_sigbus_report(path);
      } else {  // integers: converted in memory
        auto values = std::make_shared<std::vector<double>>(matrix_.rows * matrix_.cols);
        convert(mapped.data, mapped.dtype, values->data(), DType::f64, values->size());
        matrix_.dtype = DType::f64;
        matrix_.data = reinterpret_cast<const std::byte*>(values->data());
        matrix_.owner = values;
      }
      for (int64_t j = 0; j < matrix_.cols; ++j) names_.push_back(std::to_string(j));
    } else {
      csv_ = std::make_unique<io::CsvTable>(io::CsvTable::read(path));
      names_ = csv_->columns();
    }
  }
  int64_t rows() const { return csv_ ? csv_->rows() : matrix_.rows; }
  const std::vector<std::string>& columns() const { return names_; }
  bool has_column(const std::string& name) const {
    return std::find(names_.begin(), names_.end(), name) != names_.end();
  }
  const std::vector<std::string>& text(const std::string& name) const {
    if (!csv_) fail(path_, ": a .npy array has no text column '", name, "'");
    return csv_->text(name);
  }
  // The named numeric columns, rows in `order`: a new matrix of just those columns for a CSV,
  // the mapped array itself for a .npy file (`order` is then the file order). Every value used
  // must be finite.
  SourceMatrix numeric(const std::vector<std::string>& names, const std::vector<int64_t>& order,
                       std::vector<int64_t>* cols) const {
    cols->clear();
    if (!csv_) {
      for (const auto& name : names) cols->push_back(std::stoll(name));
      for (int64_t r = 0; r < matrix_.rows; ++r)
        for (int64_t j : *cols)
          if (const double x = matrix_.at(r, j); !std::isfinite(x))
            fail(path_, ": row ", r, ", column ", j, ": ", x, " is not a finite number");
      return matrix_;
    }
    const int64_t n = csv_->rows(), width = static_cast<int64_t>(names.size());
    auto values = std::make_shared<std::vector<double>>(n * width);
    for (int64_t j = 0; j < width; ++j) {
      const std::vector<double> col = csv_->numeric(names[j]);
      for (int64_t r = 0; r < n; ++r) (*values)[r * width + j] = col[order[r]];
      cols->push_back(j);
    }
    SourceMatrix m;
    m.dtype = DType::f64;
    m.rows = n;
    m.cols = width;
    m.data = reinterpret_cast<const std::byte*>(values->data());
    m.owner = values;
    return m;
  }
  // "<path>:<line>" for a CSV row, "<path>: row <r>" for an array row.
  std::string where(int64_t row) const {
    return csv_ ? path_ + ":" + std::to_string(csv_->line_of_row(row))
                : path_ + ": row " + std::to_string(row);
  }

 private:
  std::string path_;
  std::unique_ptr<io::CsvTable> csv_;
  SourceMatrix matrix_;
  std::vector<std::string> names_;
};

}  // namespace

SeriesData load_series(const Config& c, const SeriesData* norms) {
  SeriesData d;
  d.task = c.str("data.task");
  d.lookback = positive(c, "data.lookback");
  d.horizon = c.integer("data.horizon");
  if (d.horizon < (d.task == "classify" ? 0 : 1))
    fail(c.source(), ": data.horizon must be ", d.task == "classify" ? ">= 0" : "positive",
         ", got ", d.horizon);
  const int64_t stride = positive(c, "data.stride");
  const std::string path = c.str("data.path");
  if (path.empty()) fail(c.source(), ": data.path is required");
  const DataFile table(path);
  const std::string date_col = c.str("data.date_column"), class_col = c.str("data.class_column");
  for (const auto& [key, col] :
       {std::pair{"data.date_column", date_col}, {"data.class_column", class_col}})
    if (!col.empty() && !table.has_column(col))
      fail(c.source(), ": ", key, ": ", path, " has no column '", col, "'");

  // Row order: by the date column when given, else file order.
  std::vector<int64_t> order(table.rows());
  std::iota(order.begin(), order.end(), 0);
  if (!date_col.empty()) {
    const auto& dates = table.text(date_col);
    std::vector<int64_t> when(table.rows());
    for (int64_t r = 0; r < table.rows(); ++r) {
      const auto t = io::parse_datetime(dates[r]);
      if (!t)
        fail(table.where(r), ": column '", date_col, "': '", dates[r],
             "' is not an ISO date or date-time");
      when[r] = *t;
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return when[a] < when[b]; });
  }

  d.feature_names = c.list("data.features");
  if (d.feature_names.empty())
    for (const auto& col : table.columns())
      if (col != date_col && col != class_col) d.feature_names.push_back(col);
  if (d.task == "forecast") {
    d.target_names = c.list("data.targets");
    if (d.target_names.empty())
      fail(c.source(), ": data.targets is required for data.task forecast");
  } else if (d.task == "classify") {
    const std::string label = c.str("data.label");
    if (label != "column" && label != "direction")
      fail(c.source(), ": data.label must be column or direction, got '", label, "'");
    if (label == "column" && class_col.empty())
      fail(c.source(), ": data.class_column is required for data.task classify");
    if (label == "direction" && c.str("data.label_column").empty())
      fail(c.source(), ": data.label_column is required for data.label direction");
    if (label == "direction" && d.horizon < 1)
      fail(c.source(), ": data.horizon must be positive for data.label direction");
  } else if (d.task == "mae") {
    d.horizon = 0;  // the window itself is the target
  } else {
    fail(c.source(), ": data.task: '", d.task,
         "' is not a time-series task (forecast, classify, mae)");
  }
  d.rows = table.rows();
  // The source: features, then targets, then the direction label's column.
  std::vector<std::string> used = d.feature_names;
  const std::string label_col =
      d.task == "classify" && c.str("data.label") == "direction" ? c.str("data.label_column") : "";
  for (const auto& [names, key] :
       {std::pair{&d.feature_names, "data.features"}, {&d.target_names, "data.targets"}})
    for (const auto& name : *names)
      if (!table.has_column(name))
        fail(c.source(), ": ", key, ": ", path, " has no column '", name, "'");
  if (!label_col.empty() && !table.has_column(label_col))
    fail(c.source(), ": data.label_column: ", path, " has no column '", label_col, "'");
  for (const auto& name : d.target_names) used.push_back(name);
  if (!label_col.empty()) used.push_back(label_col);
  std::vector<int64_t> used_cols;
  d.source = table.numeric(used, order, &used_cols);
  const int64_t F = d.num_features(), O = static_cast<int64_t>(d.target_names.size());
  d.feature_cols.assign(used_cols.begin(), used_cols.begin() + F);
  d.target_cols.assign(used_cols.begin() + F, used_cols.begin() + F + O);
  const auto [train_end, val_end] = boundaries(c, d.rows);
  const std::string mode = c.str("data.split.mode");
  if (mode != "time" && mode != "random")
    fail(c.source(), ": data.split.mode must be time or random, got '", mode, "'");
  auto windows = [&](int64_t begin, int64_t end, std::vector<int64_t>* out) {
    for (int64_t s = begin; d.target_row(s) < end; s += stride) out->push_back(s);
  };
  if (mode == "time") {  // windows wholly inside one split
    windows(0, train_end, &d.split.train);
    windows(train_end, val_end, &d.split.val);
    windows(val_end, d.rows, &d.split.test);
  } else {
    std::vector<int64_t> all;
    windows(0, d.rows, &all);
    random_split(c, all, &d.split);
  }
  // Normalisation statistics come from the rows the training windows cover, and no others.
  std::vector<int64_t> train_rows;
  {
    std::vector<char> used(d.rows, 0);
    for (int64_t s : d.split.train)
      for (int64_t r = s; r <= std::max(d.target_row(s), s + d.lookback - 1); ++r) used[r] = 1;
    for (int64_t r = 0; r < d.rows; ++r)
      if (used[r]) train_rows.push_back(r);
  }
  if (norms) {
    d.feature_norm = norms->feature_norm;
    d.target_norm = norms->target_norm;
  } else {
    d.feature_norm.fit(c.str("data.normalize"), d.source, d.feature_cols, train_rows);
    if (d.task == "forecast")
      d.target_norm.fit(c.str("data.normalize"), d.source, d.target_cols, train_rows);
  }
  if (!label_col.empty()) {
    // Class of row r: up when the column is higher than `horizon` rows earlier.
    const int64_t col = used_cols.back();
    d.class_names = {"down", "up"};
    d.classes.assign(d.rows, 0);
    for (int64_t r = d.horizon; r < d.rows; ++r)
      d.classes[r] = d.source.at(r, col) > d.source.at(r - d.horizon, col) ? 1 : 0;
  } else if (d.task == "classify") {
    const auto& names = table.text(class_col);
    if (norms) {
      d.class_names = norms->class_names;
    } else {
      d.class_names = names;
      std::sort(d.class_names.begin(), d.class_names.end());
      d.class_names.erase(std::unique(d.class_names.begin(), d.class_names.end()),
                          d.class_names.end());
    }
    d.classes.resize(d.rows);
    for (int64_t r = 0; r < d.rows; ++r) {
      const auto& name = names[order[r]];
      const auto it = std::lower_bound(d.class_names.begin(), d.class_names.end(), name);
      if (it == d.class_names.end() || *it != name)
        fail(table.where(order[r]), ": class '", name, "' was not seen in training");
      d.classes[r] = it - d.class_names.begin();
    }
  }
  const double fraction = c.number("data.label_fraction");
  if (!(fraction > 0 && fraction <= 1))
    fail(c.source(), ": data.label_fraction must be in (0, 1], got ", fraction);
  if (fraction < 1 && !norms) {  // a fixed random subset of the training windows, kept in order
    Rng rng(static_cast<uint64_t>(c.integer("train.seed")) ^ 0x1abe1ull);
    std::vector<int64_t> pick(d.split.train.size());
    std::iota(pick.begin(), pick.end(), 0);
    for (int64_t i = static_cast<int64_t>(pick.size()) - 1; i > 0; --i)
      std::swap(pick[i], pick[rng.next() % (i + 1)]);
    pick.resize(std::max<size_t>(1, static_cast<size_t>(std::ceil(fraction * pick.size()))));
    std::sort(pick.begin(), pick.end());
    std::vector<int64_t> kept;
    for (int64_t i : pick) kept.push_back(d.split.train[i]);
    d.split.train = std::move(kept);
  }
  if (d.split.train.empty())
    fail(path, ": ", d.rows, " rows give no training window: the training split (", train_end,
         " rows) is shorter than data.lookback + data.horizon = ", d.lookback + d.horizon);
  return d;
}

TextData load_text(const Config& c, const std::string& vocab) {
  TextData d;
  d.seq_len = positive(c, "data.seq_len");
  const std::string path = c.str("data.path");
  if (path.empty()) fail(c.source(), ": data.path is required");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.empty()) fail(path, ": empty file");
  d.vocab = vocab;
  if (d.vocab.empty()) {
    d.vocab = text;
    std::sort(d.vocab.begin(), d.vocab.end());
    d.vocab.erase(std::unique(d.vocab.begin(), d.vocab.end()), d.vocab.end());
  }
  int64_t index[256];
  std::fill(std::begin(index), std::end(index), -1);
  for (size_t i = 0; i < d.vocab.size(); ++i) index[static_cast<unsigned char>(d.vocab[i])] = i;
  d.ids.resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int64_t id = index[static_cast<unsigned char>(text[i])];
    if (id < 0) fail(path, ": byte ", i, ": character not in the model's vocabulary");
    d.ids[i] = id;
  }
  const int64_t n = static_cast<int64_t>(d.ids.size());
  const auto [train_end, val_end] = boundaries(c, n);
  auto chunks = [&](int64_t begin, int64_t end, std::vector<int64_t>* out) {
    for (int64_t s = begin; s + d.seq_len + 1 <= end; s += d.seq_len) out->push_back(s);
  };
  if (c.str("data.split.mode") == "random") {
    std::vector<int64_t> all;
    chunks(0, n, &all);
    random_split(c, all, &d.split);
  } else {
    chunks(0, train_end, &d.split.train);
    chunks(train_end, val_end, &d.split.val);
    chunks(val_end, n, &d.split.test);
  }
  if (d.split.train.empty())
    fail(path, ": the training split (", train_end,
         " characters) is shorter than data.seq_len + 1");
  return d;
}

Dataset load_dataset(const Config& c, const Dataset* from) {
  Dataset d;
  d.kind = c.str("data.task");
  d.path = c.str("data.path");
  if (d.path.empty()) fail(c.source(), ": data.path is required");
  if (d.kind == "charlm") {
    d.text = load_text(c, from ? from->text.vocab : "");
  } else if (d.kind == "forecast" || d.kind == "classify" || d.kind == "mae") {
    d.series = load_series(c, from ? &from->series : nullptr);
    d.mask_ratio = c.number("data.mask_ratio");
    if (!(d.mask_ratio > 0 && d.mask_ratio < 1))
      fail(c.source(), ": data.mask_ratio must be in (0, 1), got ", d.mask_ratio);
  } else {
    fail(c.source(), ": data.task: unknown task '", d.kind,
         "' (expected forecast, classify, mae or charlm)");
  }
  d.stamp = io::stamp_of(d.path);
  return d;
}

}  // namespace seqforge
