// eval, predict, generate and the validation outputs the report draws.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <optional>
#include <set>

#include "io/file_util.hpp"
#include "run.hpp"
#include "sampling.hpp"
#include "seqforge/backend/host_access.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/nn/checkpoint.hpp"
#include "seqforge/nn/decoder.hpp"
#include "seqforge/nn/transformer.hpp"
#include "seqforge/text/tokenizer.hpp"
#include "seqforge/train/data_options.hpp"
#include "seqforge/train/trainer.hpp"

namespace seqforge {

namespace fs = std::filesystem;

namespace {

// Accuracy on `starts` of always predicting the training split's most frequent class.
double majority_accuracy(const Dataset& t, const std::vector<int64_t>& starts) {
  const bool text = t.kind == TaskKind::text_classify;
  auto class_of = [&](int64_t s) {
    return text ? t.text.classes[s] : t.series.classes[t.series.target_row(s)];
  };
  std::vector<int64_t> count((text ? t.text.class_names : t.series.class_names).size(), 0);
  for (int64_t s : t.split().train)
    if (const int64_t k = class_of(s); k >= 0) ++count[k];
  const int64_t majority = std::max_element(count.begin(), count.end()) - count.begin();
  int64_t hits = 0;
  for (int64_t s : starts) hits += class_of(s) == majority;
  return starts.empty() ? 0.0 : double(hits) / double(starts.size());
}

}  // namespace

std::map<std::string, double> evaluate(const std::string& run, const std::string& split,
                                       const std::string& data, std::ostream* notes,
                                       const InputReading& missing) {
  if (data.empty() && split != "val" && split != "test")
    fail("--split: expected val or test, got '", split, "'");
  if (data.empty() && !missing.date_order.empty())
    fail(
        "--date-order reads the dates of a file given with --data; a split of the run's own data "
        "is read as it trained");
  if (data.empty() && !missing.empty())
    fail(missing.fill.empty() ? "--missing-values" : "--missing",
         " reads the missing cells of a file given with --data; a split of the run's own data is "
         "read as it trained");
  LoadedRun r =
      load_run(run, data, data.empty() ? WindowSet::splits : WindowSet::with_targets, missing);
  if (!data.empty())
    for (const std::string& note : r.task.notes())
      (notes ? *notes : std::cerr) << "note: " << printable(note) << "\n";
  return evaluate(r, run, split, data, notes);
}

namespace {
// Why finite weights can give outputs that are not numbers.
std::string non_finite_cause(const LoadedRun& r) {
  return r.task.model.adapter.kind == AdapterKind::dora
             ? "its weights overflow float32 in the forward pass, or a DoRA row of W0 + (alpha/r) "
               "B A has norm 0 (`seqforge merge` names it)"
             : "its weights overflow float32 in the forward pass";
}

// The run's train.threads, at most one per CPU (more would only wait for each other).
int run_threads(const Config& c) {
  return static_cast<int>(std::min<int64_t>(c.integer("train.threads"), usable_cpus()));
}
}  // namespace

std::map<std::string, double> evaluate(LoadedRun& r, const std::string& run,
                                       const std::string& split, const std::string& data,
                                       std::ostream* notes) {
  configure_threads(run_threads(r.config));
  auto be = make_device_backend(r.config, r.task.model, true);
  auto model = load_model(*be, r, notes);
  const Split& s = r.task.split();
  const std::vector<int64_t>& starts = !data.empty() ? s.test : split == "val" ? s.val : s.test;
  if (starts.empty()) {
    if (!data.empty() && r.task.is_text())
      fail(data, ": none of its ", r.task.text.examples(), " rows has a class the model knows");
    if (!data.empty())
      fail(data, ": ", r.task.series.rows, " rows give no window with a target (data.lookback ",
           r.task.series.lookback, " + data.horizon ", r.task.series.horizon, " rows, within one ",
           "series)");
    fail(run, ": the ", split, " split has no windows");
  }
  const int64_t batch_size = forward_rows(r.config);
  Loader loader(*be, r.task, batch_size, loader_options(r.config, batch_bytes(r.task, batch_size)));
  const auto m = evaluate_split(*be, *model, r.task, starts, loader, /*interruptible=*/true);
  // Named for what was evaluated: test_*, val_*, or data_* for another file's every window.
  const std::string prefix = data.empty() ? split : "data";
  std::map<std::string, double> out;
  for (const auto& [k, v] : m) out[k.rfind("val_", 0) == 0 ? prefix + k.substr(3) : k] = v;
  out["samples"] = static_cast<double>(starts.size());
  for (const auto& [k, v] : out)
    if (!std::isfinite(v))
      std::cerr << "warning: " << k << " is " << v
                << ": the model's outputs are not all finite numbers (" << non_finite_cause(r)
                << "?)\n";
  if ((r.task.kind == TaskKind::classify || r.task.kind == TaskKind::text_classify) &&
      data.empty())  // the baseline a classifier has to beat
    out[prefix + "_majority_accuracy"] = majority_accuracy(r.task, starts);
  return out;
}

namespace {

// The row's label for a predictions file: its date, else its 1-based data row in the file.
std::string row_label(const SeriesData& d, int64_t row) {
  if (!d.dates.empty()) return d.dates[row];
  return std::to_string((d.file_rows.empty() ? row : d.file_rows[row]) + 1);
}

// When a window's forecast of step k is for: the target row's label when it is in the file, else
// the last date plus as many steps where the series' dates are regular, written as the file
// writes its dates; "" when unknown (no dates).
std::string forecast_time(const SeriesData& d, int64_t start, int64_t k) {
  const int64_t last = d.last_row(start), target = d.target_row(start, k);
  if (target < d.series_of(last).end) return row_label(d, target);
  // Past the end of a file without dates that is one series in its own order (its first rows
  // perhaps dropped by a differencing transform): its row numbers go on (where rows were
  // reordered or series follow, a number would name another row).
  if (d.dates.empty()) {
    const bool in_order =
        d.series.size() == 1 &&
        std::adjacent_find(d.file_rows.begin(), d.file_rows.end(),
                           [](int64_t a, int64_t b) { return b != a + 1; }) == d.file_rows.end();
    return in_order ? std::to_string((d.file_rows.empty() ? last : d.file_rows[last]) +
                                     (target - last) + 1)
                    : "";
  }
  const std::optional<int64_t> when = d.time_ahead(last, target - last);
  if (!when) return "";
  return d.time_text(*when, d.dates[last]);
}

// Windows per forward pass of predict: large batches run the GEMMs fastest (512-1024 rows ran
// 1.5x the windows/s of 256 for a 2-layer LSTM of hidden 256), within about 512 MB of the
// activations a forward pass keeps, (T, B, G*H) gates per layer and direction.
int64_t prediction_batch(const ModelOptions& m, int64_t T) {
  const RecurrentOptions& o = m.rnn;
  const int64_t per_window = T * cell_type(o.cell).gates * o.hidden_size * o.num_layers *
                             (o.bidirectional ? 2 : 1) * int64_t{sizeof(float)};
  return std::clamp<int64_t>((int64_t{512} << 20) / std::max<int64_t>(1, per_window), 64, 1024);
}

// A note where --last's window of a series ends before the series' last row with inputs (the
// rows after it cannot end a window: their data.known_future values for the steps ahead are
// missing, say), as the forecast is then not the one after the last row; "" where none does.
std::string note_last_windows_behind(const SeriesData& d, const std::vector<int64_t>& windows) {
  int64_t behind_series = 0;
  std::string first;
  for (int64_t w : windows) {
    const SeriesSpan& s = d.series_of(w);
    const int64_t last = d.last_observed_row(s);
    const int64_t behind = last - d.last_row(w);
    if (behind <= 0 || behind_series++ > 0) continue;
    first = (s.name.empty() ? "" : "series " + io::quoted(s.name) + ": ") + "the window ends " +
            std::to_string(behind) + (behind == 1 ? " row" : " rows") + " before the last" +
            (d.dates.empty()
                 ? ""
                 : ", at " + d.dates[size_t(d.last_row(w))] + " against " + d.dates[size_t(last)]);
  }
  if (behind_series == 0) return "";
  return "--last: " + std::to_string(behind_series) +
         " series forecast from a window before their last row (" + first +
         (behind_series > 1 ? "; ..." : "") + ")" +
         (d.known_end > d.known_begin
              ? ": data.known_future needs its values for the steps ahead; append rows holding "
                "them (targets empty) for the forecast after the last row"
              : "");
}

using Column = PredictionColumn;

// The columns of a series run's predictions, empty.
std::vector<Column> prediction_columns(const SeriesData& d, bool multi) {
  std::vector<Column> c;
  if (multi) c.emplace_back("series", Column::Kind::text);
  // Dates, or without them 1-based file rows (a number: the Python API names a frame's rows).
  const Column::Kind when = d.dates.empty() ? Column::Kind::integer : Column::Kind::text;
  c.emplace_back("window_end", when);
  c.emplace_back("forecast_for", when);
  if (d.steps_ahead > 1) c.emplace_back("step", Column::Kind::integer);
  if (d.task == TaskKind::forecast) {
    for (const auto& name : d.target_names) {
      // In double (forecasts_as_written).
      if (d.quantiles.empty()) c.emplace_back(name, Column::Kind::f64);
      for (double q : d.quantiles) c.emplace_back(name + "_q" + shortest(q), Column::Kind::f64);
      if (d.has_targets) c.emplace_back(name + "_actual", Column::Kind::f64);
    }
  } else {
    c.emplace_back("class", Column::Kind::text);
    for (const auto& name : d.class_names) c.emplace_back("p_" + name, Column::Kind::f32);
    if (d.has_targets) c.emplace_back("actual", Column::Kind::text);
  }
  // A column read by name must be the one meant (a run of before the targets' names were
  // checked may have a target called forecast_for).
  std::set<std::string> names;
  for (const Column& column : c)
    if (!names.insert(column.name).second)
      fail("predict: two columns of the predictions would be named '", column.name,
           "' (a target's name is one predict writes: series, window_end, forecast_for, step, "
           "or another target's <target>_actual); rename the column in the data and train again");
  return c;
}

// The likeliest class of logits o (K) into column *c, then each class's probability into the
// columns after it.
void append_classes(const std::vector<std::string>& names, const float* o, Column* c) {
  const int64_t K = static_cast<int64_t>(names.size());
  const double top = *std::max_element(o, o + K);
  std::vector<double> p(K);
  double total = 0;
  for (int64_t k = 0; k < K; ++k) total += p[k] = std::exp(o[k] - top);
  (c++)->text.push_back(names[std::max_element(o, o + K) - o]);
  // Probabilities are computed in f32: stored as the f32 the file's shortest text reads back as.
  for (int64_t k = 0; k < K; ++k) (c++)->values.push_back(static_cast<float>(p[k] / total));
}

// x rounded to the fewest significant digits that leave it strictly between lo and hi (x itself
// where none do).
double rounded_between(double x, double lo, double hi) {
  if (!(lo < x && x < hi)) return x;
  if (x == 0) return 0.0;
  // A decimal of `digits` digits is 10^(magnitude - digits + 1) from the next: the first count
  // tried is one whose step is up to 10 times the interval's width (coarser ones land in it by
  // chance alone).
  const int magnitude = static_cast<int>(std::floor(std::log10(std::fabs(x))));
  const int first =
      std::clamp(magnitude - static_cast<int>(std::floor(std::log10(hi - lo))), 1, 16);
  char buf[40];
  for (int digits = first; digits < 17; ++digits) {
    const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::general, digits);
    double back = x;
    std::from_chars(buf, r.ptr, back);
    if (lo < back && back < hi) return back;
  }
  return x;
}

// A window's model outputs (O) and each one's neighbouring floats, below and above; with room for
// a target's forecasts from each.
struct WindowOutputs {
  WindowOutputs(const SeriesData& d, const float* outputs)
      : o(outputs), down(outputs, outputs + d.num_outputs()), up(down) {
    for (float& x : down) x = std::nextafter(x, -INFINITY);
    for (float& x : up) x = std::nextafter(x, INFINITY);
    below.resize(static_cast<size_t>(d.num_quantiles()));
    above.resize(below.size());
  }
  const float* o;
  std::vector<float> down, up;
  std::vector<double> below, above;
};

// Target j at step k of window `start` forecast by the window's outputs, per quantile into f:
// undone in double (a meter's reading plus its forecast change keeps its digits), each rounded to
// the fewest digits that keep it nearer its own output's forecast than the neighbouring floats':
// the model's digits, and none past them.
void forecasts_as_written(const SeriesData& d, int64_t start, int64_t k, int64_t j,
                          WindowOutputs& w, double* f) {
  d.forecasts(start, k, j, w.o, f);
  d.forecasts(start, k, j, w.down.data(), w.below.data());
  d.forecasts(start, k, j, w.up.data(), w.above.data());
  for (size_t q = 0; q < w.below.size(); ++q) {
    // An undoing may decrease (pct_change of a negative level).
    const double a = std::min(w.above[q], w.below[q]), b = std::max(w.above[q], w.below[q]);
    f[q] = rounded_between(f[q], (a + f[q]) / 2, (f[q] + b) / 2);
  }
}

// Forecasts a file could not hold as numbers.
struct ForecastGaps {
  int64_t empty = 0;       // a target transform undone from a value missing in the file
  int64_t overflowed = 0;  // past a double's range once undone (log of a wide-ranging target)
};

// One window's rows of predictions (one per step ahead) from the model's output `o` (O).
void append_prediction(const SeriesData& d, int64_t start, const float* o, bool multi,
                       std::vector<Column>* columns, ForecastGaps* gaps) {
  const int64_t end = d.series_of(d.last_row(start)).end;
  std::optional<WindowOutputs> outputs;
  if (d.task == TaskKind::forecast) outputs.emplace(d, o);
  std::vector<double> f(static_cast<size_t>(d.num_quantiles()));
  for (int64_t k = 0; k < d.steps_ahead; ++k) {
    Column* c = columns->data();
    const int64_t target = d.target_row(start, k);
    const bool known = d.has_targets && target < end;
    if (multi) (c++)->text.push_back(d.series_of(start).name);
    for (const std::string& when : {row_label(d, d.last_row(start)), forecast_time(d, start, k)}) {
      if (c->kind == Column::Kind::text)
        c->text.push_back(when);
      else
        c->values.push_back(io::parse_double(when).value_or(NAN));
      ++c;
    }
    if (d.steps_ahead > 1) (c++)->values.push_back(static_cast<double>(k + 1));
    if (d.task == TaskKind::forecast) {
      for (int64_t j = 0; j < d.num_targets(); ++j) {
        forecasts_as_written(d, start, k, j, *outputs, f.data());
        for (const double y : f) {
          gaps->empty += std::isnan(y);
          gaps->overflowed += std::isinf(y);
          (c++)->values.push_back(y);
        }
        if (d.has_targets) (c++)->values.push_back(known ? d.actual(start, k, j) : NAN);
      }
    } else {
      append_classes(d.class_names, o, c);
      c += 1 + static_cast<int64_t>(d.class_names.size());
      if (d.has_targets)
        (c++)->text.push_back(known && d.classes[target] >= 0 ? d.class_names[d.classes[target]]
                                                              : "");
    }
  }
}

// Outputs a prediction is made of must be numbers: finite weights can still overflow float32.
void check_finite_outputs(const LoadedRun& r, const float* out, size_t n, size_t first_window) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i]))
      fail(r.file.source(), ": the model's output is ", out[i], " (output ", i,
           " of the batch from ", r.task.is_text() ? "example " : "window ", first_window,
           "): ", non_finite_cause(r), ", and no prediction can be made");
}

// The model's logits on text examples, batch by batch (forward_rows examples): fn(first,
// end, logits) sees examples [first, end) with their logits (end - first, classes) on the host.
// Returns the seconds spent assembling batches and running the model.
double for_text_batches(Backend& be, Model& model, const LoadedRun& r,
                        const std::vector<int64_t>& examples,
                        const std::function<void(size_t, size_t, const float*)>& fn) {
  const size_t B = static_cast<size_t>(std::max<int64_t>(1, forward_rows(r.config)));
  Batch batch;
  Rng rng(0);
  double compute_s = 0;
  for (size_t first = 0; first < examples.size(); first += B) {
    const size_t end = std::min(examples.size(), first + B);
    const double t0 = now_s();
    assemble_batch(be, r.task, examples, first, end, {}, rng, &batch);
    model.set_token_layout(batch.lengths, batch.segments);
    const HostView logits(be, model.forward(be, batch.input, {}, {}, false, rng));
    compute_s += now_s() - t0;
    fn(first, end, logits.data<float>());
  }
  return compute_s;
}

// The predictions of a text_classify run: per example, its file line, the class and each class's
// probability, and the actual class when the file has it.
Predictions predict_text(const LoadedRun& r) {
  const TextData& d = r.task.text;
  auto be = make_device_backend(r.config, r.task.model, true);
  Predictions p;
  std::ostringstream log;
  auto model = load_model(*be, r, &log);
  p.columns.emplace_back("line", Column::Kind::integer);
  p.columns.emplace_back("class", Column::Kind::text);
  for (const auto& name : d.class_names) p.columns.emplace_back("p_" + name, Column::Kind::f32);
  if (d.has_classes) p.columns.emplace_back("actual", Column::Kind::text);
  const std::vector<int64_t>& examples = r.task.split().test;
  const int64_t K = static_cast<int64_t>(d.class_names.size());
  p.compute_seconds =
      for_text_batches(*be, *model, r, examples, [&](size_t first, size_t end, const float* o) {
        check_finite_outputs(r, o, (end - first) * size_t(K), first);
        for (size_t i = first; i < end; ++i) {
          const int64_t e = examples[i];
          p.columns[0].values.push_back(static_cast<double>(d.lines[e]));
          append_classes(d.class_names, o + (i - first) * K, &p.columns[1]);
          if (d.has_classes)
            p.columns.back().text.push_back(d.classes[e] >= 0 ? d.class_names[d.classes[e]] : "");
        }
      });
  p.rows = p.windows = static_cast<int64_t>(examples.size());
  char line[160];
  std::snprintf(line, sizeof line, "predict: %zu example%s in %.3f s (%.0f examples/s)",
                examples.size(), examples.size() == 1 ? "" : "s", p.compute_seconds,
                examples.size() / std::max(p.compute_seconds, 1e-9));
  p.summary = line;
  return p;
}

}  // namespace

Predictions predictions(const std::string& run, const std::string& input, bool last_only,
                        const InputReading& missing) {
  LoadedRun r =
      load_run(run, input, last_only ? WindowSet::last_windows : WindowSet::every_window, missing);
  Predictions p;
  for (const std::string& note : r.task.notes()) p.notes.push_back(note);
  configure_threads(run_threads(r.config));
  if (r.task.kind == TaskKind::text_classify) {
    Predictions text = predict_text(r);
    text.notes.insert(text.notes.begin(), p.notes.begin(), p.notes.end());
    return text;
  }
  const SeriesData& d = r.task.series;
  const std::vector<int64_t>& windows = d.split.test;  // --last: one per series
  if (last_only)
    if (std::string note = note_last_windows_behind(d, windows); !note.empty())
      p.notes.push_back(std::move(note));
  if (windows.empty()) {
    int64_t longest = 0;
    for (const auto& s : d.series) longest = std::max(longest, s.end - s.begin);
    fail(input, ": ",
         d.series.size() > 1
             ? detail::concat("its ", d.series.size(), " series have at most ", longest, " rows")
             : detail::concat(d.rows, " rows"),
         d.drops_first_rows ? " (after data.transform, whose differences use each series' "
                              "first row as their base)"
                            : "",
         ", fewer than data.lookback = ", d.lookback, ": no complete window to predict from");
  }
  auto be = make_device_backend(r.config, r.task.model, true);
  std::ostringstream model_log;
  auto model = load_model(*be, r, &model_log);
  const bool multi = d.series.size() > 1 || !r.config.str("data.series_column").empty();
  p.columns = prediction_columns(d, multi);
  const int64_t B = prediction_batch(r.task.model, d.lookback);
  const int64_t T = d.lookback, F = d.num_features(), O = d.num_outputs();
  StagedBuffer input_buf;  // (B, T, F) normalised windows
  Rng rng(0);
  ForecastGaps gaps;
  for (size_t first = 0; first < windows.size(); first += B) {
    const int64_t n = std::min<int64_t>(B, static_cast<int64_t>(windows.size() - first));
    const double t0 = now_s();
    Tensor x = input_buf.get(*be, DType::f32, {n, T, F});
    for (int64_t i = 0; i < n; ++i)
      d.copy_window(windows[first + i], input_buf.host<float>() + i * T * F);
    input_buf.upload();
    Tensor out = model->forward(*be, x, {}, {}, false, rng);  // (n * output_rows, O)
    const HostView out_host(*be, out);
    p.compute_seconds += now_s() - t0;
    const float* o = out_host.data<float>();
    check_finite_outputs(r, o, size_t(n * d.output_rows() * O), first);
    const int64_t rows = d.output_rows();  // the forecast is the last row's
    for (int64_t i = 0; i < n; ++i)
      append_prediction(d, windows[first + i], o + (i * rows + rows - 1) * O, multi, &p.columns,
                        &gaps);
  }
  p.windows = static_cast<int64_t>(windows.size());
  p.rows = p.windows * d.steps_ahead;
  char line[160];
  std::snprintf(line, sizeof line,
                "predict: %zu window%s in %.3f s (%.0f windows/s, inference only; batch %lld)",
                windows.size(), windows.size() == 1 ? "" : "s", p.compute_seconds,
                windows.size() / std::max(p.compute_seconds, 1e-9), static_cast<long long>(B));
  p.summary = line;
  if (gaps.empty > 0)
    p.notes.push_back(std::to_string(gaps.empty) +
                      " predictions are empty: data.transform of the target is undone from the "
                      "window's last value of it, which is empty in " +
                      input);
  if (gaps.overflowed > 0)
    p.notes.push_back(std::to_string(gaps.overflowed) +
                      " predictions are inf: the model's output, with data.transform of the "
                      "target undone, is past the largest double (1.8e308)");
  return p;
}

std::string predictions_csv(const Predictions& p) {
  std::string csv;
  for (size_t j = 0; j < p.columns.size(); ++j)
    csv += (j ? "," : "") + io::csv_field(p.columns[j].name);
  csv += "\n";
  for (int64_t i = 0; i < p.rows; ++i) {
    for (size_t j = 0; j < p.columns.size(); ++j) {
      const Column& c = p.columns[j];
      if (j) csv += ",";
      if (c.kind == Column::Kind::text) {
        csv += io::csv_field(c.text[i]);
        continue;
      }
      const double x = c.values[i];
      if (std::isnan(x)) continue;
      if (c.kind == Column::Kind::integer)
        csv += std::to_string(static_cast<int64_t>(x));
      else if (c.kind == Column::Kind::f32)
        csv += shortest(static_cast<float>(x));
      else
        csv += shortest(x);
    }
    csv += "\n";
  }
  return csv;
}

int64_t predict(const std::string& run, const PredictOptions& options, std::ostream& log) {
  check_output_outside_run(options.output, run, "--output");
  check_output_file(options.output, "--output");
  // Predictions are CSV; a name promising another format would hold text its reader refuses.
  std::string extension = fs::path(options.output).extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* other : {".json", ".jsonl", ".npy", ".npz", ".parquet", ".xlsx", ".xls",
                            ".safetensors", ".pt", ".feather", ".h5"})
    if (extension == other)
      fail("--output ", options.output, ": predict writes CSV, not ", extension.substr(1),
           "; give a .csv file, or - for standard output");
  std::error_code same_error;
  if (options.output != "-" &&
      std::filesystem::equivalent(options.input, options.output, same_error))
    fail("--output ", options.output, " is the --input file: the predictions would replace the ",
         "data; write them to another file");
  const Predictions p = predictions(run, options.input, options.last_only, options.missing);
  const std::string csv = predictions_csv(p);
  if (options.output != "-") {
    io::write_file_atomically(options.output, {{csv.data(), csv.size()}});
  } else {
    std::fwrite(csv.data(), 1, csv.size(), stdout);
    std::fflush(stdout);
  }
  for (const std::string& note : p.notes) log << "note: " << printable(note) << "\n";
  log << p.summary << "\n" << std::flush;
  return p.windows;
}

namespace {

// How many leading bytes of a token model's decoding are settled: all but a character cut short
// at the end, and the U+FFFD run before it (bytes that a later token may complete into one).
size_t settled_prefix(std::string_view text) {
  size_t end = text.size();
  for (size_t back = 1; back <= 4 && back <= text.size(); ++back) {
    const unsigned char c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xc0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    if (need > back) end = text.size() - back;
    break;
  }
  constexpr std::string_view kReplacement = "\xef\xbf\xbd";
  while (end >= kReplacement.size() && text.substr(0, end).ends_with(kReplacement))
    end -= kReplacement.size();
  return end;
}

// A note where the prompt is longer than the model reads at once: the sample follows its last
// `context` tokens (or characters) alone.
void note_long_prompt(size_t prompt_length, int64_t context, const char* unit) {
  if (static_cast<int64_t>(prompt_length) > context)
    std::cerr << "note: the prompt's " << prompt_length << " " << unit << " are more than the "
              << context << " the model reads: the sample follows its last " << context << "\n";
}

// A token language model's continuation of `prompt`: each new token from the logits of the
// whole sequence so far (its last max_position_embeddings tokens), the text decoded by the
// run's tokenizer.
std::string generate_tokens(Backend& be, Model& model, const LoadedRun& r,
                            const std::string& prompt, int64_t length, double temperature,
                            int64_t top_k, double top_p, uint64_t seed,
                            const std::function<void(std::string_view)>& stream) {
  uint64_t hash = 0;
  const text::Tokenizer tokenizer =
      read_tokenizer(data_options(r.config).text.tokenizer, r.task.text.tokenizer_hash, &hash);
  decode_utf8(prompt, "--prompt");  // named as the option, before the tokenizer reads it
  const text::Encoding encoding = tokenizer.encode(prompt, true);
  if (const std::string note = dropped_characters_note(
          encoding.dropped, data_options(r.config).text.tokenizer, "the prompt", "");
      !note.empty())
    std::cerr << "note: " << printable(note) << "\n";
  std::vector<int64_t> ids(encoding.ids.begin(), encoding.ids.end());
  if (ids.empty()) fail("--prompt: give a prompt for a token language model");
  auto* decoder = dynamic_cast<Decoder*>(&model);
  SF_CHECK(decoder, "generate: a token language model that is not a decoder");
  const DecoderOptions& o = decoder->decoder_options();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= o.vocab_size)
      fail("generate: the prompt's token ", i, " has id ", ids[i], " in the tokenizer (",
           data_options(r.config).text.tokenizer, "), past the model's vocab_size ", o.vocab_size);
  const int64_t window = o.max_positions;  // the most tokens the model reads
  note_long_prompt(ids.size(), window, "tokens");
  Rng rng(seed);
  Buffer ids_buf;
  // The sample's text: the prompt's tokens and the new ones decoded together, less the prompt's
  // own decoding, as a decoder may treat a first token apart (Metaspace and Strip take its
  // leading space).
  std::vector<int32_t> sequence(ids.begin(), ids.end());
  const std::string prompt_decoded = tokenizer.decode(sequence, true);
  std::vector<int32_t> made;
  const auto continuation = [&] {
    std::string text = tokenizer.decode(sequence, true);
    if (text.starts_with(prompt_decoded)) return text.substr(prompt_decoded.size());
    return tokenizer.decode(made, true);
  };
  // What `stream` has had of the sample's decoding: its tokens decoded afresh after each new one
  // (a decoder may join tokens into characters), and passed on once settled.
  std::string streamed;
  const auto pass_on = [&](bool last) {
    if (!stream) return;
    const std::string text = continuation();
    SF_CHECK(text.starts_with(streamed), "generate: the decoding of the sample changed what it ",
             "had streamed");
    const size_t whole = last ? text.size() : settled_prefix(text);
    if (whole <= streamed.size()) return;
    stream(std::string_view(text).substr(streamed.size(), whole - streamed.size()));
    streamed.assign(text, 0, whole);
  };
  if (stream) stream(prompt);
  // The logits (n, V) whose last row predicts the next token: the newest token's read after the
  // key/value cache of those before it; at the start, or once the cache is full, the last
  // `window` tokens read afresh.
  int64_t capacity = 0;
  const auto next_logits = [&] {
    const int64_t have = int64_t(ids.size());
    int64_t first = have - 1;
    if (decoder->decoded() == 0 || decoder->decoded() == capacity) {
      first = std::max<int64_t>(0, have - window);
      capacity = std::min(window, have - first + length - int64_t(made.size()));
      decoder->decode_start(be, capacity);
    }
    const Tensor input = ids_buf.get(be, DType::i64, {1, have - first});
    be.upload(input, ids.data() + first);
    return decoder->decode(be, input);
  };
  for (int64_t n = 0; n < length; ++n) {
    const Tensor logits = next_logits();
    const std::vector<float> last =
        download_vector<float>(be, logits.slice(logits.dim(0) - 1, logits.dim(0)));
    // Ids both know: a model's rows may be padded past the tokenizer's, and a tokenizer may have
    // ids past the model's (Gemma 3's image token).
    const int64_t known = std::min<int64_t>(tokenizer.vocab_size(), int64_t(last.size()));
    const int64_t next = sample_next(std::vector<float>(last.begin(), last.begin() + known),
                                     temperature, top_k, rng, top_p);
    if (std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), next) != o.eos_token_ids.end())
      break;  // the model's end of text
    ids.push_back(next);
    made.push_back(int32_t(next));
    sequence.push_back(int32_t(next));
    pass_on(false);
  }
  pass_on(true);
  return prompt + continuation();
}

// A prompt read as a training text is: a leading byte-order mark left out, "\r\n" and a lone
// "\r" as "\n" (the model never saw a '\r').
std::string prompt_as_text(std::string prompt) {
  if (prompt.starts_with("\xef\xbb\xbf")) prompt.erase(0, 3);
  std::string out;
  out.reserve(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) {
    out += prompt[i] == '\r' ? '\n' : prompt[i];
    if (prompt[i] == '\r' && i + 1 < prompt.size() && prompt[i + 1] == '\n') ++i;
  }
  return out;
}

}  // namespace

std::string generate(const std::string& run, const std::string& given_prompt, int64_t length,
                     double temperature, int64_t top_k, uint64_t seed, double top_p,
                     const std::function<void(std::string_view)>& stream) {
  const std::string prompt = prompt_as_text(given_prompt);
  configure_threads();
  LoadedRun r = load_run_model(run);
  if (!r.task.is_lm())
    fail(run, ": generate needs a language model (data.task charlm or lm); this is a ",
         task_name(r.task.kind), " run",
         r.task.kind == TaskKind::mae ? "" : " (use seqforge predict)");
  if (!(temperature >= 0) || !std::isfinite(temperature))
    fail(
        "generate: the temperature must be 0 (always the likeliest character) or a finite "
        "number above, got ",
        temperature);
  if (top_k < 0) fail("generate: top_k must be positive (0: every character), got ", top_k);
  if (!(top_p > 0 && top_p <= 1)) fail("generate: top_p must be in (0, 1], got ", top_p);
  if (length < 0) fail("generate: the length must be >= 0, got ", length);
  auto be = make_device_backend(r.config, r.task.model, true);
  auto model = load_model(*be, r, &std::cerr);  // in the run's precision, as eval and predict
  if (r.task.kind == TaskKind::lm)
    return generate_tokens(*be, *model, r, prompt, length, temperature, top_k, top_p, seed, stream);
  const std::u32string& vocab = r.task.text.vocab;
  Rng rng(seed);
  // Without a prompt: after a newline, or from a character drawn at random when the text had
  // none, which is the first of the `length` made.
  std::string text = prompt;
  std::u32string start = U"\n";
  int64_t made = 0;
  if (!prompt.empty()) {
    start = decode_utf8(prompt, "--prompt");
  } else if (vocab.find(U'\n') == std::u32string::npos) {
    if (length == 0) return "";
    start = vocab.substr(rng.next() % vocab.size(), 1);
    text = encode_utf8(start);
    made = 1;
  }
  std::vector<int64_t> ids;
  for (size_t i = 0; i < start.size(); ++i) {
    const size_t at = vocab.find(start[i]);
    if (at == std::u32string::npos)
      fail("--prompt: character ", i + 1, " (", shown_character(start[i]),
           ") is not in the model's vocabulary");
    ids.push_back(static_cast<int64_t>(at));
  }
  if (stream) stream(text);
  Buffer ids_buf;
  // The ids [first, first + count) as a (1, count) tensor.
  auto upload_ids = [&](const int64_t* first, int64_t count) {
    Tensor input = ids_buf.get(*be, DType::i64, {1, count});
    be->upload(input, first);
    return input;
  };
  // The logits (rows, V) whose last row predicts the next character: first after the prompt,
  // then after each new character. A recurrent model carries its states and reads one
  // character; a transformer keeps its keys and values and reads one, and once its block is
  // full reads the last block_size characters again.
  std::function<Tensor()> next_logits;
  Tensor logits;
  Buffer h_buf, c_buf;
  if (Recurrent* rnn = model->recurrent()) {
    const RecurrentOptions& o = model->options().rnn;
    if (rnn->directions() != 1) fail(run, ": generating needs a unidirectional model");
    const Tensor h = h_buf.get(*be, DType::f32, {o.num_layers, 1, o.state_size()});
    const Tensor c = c_buf.get(*be, DType::f32, {o.num_layers, 1, o.hidden_size});
    const bool cell_state = rnn->cell().cell_state;
    next_logits = [&, rnn, h, c, cell_state] {
      be->copy(h, rnn->h_n());
      if (cell_state) be->copy(c, rnn->c_n());
      return model->forward(*be, upload_ids(&ids.back(), 1), h, cell_state ? c : Tensor(), false,
                            rng);
    };
    logits = model->forward(*be, upload_ids(ids.data(), static_cast<int64_t>(ids.size())), {}, {},
                            false, rng);
  } else {
    auto* t = dynamic_cast<Transformer*>(model.get());
    SF_CHECK(t, "generate: a transformer run without a transformer");
    const int64_t block = t->transformer_options().block_size;
    note_long_prompt(ids.size(), block, "characters");
    auto refill = [&, t, block] {
      const int64_t count = std::min<int64_t>(block, static_cast<int64_t>(ids.size()));
      t->decode_start(*be);
      return t->decode(*be, upload_ids(ids.data() + ids.size() - count, count));
    };
    next_logits = [&, t, block, refill] {
      if (t->decoded() < block) return t->decode(*be, upload_ids(&ids.back(), 1));
      return refill();
    };
    logits = refill();
  }
  for (int64_t n = made; n < length; ++n) {
    const int64_t next =
        sample_next(download_vector<float>(*be, logits.slice(logits.dim(0) - 1, logits.dim(0))),
                    temperature, top_k, rng, top_p);
    const std::string character = encode_utf8(vocab.substr(next, 1));
    text += character;
    if (stream) stream(character);
    ids.push_back(next);
    if (n + 1 < length) logits = next_logits();
  }
  return text;
}

namespace {

// A text classifier's validation examples: each one's file line, actual and predicted class.
int64_t write_text_validation_outputs(const std::string& run, const LoadedRun& r) {
  const TextData& d = r.task.text;
  const std::vector<int64_t>& examples = d.split.val;
  if (examples.empty()) return 0;
  auto be = make_device_backend(r.config, r.task.model, true);
  auto model = load_model(*be, r, nullptr);
  const int64_t K = static_cast<int64_t>(d.class_names.size());
  std::string csv = "line,actual,predicted\n";  // the example's file line, as predict's
  for_text_batches(*be, *model, r, examples, [&](size_t first, size_t end, const float* o) {
    for (size_t i = first; i < end; ++i) {
      const float* ok = o + (i - first) * K;
      const int64_t e = examples[i], pred = std::max_element(ok, ok + K) - ok;
      csv += std::to_string(d.lines[e]) + "," + io::csv_field(d.class_names[d.classes[e]]) + "," +
             io::csv_field(d.class_names[pred]) + "\n";
    }
  });
  io::write_file_atomically((fs::path(run) / "val_predictions.csv").string(),
                            {{csv.data(), csv.size()}});
  return static_cast<int64_t>(examples.size());
}

}  // namespace

int64_t write_validation_outputs(const std::string& run) {
  LoadedRun r = load_run(run, "");
  return write_validation_outputs(run, r);
}

int64_t write_validation_outputs(const std::string& run, LoadedRun& r) {
  if (r.task.is_lm()) return 0;
  if (r.task.kind == TaskKind::text_classify) return write_text_validation_outputs(run, r);
  const SeriesData& d = r.task.series;
  std::vector<int64_t> starts = d.split.val;
  if (starts.empty()) return 0;
  const bool mae = r.task.kind == TaskKind::mae;
  if (mae) {  // a few windows spread over the split
    std::vector<int64_t> few;
    for (size_t k = 0; k < 4 && k < starts.size(); ++k)
      few.push_back(starts[k * starts.size() / std::min<size_t>(4, starts.size())]);
    starts = few;
  }
  auto be = make_device_backend(r.config, r.task.model, true);
  auto model = load_model(*be, r, nullptr);
  const int64_t batch_size = forward_rows(r.config), O = d.num_outputs();
  const int64_t T = d.lookback;
  Loader loader(*be, r.task, batch_size, loader_options(r.config, batch_bytes(r.task, batch_size)));
  loader.start(starts, INT64_MAX, {}, 0);
  Rng rng(0);
  const bool dates = !d.dates.empty(), multi = d.series.size() > 1;
  std::string csv = mae ? "window,step,feature,original,reconstructed,masked\n"
                        : std::string("row") + (dates ? ",time" : "") + (multi ? ",series" : "") +
                              ",actual,predicted\n";
  char cells[96];
  std::vector<double> forecast(static_cast<size_t>(d.num_quantiles()));
  for (size_t i = 0; i < starts.size(); i += batch_size) {
    const Batch& b = loader.next();
    model->set_token_layout(b.lengths, b.segments);
    Tensor out = model->forward(*be, b.input, {}, {}, false, rng);
    const std::vector<float> o = download_vector<float>(*be, out);
    const std::vector<int64_t> labels = d.task == TaskKind::classify
                                            ? download_vector<int64_t>(*be, b.labels)
                                            : std::vector<int64_t>();
    const std::vector<float> original =
        mae ? download_vector<float>(*be, b.target) : std::vector<float>();
    const std::vector<float> mask =
        mae ? download_vector<float>(*be, b.mask) : std::vector<float>();
    for (int64_t k = 0; k < b.size; ++k) {
      const int64_t start = starts[i + k];
      if (mae) {  // (B*T, O) reconstructions and originals of the file's features, normalised
        for (int64_t u = 0; u < T; ++u)
          for (int64_t f = 0; f < O; ++f) {
            const int64_t at = (k * T + u) * O + f;
            std::snprintf(cells, sizeof cells, ",%lld,", static_cast<long long>(u + 1));
            csv += std::to_string(i + k + 1) + cells + io::csv_field(d.feature_names[f]);
            csv += "," + shortest(original[at]) + "," + shortest(o[at]) +
                   (mask[k * T + u] != 0.0f ? ",1\n" : ",0\n");
          }
        continue;
      }
      const int64_t row = d.target_row(start, 0);
      csv += std::to_string((d.file_rows.empty() ? row : d.file_rows[row]) + 1);  // 1-based
      if (dates) csv += "," + io::csv_field(forecast_time(d, start, 0));
      if (multi) csv += "," + io::csv_field(d.series_of(d.last_row(start)).name);
      if (d.task == TaskKind::forecast) {      // the first target a step ahead, in its own units
        const int64_t rows = d.output_rows();  // the forecast is the last row's
        WindowOutputs outputs(d, o.data() + (k * rows + rows - 1) * O);
        forecasts_as_written(d, start, 0, 0, outputs, forecast.data());
        // The actual value as the file has it; the forecast as predict writes it.
        csv += "," + shortest(d.actual(start, 0, 0)) + "," +
               shortest(forecast[d.point_quantile()]) + "\n";
      } else {
        const float* ok = o.data() + k * O;
        const int64_t pred = std::max_element(ok, ok + O) - ok;
        csv += "," + io::csv_field(d.class_names[labels[k]]) + "," +
               io::csv_field(d.class_names[pred]) + "\n";
      }
    }
  }
  const fs::path output = fs::path(run) / (mae ? "val_reconstructions.csv" : "val_predictions.csv");
  io::write_file_atomically(output.string(), {{csv.data(), csv.size()}});
  return static_cast<int64_t>(starts.size());
}

}  // namespace seqforge
