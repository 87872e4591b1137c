#include "seqforge/data/datasets.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "seqforge/core/error.hpp"
#include "seqforge/core/rng.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/npy.hpp"

namespace seqforge {

void Normalizer::fit(const std::string& k, const std::vector<double>& data,
                     const std::vector<int64_t>& rows, int64_t cols) {
  if (k != "zscore" && k != "minmax" && k != "none")
    fail("data.normalize: unknown value '", k, "' (expected zscore, minmax or none)");
  kind = k;
  shift.assign(cols, 0.0);
  scale.assign(cols, 1.0);
  if (k == "none" || rows.empty()) return;
  const double n = static_cast<double>(rows.size());
  for (int64_t c = 0; c < cols; ++c) {
    double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0;
    for (int64_t r : rows) {
      const double x = data[r * cols + c];
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      sum += x;
      sq += x * x;
    }
    if (k == "zscore") {
      const double mean = sum / n, var = std::max(0.0, sq / n - mean * mean);
      shift[c] = mean;
      scale[c] = var > 1e-24 ? std::sqrt(var) : 1.0;  // a constant column stays as it is
    } else {
      shift[c] = lo;
      scale[c] = hi > lo ? hi - lo : 1.0;
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

// The columns of a data file: a CSV (named columns) or a 2-D .npy array (columns "0", "1", ...).
class Columns {
 public:
  explicit Columns(const std::string& path) : path_(path) {
    if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0) {
      npy_ = io::read_npy(path);
      if (npy_.shape.size() != 2)
        fail(path, ": expected a 2-D array (rows, columns), got ", npy_.shape.size(),
             " dimensions");
      rows_ = npy_.shape[0];
      for (int64_t j = 0; j < npy_.shape[1]; ++j) names_.push_back(std::to_string(j));
    } else {
      csv_ = std::make_unique<io::CsvTable>(io::CsvTable::read(path));
      rows_ = csv_->rows();
      names_ = csv_->columns();
    }
  }
  int64_t rows() const { return rows_; }
  const std::vector<std::string>& columns() const { return names_; }
  bool has_column(const std::string& name) const {
    return std::find(names_.begin(), names_.end(), name) != names_.end();
  }
  std::vector<double> numeric(const std::string& name) const {
    if (csv_) return csv_->numeric(name);
    const int64_t j = std::find(names_.begin(), names_.end(), name) - names_.begin();
    const int64_t cols = static_cast<int64_t>(names_.size());
    std::vector<double> all(rows_ * cols), out(rows_);
    convert(npy_.data.data(), npy_.dtype, all.data(), DType::f64, all.size());
    for (int64_t r = 0; r < rows_; ++r) {
      out[r] = all[r * cols + j];
      if (!std::isfinite(out[r]))
        fail(where(r), ": column ", j, ": ", out[r], " is not a finite number");
    }
    return out;
  }
  const std::vector<std::string>& text(const std::string& name) const {
    if (!csv_) fail(path_, ": a .npy array has no text column '", name, "'");
    return csv_->text(name);
  }
  // "<path>:<line>" for a CSV row, "<path>: row <r>" for an array row.
  std::string where(int64_t row) const {
    return csv_ ? path_ + ":" + std::to_string(csv_->line_of_row(row))
                : path_ + ": row " + std::to_string(row);
  }

 private:
  std::string path_;
  std::unique_ptr<io::CsvTable> csv_;
  io::NpyArray npy_;
  int64_t rows_ = 0;
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
  const Columns table(path);
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
  const int64_t F = d.num_features();
  auto matrix = [&](const std::vector<std::string>& names, const char* key) {
    std::vector<double> m(d.rows * names.size());
    for (size_t j = 0; j < names.size(); ++j) {
      if (!table.has_column(names[j]))
        fail(c.source(), ": ", key, ": ", path, " has no column '", names[j], "'");
      const std::vector<double> col = table.numeric(names[j]);
      for (int64_t r = 0; r < d.rows; ++r) m[r * names.size() + j] = col[order[r]];
    }
    return m;
  };
  const std::vector<double> x = matrix(d.feature_names, "data.features");
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
  // Fits `norm` on the training rows (unless given), then normalizes the (rows, cols) matrix.
  auto normalize = [&](const std::vector<double>& m, int64_t cols, const Normalizer* given,
                       Normalizer* norm, std::vector<float>* out) {
    if (given) {
      *norm = *given;
    } else {
      norm->fit(c.str("data.normalize"), m, train_rows, cols);
    }
    out->resize(m.size());
    for (int64_t r = 0; r < d.rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        (*out)[r * cols + j] = static_cast<float>(norm->apply(m[r * cols + j], j));
  };
  normalize(x, F, norms ? &norms->feature_norm : nullptr, &d.feature_norm, &d.features);
  if (d.task == "forecast") {
    normalize(matrix(d.target_names, "data.targets"), static_cast<int64_t>(d.target_names.size()),
              norms ? &norms->target_norm : nullptr, &d.target_norm, &d.targets);
  } else if (d.task == "classify" && c.str("data.label") == "direction") {
    // Class of row r: up when the column is higher than `horizon` rows earlier.
    const std::vector<double> v = matrix({c.str("data.label_column")}, "data.label_column");
    d.class_names = {"down", "up"};
    d.classes.assign(d.rows, 0);
    for (int64_t r = d.horizon; r < d.rows; ++r) d.classes[r] = v[r] > v[r - d.horizon] ? 1 : 0;
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

}  // namespace seqforge
