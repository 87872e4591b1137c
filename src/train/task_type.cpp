#include "task_type.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/train/trainer.hpp"

namespace seqforge {

namespace {

std::string shortest_text(double x) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
}

template <typename Value>
Value metadata_json(const std::map<std::string, std::string>& meta, const std::string& key,
                    const std::string& where) {
  const auto it = meta.find(key);
  if (it == meta.end()) fail(where, ": no ", key, " metadata (not a seqforge checkpoint?)");
  const auto j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  try {
    return j.get<Value>();
  } catch (const nlohmann::json::exception&) {
    fail(where, ": ", key, " metadata is not what seqforge wrote");
  }
}

// One-hot columns with their categories (data.static, data.categorical), none where the key is
// absent; each column's categories sorted and distinct, as the lookups at inference need. A
// data.categorical column may have none (each left out: no training window read it).
std::vector<std::pair<std::string, std::vector<std::string>>> categories(
    const std::map<std::string, std::string>& meta, const std::string& key,
    const std::string& where) {
  if (!meta.count(key)) return {};
  auto columns = metadata_json<std::vector<std::pair<std::string, std::vector<std::string>>>>(
      meta, key, where);
  for (const auto& [column, values] : columns)
    if ((values.empty() && key == "seqforge.static") ||
        std::adjacent_find(values.begin(), values.end(), std::greater_equal<>()) != values.end())
      fail(where, ": ", key, " metadata: the categories of '", column,
           "' are not sorted and distinct, as seqforge writes them");
  return columns;
}

// Forecasting, classification and the masked autoencoder read windows of a time series: their
// checkpoints keep the normalisation, the class names and the label threshold.
class SeriesTask : public TaskType {
 public:
  void shape_model(const Config&, const Dataset& d, ModelOptions* m) const override {
    m->rnn.input_size = d.series.num_features();
    m->output_size = d.series.num_outputs();
    m->per_step = kind() == TaskKind::mae || d.series.every_step;
  }
  int64_t bytes_per_step(const Dataset& d) const override {
    return 4 * (2 * d.series.num_features() + 1);
  }
  int64_t loss_terms(const Dataset&, const Batch&, int64_t first, int64_t end) const override {
    return end - first;
  }
  void store(const Config& c, const Dataset& d,
             std::map<std::string, std::string>* meta) const override {
    (*meta)["seqforge.feature_norm"] = d.series.feature_norm.to_json();
    (*meta)["seqforge.target_norm"] = d.series.target_norm.to_json();
    (*meta)["seqforge.classes"] = nlohmann::json(d.series.class_names).dump();
    (*meta)["seqforge.features"] = nlohmann::json(d.series.feature_names).dump();
    (*meta)["seqforge.targets"] = nlohmann::json(d.series.target_names).dump();
    if (!d.series.static_categories.empty())
      (*meta)["seqforge.static"] = nlohmann::json(d.series.static_categories).dump();
    if (!d.series.categories.empty())
      (*meta)["seqforge.categorical"] = nlohmann::json(d.series.categories).dump();
    if (kind() == TaskKind::classify && c.str("data.label") == "volatility")
      (*meta)["seqforge.label_threshold"] = shortest_text(d.series.label_threshold);
    if (const std::string step = d.series.usual_step(); !step.empty())
      (*meta)["seqforge.step"] = step;
    if (d.series.array_columns > 0)
      (*meta)["seqforge.array_columns"] = std::to_string(d.series.array_columns);
    // data.holidays' days travel with the model: predict dates by them without the file.
    if (!d.series.holidays.empty())
      (*meta)["seqforge.holidays"] = nlohmann::json(d.series.holidays).dump();
  }
  void restore(const std::map<std::string, std::string>& meta, const std::string& where,
               Dataset* stored) const override {
    auto text = [&](const char* key) {
      const auto it = meta.find(key);
      if (it == meta.end()) fail(where, ": no ", key, " metadata (not a seqforge checkpoint?)");
      return it->second;
    };
    stored->series.feature_norm =
        Normalizer::from_json(text("seqforge.feature_norm"), where + ": seqforge.feature_norm");
    stored->series.target_norm =
        Normalizer::from_json(text("seqforge.target_norm"), where + ": seqforge.target_norm");
    stored->series.class_names =
        metadata_json<std::vector<std::string>>(meta, "seqforge.classes", where);
    stored->series.static_categories = categories(meta, "seqforge.static", where);
    stored->series.categories = categories(meta, "seqforge.categorical", where);
    if (const auto it = meta.find("seqforge.label_threshold"); it != meta.end()) {
      const double v = io::parse_double(it->second).value_or(NAN);
      if (!std::isfinite(v) || v < 0)
        fail(where, ": seqforge.label_threshold is not a volatility (a finite number >= 0): '",
             it->second, "'");
      stored->series.label_threshold = v;
    }
    if (const auto it = meta.find("seqforge.step"); it != meta.end()) {
      const std::string& step = it->second;  // "1 hour": a number and a unit, for a note
      if (step.size() > 40 || step.empty() || !std::isdigit(static_cast<unsigned char>(step[0])) ||
          !std::all_of(step.begin(), step.end(), [](char ch) {
            return std::isdigit(static_cast<unsigned char>(ch)) || (ch >= 'a' && ch <= 'z') ||
                   ch == ' ';
          }))
        fail(where, ": seqforge.step is not a step such as '1 hour': ", io::quoted(step));
      stored->series.trained_step = step;
    }
    if (const auto it = meta.find("seqforge.array_columns"); it != meta.end()) {
      int64_t n = 0;
      const auto [end, ec] =
          std::from_chars(it->second.data(), it->second.data() + it->second.size(), n);
      if (ec != std::errc() || end != it->second.data() + it->second.size() || n < 1)
        fail(where, ": seqforge.array_columns is not a count of columns: ", io::quoted(it->second));
      stored->series.array_columns = n;
    }
    if (meta.count("seqforge.holidays")) {
      stored->series.holidays =
          metadata_json<std::vector<int64_t>>(meta, "seqforge.holidays", where);
      if (!std::is_sorted(stored->series.holidays.begin(), stored->series.holidays.end()))
        fail(where, ": seqforge.holidays is not a sorted list of days");
    }
    // Checkpoints written before the names were stored leave them empty: the data file names
    // the columns then.
    if (meta.count("seqforge.features")) {
      auto& f = stored->series;
      f.feature_names = metadata_json<std::vector<std::string>>(meta, "seqforge.features", where);
      f.target_names = metadata_json<std::vector<std::string>>(meta, "seqforge.targets", where);
      const size_t targets =
          kind() == TaskKind::forecast ? f.target_norm.shift.size() / f.target_norm.steps : 0;
      if (f.feature_names.size() != f.feature_norm.shift.size() || f.target_names.size() != targets)
        fail(where, ": seqforge.features and seqforge.targets name ", f.feature_names.size(),
             " and ", f.target_names.size(), " columns where the normalizers hold ",
             f.feature_norm.shift.size(), " and ", targets);
    }
  }
};

// Errors in the targets' own units, transforms undone: MSE, RMSE, MAE; beside them, on the same
// windows (less those whose baseline value is an empty cell: data.missing mask, eval --data), the
// naive forecast's (each target predicted by the last value of its window) and with
// data.season the seasonal-naive one's (by the value of the last season the window holds: h steps
// ahead, the value ceil(h / season) seasons before the target), the model's skill against naive
// (1 - MSE / naive MSE, both over the values naive has) and MASE (per target, MAE over the mean
// absolute one-step, or seasonal, difference of the training part's targets; averaged over
// targets). A direct multi-step forecast adds each step's MAE and RMSE (val_mae_h1, ...) and
// seasonal naive's MAE (val_snaive_mae_h1,
// ...). With quantiles, the errors are the point quantile's (the median's), beside the pinball loss
// in the targets' units (val_pinball) and the share of actuals between the lowest and highest
// quantile (val_coverage).
class ForecastSums final : public MetricSums {
 public:
  explicit ForecastSums(const SeriesData& d)
      : d_(d),
        targets_(d.num_targets()),
        model_abs_(targets_, 0.0),
        scale_(targets_, 0.0),
        scale_terms_(targets_, 0),
        steps_(d.steps_ahead > 1 ? d.steps_ahead : 0) {
    // MASE's scale, from the rows the training windows' targets cover.
    const int64_t lag = d.season > 0 ? d.season : 1;
    std::vector<char> covered(static_cast<size_t>(d.rows), 0);
    for (int64_t s : d.split.train)
      for (int64_t k = 0; k < d.steps_ahead; ++k) covered[d.target_row(s, k)] = 1;
    for (int64_t t = 0; t < d.rows; ++t) {
      if (!covered[t] || t - lag < d.series_of(t).begin) continue;
      for (int64_t j = 0; j < targets_; ++j) {
        const double diff = d.target_value(t, j) - d.target_value(t - lag, j);
        if (!std::isfinite(diff)) continue;
        scale_[j] += std::fabs(diff);
        ++scale_terms_[j];
      }
    }
    for (int64_t j = 0; j < targets_; ++j)
      scale_[j] = scale_terms_[j] > 0 ? scale_[j] / double(scale_terms_[j]) : 0.0;
  }
  std::string absent(const std::string& name) const override {
    if (name != "val_mase") return "";
    for (int64_t j = 0; j < targets_; ++j) {
      if (scale_[j] > 0) continue;
      const std::string change =
          d_.season > 0 ? std::to_string(d_.season) + "-step (data.season)" : "one-step";
      return "MASE divides by the mean absolute " + change + " change of target '" +
             d_.target_names[size_t(j)] + "' over the training rows, which " +
             (scale_terms_[j] == 0
                  ? "have none (no training row has a value that many rows before it in its "
                    "series)"
                  : "is 0 (the target does not change there)");
    }
    return "";
  }
  void add(const float* o, const Batch& b, const int64_t* windows) override {
    const int64_t K = d_.steps_ahead, Q = d_.num_quantiles(), outputs = d_.num_outputs();
    const int64_t point = d_.point_quantile(), rows = d_.output_rows();
    std::vector<double> f(static_cast<size_t>(Q));
    for (int64_t r = 0; r < b.size; ++r) {
      const float* forecast = o + (r * rows + rows - 1) * outputs;  // the last step's
      const int64_t start = windows[r], last = d_.last_row(start);
      const int64_t begin = d_.series_of(last).begin;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t t = d_.target_row(start, k);
        const int64_t season_lag =
            d_.season > 0 ? d_.season * ((t - last + d_.season - 1) / d_.season) : 0;
        const bool seasonal = d_.season > 0 && t - season_lag >= begin;
        for (int64_t j = 0; j < targets_; ++j) {
          const double actual = d_.actual(start, k, j);
          d_.forecasts(start, k, j, forecast, f.data());
          if (!d_.quantiles.empty()) {
            for (int64_t q = 0; q < Q; ++q) {
              const double u = actual - f[q], level = d_.quantiles[q];
              pinball_ += std::max(level * u, (level - 1) * u) / double(Q);
            }
            covered_ += f[0] <= actual && actual <= f[Q - 1];
          }
          const double e = f[point] - actual;
          model_.add(e, /*keep_nonfinite=*/true);  // a NaN prediction must show
          if (steps_) per_step_[k].add(e, true);
          model_abs_[j] += std::fabs(e);
          // The skill compares the model with naive on the values naive has (an empty cell at
          // a window's end leaves it none).
          if (const double e_naive = d_.target_value(last, j) - actual; std::isfinite(e_naive)) {
            naive_.add(e_naive);
            model_beside_naive_.add(e, true);
          }
          if (seasonal) {
            const double e_season = d_.target_value(t - season_lag, j) - actual;
            snaive_.add(e_season);
            if (steps_) snaive_per_step_[k].add(e_season);
          }
        }
      }
    }
  }
  void finish(std::map<std::string, double>* m) const override {
    (*m)["val_mse"] = model_.mse();
    (*m)["val_rmse"] = std::sqrt(model_.mse());
    (*m)["val_mae"] = model_.mae();
    if (!d_.quantiles.empty()) {
      (*m)["val_pinball"] = pinball_ / double(model_.n);
      if (d_.quantiles.size() > 1) (*m)["val_coverage"] = double(covered_) / double(model_.n);
    }
    for (int64_t k = 0; k < steps_; ++k) {
      (*m)["val_mae_h" + std::to_string(k + 1)] = per_step_[k].mae();
      (*m)["val_rmse_h" + std::to_string(k + 1)] = std::sqrt(per_step_[k].mse());
    }
    if (naive_.n > 0) {
      (*m)["val_naive_mae"] = naive_.mae();
      (*m)["val_naive_rmse"] = std::sqrt(naive_.mse());
      if (naive_.mse() > 0) (*m)["val_skill"] = 1 - model_beside_naive_.mse() / naive_.mse();
    }
    if (snaive_.n > 0) {
      (*m)["val_snaive_mae"] = snaive_.mae();
      (*m)["val_snaive_rmse"] = std::sqrt(snaive_.mse());
      for (int64_t k = 0; k < steps_; ++k)
        if (snaive_per_step_[k].n > 0)
          (*m)["val_snaive_mae_h" + std::to_string(k + 1)] = snaive_per_step_[k].mae();
    }
    double mase = 0;
    for (int64_t j = 0; j < targets_; ++j) {
      if (!(scale_[j] > 0)) return;  // no training part here (eval --data), or a flat one
      mase += model_abs_[j] / double(model_.n / targets_) / scale_[j];
    }
    if (targets_ > 0 && model_.n > 0) (*m)["val_mase"] = mase / double(targets_);
  }

 private:
  // Sums of errors; a baseline's non-finite one (an empty cell before the target) is left out.
  struct Errors {
    double abs = 0, sq = 0;
    int64_t n = 0;
    void add(double e, bool keep_nonfinite = false) {
      if (!keep_nonfinite && !std::isfinite(e)) return;
      abs += std::fabs(e);
      sq += e * e;
      ++n;
    }
    double mae() const { return abs / double(n); }
    double mse() const { return sq / double(n); }
  };
  const SeriesData& d_;
  const int64_t targets_;
  Errors model_, naive_, snaive_;
  Errors model_beside_naive_;              // the model's, on the values naive has
  std::vector<double> model_abs_, scale_;  // per target
  std::vector<int64_t> scale_terms_;       // the differences in scale_, per target
  double pinball_ = 0;   // the quantile loss in the targets' units, summed over the values
  int64_t covered_ = 0;  // values between the lowest and the highest quantile's forecast
  const int64_t steps_;  // steps with errors of their own (direct), or 0
  std::vector<Errors> per_step_ = std::vector<Errors>(static_cast<size_t>(steps_));
  std::vector<Errors> snaive_per_step_ = per_step_;
};

class Forecast final : public SeriesTask {
 public:
  TaskKind kind() const override { return TaskKind::forecast; }
  void loss(Backend& be, const RegressionLoss& regression, Tensor out, const Batch& b, Tensor dout,
            Tensor loss) const override {
    be.regression_loss(regression, out, b.target, Tensor(), dout, loss);
  }
  std::vector<std::string> metric_names(const Dataset* d) const override {
    // Not the baselines' errors (the same every epoch) nor the coverage (best near its level).
    std::vector<std::string> names = {"val_mse", "val_rmse", "val_mae", "val_skill", "val_mase"};
    if (!d || !d->series.quantiles.empty()) names.push_back("val_pinball");
    for (int64_t k = 0; d && d->series.steps_ahead > 1 && k < d->series.steps_ahead; ++k) {
      names.push_back("val_mae_h" + std::to_string(k + 1));
      names.push_back("val_rmse_h" + std::to_string(k + 1));
    }
    return names;
  }
  std::unique_ptr<MetricSums> metric_sums(const Dataset& d) const override {
    return std::make_unique<ForecastSums>(d.series);
  }
};

// Accuracy and macro-F1 over the classes present.
class ClassifySums final : public MetricSums {
 public:
  explicit ClassifySums(int64_t classes) : tp_(classes), fp_(classes), fn_(classes) {}
  void add(const float* o, const Batch& b, const int64_t*) override {
    const int64_t C = static_cast<int64_t>(tp_.size());
    const int64_t* labels = b.labels_buf.host<int64_t>();
    for (int64_t r = 0; r < b.size; ++r) {
      const int64_t pred = std::max_element(o + r * C, o + (r + 1) * C) - (o + r * C);
      const int64_t truth = labels[r];
      ++count_;
      if (pred == truth) {
        ++correct_;
        ++tp_[truth];
      } else {
        ++fp_[pred];
        ++fn_[truth];
      }
    }
  }
  void finish(std::map<std::string, double>* m) const override {
    (*m)["val_accuracy"] = double(correct_) / double(count_);
    (*m)["val_f1"] = macro_f1(tp_, fp_, fn_);
  }

 private:
  std::vector<int64_t> tp_, fp_, fn_;
  int64_t correct_ = 0, count_ = 0;
};

class Classify final : public SeriesTask {
 public:
  TaskKind kind() const override { return TaskKind::classify; }
  void loss(Backend& be, const RegressionLoss&, Tensor out, const Batch& b, Tensor dout,
            Tensor loss) const override {
    be.cross_entropy_loss(out, b.labels, Tensor(), -100, dout, loss);
  }
  std::vector<std::string> metric_names(const Dataset*) const override {
    return {"val_accuracy", "val_f1"};
  }
  std::unique_ptr<MetricSums> metric_sums(const Dataset& d) const override {
    return std::make_unique<ClassifySums>(d.series.num_outputs());
  }
};

class NoSums final : public MetricSums {
 public:
  void add(const float*, const Batch&, const int64_t*) override {}
  void finish(std::map<std::string, double>*) const override {}
};

// The masked autoencoder: its loss averages over the masked steps.
class Mae final : public SeriesTask {
 public:
  TaskKind kind() const override { return TaskKind::mae; }
  void loss(Backend& be, const RegressionLoss& regression, Tensor out, const Batch& b, Tensor dout,
            Tensor loss) const override {
    be.regression_loss(regression, out, b.target, b.mask, dout, loss);
  }
  int64_t loss_terms(const Dataset&, const Batch& b, int64_t first, int64_t end) const override {
    const int64_t steps = b.mask.numel() / b.size;  // per window
    const float* mask = b.mask_buf.host<float>();
    return static_cast<int64_t>(std::count(mask + first * steps, mask + end * steps, 1.0f));
  }
  bool loss_terms_vary() const override { return true; }
  std::vector<std::string> metric_names(const Dataset*) const override { return {}; }
  std::unique_ptr<MetricSums> metric_sums(const Dataset&) const override {
    return std::make_unique<NoSums>();
  }
};

// A tokenizer's text task keeps the tokenizer's path, size and fingerprint.
void store_tokenizer(const TextData& t, std::map<std::string, std::string>* meta) {
  (*meta)["seqforge.tokenizer"] = nlohmann::json(t.tokenizer).dump();
  (*meta)["seqforge.token_vocab"] = std::to_string(t.token_vocab);
  (*meta)["seqforge.tokenizer_hash"] = std::to_string(t.tokenizer_hash);
}
void restore_tokenizer(const std::map<std::string, std::string>& meta, const std::string& where,
                       TextData* t) {
  t->tokenizer = metadata_json<std::string>(meta, "seqforge.tokenizer", where);
  t->token_vocab = metadata_json<int64_t>(meta, "seqforge.token_vocab", where);
  t->tokenizer_hash = metadata_json<uint64_t>(meta, "seqforge.tokenizer_hash", where);
}

// Bits per character and perplexity, from the loss.
class CharlmSums final : public MetricSums {
 public:
  void add(const float*, const Batch&, const int64_t*) override {}
  void finish(std::map<std::string, double>* m) const override {
    (*m)["val_bpc"] = m->at("val_loss") / std::log(2.0);
    (*m)["val_perplexity"] = std::exp(m->at("val_loss"));
  }
};

// Tasks on characters: the model embeds ids over the data's vocabulary, which the checkpoint
// keeps.
class TextTask : public TaskType {
 public:
  void shape_model(const Config& c, const Dataset& d, ModelOptions* m) const override {
    if (!d.text.tokenizer.empty()) {  // tokens: the decoder's config sizes the model
      m->vocab_size = d.text.token_vocab;
      return shape_head(d, m);
    }
    m->vocab_size = static_cast<int64_t>(d.text.vocab.size());
    m->embedding_dim = c.integer("model.embedding");
    if (m->embedding_dim <= 0)
      fail(c.origin("model.embedding"), ": model.embedding must be positive, got ",
           m->embedding_dim);
    shape_head(d, m);
  }
  void store(const Config&, const Dataset& d,
             std::map<std::string, std::string>* meta) const override {
    if (!d.text.tokenizer.empty()) return store_tokenizer(d.text, meta);
    (*meta)["seqforge.vocab"] = nlohmann::json(encode_utf8(d.text.vocab)).dump();
  }
  void restore(const std::map<std::string, std::string>& meta, const std::string& where,
               Dataset* stored) const override {
    if (meta.count("seqforge.tokenizer")) return restore_tokenizer(meta, where, &stored->text);
    std::u32string& vocab = stored->text.vocab;
    vocab = decode_utf8(metadata_json<std::string>(meta, "seqforge.vocab", where),
                        where + ": seqforge.vocab");
    if (vocab.empty() || !std::is_sorted(vocab.begin(), vocab.end()) ||
        std::adjacent_find(vocab.begin(), vocab.end()) != vocab.end())
      fail(where, ": seqforge.vocab is not a vocabulary (distinct characters, sorted)");
  }

 protected:
  virtual void shape_head(const Dataset& d, ModelOptions* m) const = 0;
};

// A character language model: an embedding in, the next character's logits out at every step.
class Charlm final : public TextTask {
 public:
  TaskKind kind() const override { return TaskKind::charlm; }
  const char* samples() const override { return "sequences"; }
  void shape_head(const Dataset&, ModelOptions* m) const override {
    m->output_size = m->vocab_size;
    m->per_step = true;
  }
  int64_t bytes_per_step(const Dataset&) const override { return 16; }
  void loss(Backend& be, const RegressionLoss&, Tensor out, const Batch& b, Tensor dout,
            Tensor loss) const override {
    be.cross_entropy_loss(out, b.labels, Tensor(), -100, dout, loss);
  }
  int64_t loss_terms(const Dataset& d, const Batch&, int64_t first, int64_t end) const override {
    return (end - first) * d.text.seq_len;
  }
  std::vector<std::string> metric_names(const Dataset*) const override {
    return {"val_bpc", "val_perplexity"};
  }
  std::unique_ptr<MetricSums> metric_sums(const Dataset&) const override {
    return std::make_unique<CharlmSums>();
  }
};

// Bits per token and perplexity, from the loss.
class TokenSums final : public MetricSums {
 public:
  void add(const float*, const Batch&, const int64_t*) override {}
  void finish(std::map<std::string, double>* m) const override {
    (*m)["val_bits_per_token"] = m->at("val_loss") / std::log(2.0);
    (*m)["val_perplexity"] = std::exp(m->at("val_loss"));
  }
};

// A language model on a tokenizer's tokens: the next token's logits out at every step; the
// tokenizer file names the vocabulary.
class TokenLm final : public TaskType {
 public:
  TaskKind kind() const override { return TaskKind::lm; }
  const char* samples() const override { return "sequences"; }
  void shape_model(const Config&, const Dataset& d, ModelOptions* m) const override {
    m->vocab_size = d.text.token_vocab;
    m->output_size = m->vocab_size;
    m->per_step = true;
  }
  int64_t bytes_per_step(const Dataset&) const override { return 16; }
  void loss(Backend& be, const RegressionLoss&, Tensor out, const Batch& b, Tensor dout,
            Tensor loss) const override {
    be.cross_entropy_loss(out, b.labels, Tensor(), -100, dout, loss);
  }
  int64_t loss_terms(const Dataset& d, const Batch&, int64_t first, int64_t end) const override {
    return (end - first) * d.text.seq_len;
  }
  std::vector<std::string> metric_names(const Dataset*) const override {
    return {"val_bits_per_token", "val_perplexity"};
  }
  std::unique_ptr<MetricSums> metric_sums(const Dataset&) const override {
    return std::make_unique<TokenSums>();
  }
  void store(const Config&, const Dataset& d,
             std::map<std::string, std::string>* meta) const override {
    store_tokenizer(d.text, meta);
  }
  void restore(const std::map<std::string, std::string>& meta, const std::string& where,
               Dataset* stored) const override {
    restore_tokenizer(meta, where, &stored->text);
  }
};

// The class of a text or a pair of texts: a transformer's classification head; its checkpoint
// keeps the class names too.
class TextClassify final : public TextTask {
 public:
  TaskKind kind() const override { return TaskKind::text_classify; }
  const char* samples() const override { return "examples"; }
  void shape_head(const Dataset& d, ModelOptions* m) const override {
    m->output_size = static_cast<int64_t>(d.text.class_names.size());
    m->per_step = false;
  }
  int64_t bytes_per_step(const Dataset&) const override { return 24; }
  void loss(Backend& be, const RegressionLoss&, Tensor out, const Batch& b, Tensor dout,
            Tensor loss) const override {
    be.cross_entropy_loss(out, b.labels, Tensor(), -100, dout, loss);
  }
  int64_t loss_terms(const Dataset&, const Batch&, int64_t first, int64_t end) const override {
    return end - first;
  }
  std::vector<std::string> metric_names(const Dataset*) const override {
    return {"val_accuracy", "val_f1"};
  }
  std::unique_ptr<MetricSums> metric_sums(const Dataset& d) const override {
    return std::make_unique<ClassifySums>(static_cast<int64_t>(d.text.class_names.size()));
  }
  void store(const Config& c, const Dataset& d,
             std::map<std::string, std::string>* meta) const override {
    TextTask::store(c, d, meta);
    (*meta)["seqforge.classes"] = nlohmann::json(d.text.class_names).dump();
  }
  void restore(const std::map<std::string, std::string>& meta, const std::string& where,
               Dataset* stored) const override {
    TextTask::restore(meta, where, stored);
    stored->text.class_names =
        metadata_json<std::vector<std::string>>(meta, "seqforge.classes", where);
  }
};

}  // namespace

const TaskType& task_type(TaskKind kind) {
  static const Forecast forecast;
  static const Classify classify;
  static const Mae mae;
  static const Charlm charlm;
  static const TextClassify text_classify;
  static const TokenLm lm;
  switch (kind) {
    case TaskKind::forecast:
      return forecast;
    case TaskKind::classify:
      return classify;
    case TaskKind::mae:
      return mae;
    case TaskKind::text_classify:
      return text_classify;
    case TaskKind::lm:
      return lm;
    case TaskKind::charlm:
      break;
  }
  return charlm;
}

}  // namespace seqforge
