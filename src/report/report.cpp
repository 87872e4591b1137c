#include "seqforge/report/report.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "chart.hpp"
#include "io/file_util.hpp"
#include "report/metrics_log.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/dates.hpp"
#include "seqforge/io/safetensors.hpp"

namespace seqforge {

namespace fs = std::filesystem;

namespace {

using report::Chart;
using report::escape;
using report::fmt;
using report::Series;

// A CSV the trainer wrote (val_predictions.csv, val_reconstructions.csv), as io::CsvTable reads
// it: columns by name.
struct Table {
  std::string path;
  std::map<std::string, std::vector<std::string>> columns;
  std::vector<int64_t> lines;  // each row's line in the file
  size_t rows = 0;

  const std::vector<std::string>* column(const std::string& name) const {
    const auto it = columns.find(name);
    return it == columns.end() ? nullptr : &it->second;
  }
  // The column's numbers (nan and inf as the trainer writes them); a cell that is not one throws,
  // naming the file, line and column.
  std::vector<double> numbers(const std::string& name) const {
    std::vector<double> out;
    const auto* cells = column(name);
    for (size_t i = 0; cells && i < cells->size(); ++i) {
      const std::string& s = (*cells)[i];
      const std::optional<double> v = io::parse_double(s);
      out.push_back(s.empty() ? NAN : v.value_or(NAN));
      if (!s.empty() && !v)
        fail(path, ":", lines[i], ": column ", io::quoted(name, 40), " holds ", io::quoted(s, 40),
             ", not a number");
    }
    return out;
  }
};

Table read_table(const fs::path& path) {
  const io::CsvTable csv = io::CsvTable::read(path.string());
  Table t;
  t.path = path.string();
  t.rows = static_cast<size_t>(csv.rows());
  for (const std::string& name : csv.columns())
    for (const std::string_view cell : csv.text(name)) t.columns[name].emplace_back(cell);
  for (int64_t r = 0; r < csv.rows(); ++r) t.lines.push_back(csv.line_of_row(r));
  return t;
}

std::string forecast_section(const Table& p, const std::string& target) {
  const auto* time = p.column("time");
  const auto* series = p.column("series");
  if (!p.column("actual") || !p.column("predicted") || !p.column("row")) return "";
  const std::vector<double> actual_values = p.numbers("actual"),
                            predicted_values = p.numbers("predicted"), rows = p.numbers("row");
  // One series' windows (the first), by date where the data has dates.
  const std::string shown = series && !series->empty() ? (*series)[0] : "";
  bool dates = time != nullptr;  // every window's time a date: dates on the x axis, else rows
  for (size_t i = 0; dates && i < p.rows; ++i) dates = io::parse_datetime((*time)[i]).has_value();
  std::vector<double> x, a, q;
  double abs_sum = 0;
  size_t counted = 0;
  for (size_t i = 0; i < p.rows; ++i) {
    const double av = actual_values[i], qv = predicted_values[i];
    if (std::isfinite(av) && std::isfinite(qv)) abs_sum += std::fabs(av - qv), ++counted;
    if (series && (*series)[i] != shown) continue;
    x.push_back(dates ? double(*io::parse_datetime((*time)[i])) +
                            double(io::microseconds_of((*time)[i])) * 1e-6
                      : rows[i]);
    a.push_back(av), q.push_back(qv);
  }
  // At most ~1500 points per line: the page stays small and quick to draw.
  const size_t stride = std::max<size_t>(1, x.size() / 1500);
  Series actual{"actual"}, predicted{"predicted"};
  for (size_t i = 0; i < x.size(); i += stride) {
    actual.x.push_back(x[i]), actual.y.push_back(a[i]);
    predicted.x.push_back(x[i]), predicted.y.push_back(q[i]);
  }
  Chart c;
  c.title = target + ": predicted vs actual" + (shown.empty() ? "" : " (" + shown + ")");
  c.x_label = dates ? "date" : "data row";
  c.x_kind = dates ? report::XKind::date : report::XKind::number;
  c.y_scale = report::Scale::linear;
  c.series = {actual, predicted};
  c.width = 940;
  std::ostringstream o;
  o << "<h2>Validation predictions</h2><p>" << escape(target)
    << " one step ahead, predicted by the saved model against the actual values of the "
    << "validation split (" << p.rows << " windows"
    << (shown.empty() ? "" : "; series " + escape(shown) + " shown")
    << (stride > 1 ? "; every " + std::to_string(stride) + "th shown" : std::string()) << "; MAE "
    << (shown.empty() ? "" : "over every series ")
    << fmt(abs_sum / double(std::max<size_t>(1, counted))) << ").</p>" << report::render(c);
  return o.str();
}

// Every class of the model (or of the predictions), with per-class precision, recall and F1; past
// kMatrixClasses classes, instead of a matrix (its cells grow as the square of the classes), the
// classes present and the pairs most often confused.
constexpr size_t kMatrixClasses = 40;

// `samples`: what a row is (windows, examples).
std::string confusion_section(const Table& p, std::vector<std::string> classes,
                              const std::string& samples) {
  const auto* actual = p.column("actual");
  const auto* predicted = p.column("predicted");
  if (!actual || !predicted) return "";
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < classes.size(); ++i) index.emplace(classes[i], i);
  for (const auto* column : {actual, predicted})
    for (const std::string& c : *column)
      if (index.emplace(c, classes.size()).second) classes.push_back(c);
  const size_t C = classes.size();
  std::map<std::pair<size_t, size_t>, int64_t> counts;  // (actual, predicted) -> windows
  std::vector<int64_t> row_total(C, 0), col_total(C, 0);
  int64_t correct = 0;
  for (size_t i = 0; i < p.rows; ++i) {
    const size_t a = index.at((*actual)[i]), q = index.at((*predicted)[i]);
    ++counts[{a, q}], ++row_total[a], ++col_total[q];
    correct += a == q;
  }
  auto count = [&](size_t a, size_t q) {
    const auto it = counts.find({a, q});
    return it == counts.end() ? int64_t{0} : it->second;
  };
  auto percent = [](int64_t n, int64_t of) { return of ? fmt(100.0 * n / of, "%.1f") + "%" : "-"; };
  // A class's windows, precision, recall and F1 cells.
  auto scores = [&](size_t a) {
    const int64_t tp = count(a, a), denominator = row_total[a] + col_total[a];
    return "<td>" + std::to_string(row_total[a]) + "</td><td>" + percent(tp, col_total[a]) +
           "</td><td>" + percent(tp, row_total[a]) + "</td><td>" +
           (denominator ? fmt(2.0 * tp / denominator, "%.3f") : "-") + "</td>";
  };
  const std::string accuracy = fmt(100.0 * correct / double(std::max<size_t>(1, p.rows)), "%.1f") +
                               "% of " + std::to_string(p.rows) + " " + samples;
  std::ostringstream o;
  if (C > kMatrixClasses) {
    std::vector<size_t> present;
    for (size_t a = 0; a < C; ++a)
      if (row_total[a] || col_total[a]) present.push_back(a);
    std::stable_sort(present.begin(), present.end(),
                     [&](size_t x, size_t y) { return row_total[x] > row_total[y]; });
    std::vector<std::pair<int64_t, std::pair<size_t, size_t>>> confused;
    for (const auto& [pair, n] : counts)
      if (pair.first != pair.second) confused.push_back({n, pair});
    std::stable_sort(confused.begin(), confused.end(),
                     [](const auto& x, const auto& y) { return x.first > y.first; });
    confused.resize(std::min<size_t>(confused.size(), 20));
    o << "<h2>Classes (validation split)</h2><p>" << C << " classes, too many for a confusion "
      << "matrix: the pairs most often confused, then each class the validation split has or "
         "the model predicted (most "
      << samples << " first). Accuracy " << accuracy
      << ".</p><table><tr><th class=\"text\">actual</th><th class=\"text\">"
      << "predicted</th><th>" << samples << "</th></tr>";
    for (const auto& [n, pair] : confused)
      o << "<tr><td class=\"text\">" << escape(classes[pair.first]) << "</td><td class=\"text\">"
        << escape(classes[pair.second]) << "</td><td>" << n << "</td></tr>";
    o << "</table><table><tr><th class=\"text\">class</th><th>" << samples
      << "</th><th>precision</th>"
      << "<th>recall</th><th>F1</th></tr>";
    for (size_t a : present)
      o << "<tr><td class=\"text\">" << escape(classes[a]) << "</td>" << scores(a) << "</tr>";
    o << "</table>";
    return o.str();
  }
  o << "<h2>Confusion matrix (validation split)</h2><p>Rows: actual class; columns: predicted; "
    << "every class of the model. Shading: share of the row. Accuracy " << accuracy
    << ". Precision, recall and F1 per class; a class never predicted and never present "
       "has none.</p><table class=\"confusion\"><tr><th class=\"text\">actual \\ predicted</th>";
  for (const auto& c : classes) o << "<th>" << escape(c) << "</th>";
  o << "<th>" << samples << "</th><th>precision</th><th>recall</th><th>F1</th></tr>";
  for (size_t a = 0; a < C; ++a) {
    o << "<tr><th class=\"text\">" << escape(classes[a]) << "</th>";
    for (size_t q = 0; q < C; ++q) {
      const double share = row_total[a] ? double(count(a, q)) / row_total[a] : 0.0;
      o << "<td style=\"background:rgba(37,99,235," << fmt(share, "%.3f")
        << ");color:" << (share > 0.55 ? "#fff" : "#111") << "\">" << count(a, q) << "</td>";
    }
    o << scores(a) << "</tr>";
  }
  o << "</table>";
  return o.str();
}

// val_reconstructions.csv: window,step,feature,original,reconstructed,masked.
std::string reconstruction_section(const Table& t) {
  const auto* window = t.column("window");
  const auto* step = t.column("step");
  const auto* feature = t.column("feature");
  const auto* masked = t.column("masked");
  if (!window || !step || !feature || !t.column("original") || !t.column("reconstructed") ||
      !masked || t.rows == 0)
    return "";
  const std::vector<double> steps = t.numbers("step"), original = t.numbers("original"),
                            reconstructed = t.numbers("reconstructed");
  const std::string first_feature = (*feature)[0];
  std::map<std::string, std::vector<size_t>> rows;  // window -> its rows of the first feature
  std::vector<std::string> order;
  for (size_t i = 0; i < t.rows; ++i) {
    if ((*feature)[i] != first_feature) continue;
    if (!rows.count((*window)[i])) order.push_back((*window)[i]);
    rows[(*window)[i]].push_back(i);
  }
  std::ostringstream o;
  o << "<h2>Reconstructions (validation split)</h2><p>" << escape(first_feature)
    << " of a few validation windows: the original, the model's reconstruction, and the masked "
       "steps it had to fill in (dots), in normalised units.</p><div class=\"grid\">";
  for (size_t w = 0; w < order.size() && w < 6; ++w) {
    Series orig{"original"}, rec{"reconstructed"}, mask{"masked"};
    mask.style = Series::Style::points;
    for (size_t i : rows[order[w]]) {
      const double x = steps[i];
      orig.x.push_back(x), orig.y.push_back(original[i]);
      rec.x.push_back(x), rec.y.push_back(reconstructed[i]);
      if ((*masked)[i] == "1") mask.x.push_back(x), mask.y.push_back(original[i]);
    }
    Chart c;
    c.title = "window " + order[w];
    c.x_label = "step";
    c.x_kind = report::XKind::integer;
    c.y_scale = report::Scale::linear;
    c.series = {orig, rec, mask};
    o << report::render(c);
  }
  o << "</div>\n";
  return o.str();
}

struct RunFacts {
  std::string task = "?", target, monitor, config_text;
  int64_t epochs = 0;  // train.epochs, 0 where unknown
};

// The saved model's metadata entry `key`; "" when the model is missing or unreadable.
std::string model_metadata(const fs::path& dir, const std::string& key) {
  if (!fs::exists(dir / "model.safetensors")) return "";
  try {
    const auto file = io::SafetensorsFile::read((dir / "model.safetensors").string());
    const auto it = file.metadata().find(key);
    return it == file.metadata().end() ? "" : it->second;
  } catch (const std::exception&) {
    return "";
  }
}

// Every class of a classifier, from its saved model's metadata (read only for the confusion
// matrix, which the run writes once at its end); none when the model is missing or foreign.
std::vector<std::string> model_classes(const fs::path& dir) {
  const std::string text = model_metadata(dir, "seqforge.classes");
  const auto classes = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!classes.is_array() ||
      !std::all_of(classes.begin(), classes.end(), [](const auto& c) { return c.is_string(); }))
    return {};  // classes from the predictions alone
  return classes.get<std::vector<std::string>>();
}

// The epoch model.safetensors holds, from its metadata; none when it records no whole epoch.
std::optional<double> model_epoch(const fs::path& dir) {
  const std::string text = model_metadata(dir, "seqforge.epoch");
  int64_t epoch = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), epoch);
  if (text.empty() || r.ec != std::errc() || r.ptr != text.data() + text.size() || epoch <= 0)
    return std::nullopt;
  return double(epoch);
}

RunFacts read_facts(const fs::path& dir) {
  RunFacts f;
  if (fs::exists(dir / "config.resolved.yaml")) {
    f.config_text = io::read_file((dir / "config.resolved.yaml").string());
    try {
      const YAML::Node c = YAML::Load(f.config_text);
      if (c["data"] && c["data"]["task"]) f.task = c["data"]["task"].as<std::string>();
      if (c["data"] && c["data"]["targets"] && c["data"]["targets"].size() > 0)
        f.target = c["data"]["targets"][0].as<std::string>();
      if (c["train"] && c["train"]["epochs"]) f.epochs = c["train"]["epochs"].as<int64_t>();
      if (c["train"] && c["train"]["early_stopping"] && c["train"]["early_stopping"]["monitor"])
        f.monitor = c["train"]["early_stopping"]["monitor"].as<std::string>();
    } catch (const YAML::Exception&) {  // the page still shows the curves
    }
  }
  return f;
}

}  // namespace

std::string render_run_report(const std::string& run_dir, bool while_training) {
  const fs::path dir(run_dir);
  const fs::path metrics_path = dir / "metrics.jsonl";
  if (!fs::exists(metrics_path) && (fs::exists(dir / "study.json") || fs::exists(dir / "study.db")))
    fail(run_dir,
         ": a tune study's directory, not a run: its report is written by seqforge tune "
         "(seqforge tune --report STUDY); a trial's by seqforge report ",
         run_dir, "/trial-N");
  if (!fs::exists(metrics_path)) fail(metrics_path.string(), ": missing (not a run directory?)");
  const MetricsLog log = read_metrics_log(metrics_path.string());
  const std::vector<nlohmann::json>& epochs = log.epochs;
  const nlohmann::json& test = log.test;
  const RunFacts facts = read_facts(dir);
  // Every numeric key across the epochs, as series over the epoch number.
  auto series = [&](const std::string& key, const std::string& label) {
    Series s{label.empty() ? key : label};
    for (const auto& j : epochs)
      if (j.contains(key) && j[key].is_number()) {
        s.x.push_back(j["epoch"].get<double>());
        s.y.push_back(j[key].get<double>());
      }
    return s;
  };
  std::vector<std::string> val_keys;
  for (const auto& j : epochs)
    for (const auto& [k, v] : j.items())
      if (k.rfind("val_", 0) == 0 && k != "val_loss" && v.is_number() && !metric_step(k) &&
          std::find(val_keys.begin(), val_keys.end(), k) == val_keys.end())
        val_keys.push_back(k);
  // The epoch model.safetensors holds: its own word (a kill between an epoch's line and its
  // checkpoint's write leaves the line claiming a save), else the last line's that saved.
  std::optional<double> saved = while_training ? std::nullopt : model_epoch(dir);
  if (!saved)
    for (const auto& j : epochs)
      if (j.value("checkpoint", false)) saved = j["epoch"].get<double>();

  std::ostringstream o;
  const std::string name = fs::absolute(dir).lexically_normal().filename().string();
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>seqforge run "
    << escape(name) << "</title><style>" << report::kStyle << "</style></head><body>\n";
  o << "<h1>seqforge run: " << escape(name) << "</h1><p class=\"meta\">task " << escape(facts.task)
    << " &middot; " << epochs.size() << (epochs.size() == 1 ? " epoch" : " epochs");
  if (facts.epochs > 0) o << " of " << facts.epochs;
  o << " &middot; " << escape(run_end(log));
  if (saved) {
    o << " &middot; saved model: epoch " << fmt(*saved, "%.0f");
    for (const auto& j : epochs)
      if (j["epoch"].get<double>() == *saved && !facts.monitor.empty() &&
          j.contains(facts.monitor) && j[facts.monitor].is_number())
        o << " (" << escape(facts.monitor) << " " << fmt(j[facts.monitor].get<double>(), "%.5g")
          << ")";
  }
  if (!epochs.empty()) {
    double total = 0;
    for (const auto& j : epochs)
      if (j.contains("epoch_seconds") && j["epoch_seconds"].is_number())
        total += j["epoch_seconds"].get<double>();
    o << " &middot; " << fmt(total, "%.1f") << " s of epochs";
  }
  o << " &middot; " << escape(fs::absolute(dir).lexically_normal().string()) << "</p>\n";

  if (test.is_object()) {
    o << "<h2>Test split</h2><p>The saved model";
    if (test.contains("model_epoch")) o << " (epoch " << test["model_epoch"].dump() << ")";
    o << " evaluated on the held-out test split after training.</p><table><tr>";
    for (const auto& [k, v] : test.items())
      if (v.is_number() && k != "model_epoch" && !metric_step(k))
        o << "<th>" << escape(k) << "</th>";
    o << "</tr><tr>";
    for (const auto& [k, v] : test.items())
      if (v.is_number() && k != "model_epoch" && !metric_step(k))
        o << "<td>" << fmt(v.get<double>(), "%.6g") << "</td>";
    o << "</tr></table>\n";
  }

  const bool markers = epochs.size() <= 60;
  auto chart = [&](const std::string& title, std::vector<Series> s, bool mark,
                   report::Scale scale = report::Scale::automatic) {
    Chart c;
    c.title = title;
    c.x_label = "epoch";
    c.x_kind = report::XKind::integer;
    c.y_scale = scale;
    for (Series& one : s)
      one.style = markers ? Series::Style::line_and_points : Series::Style::line;
    c.series = std::move(s);
    if (mark && saved) {
      c.mark_x = *saved;
      c.mark_label = "saved";
    }
    return report::render(c);
  };
  o << "<h2>Training</h2><div class=\"grid\">\n";
  o << chart("Loss", {series("train_loss", "train"), series("val_loss", "validation")}, true);
  for (const auto& k : val_keys) o << chart(k, {series(k, "")}, true);
  // A direct multi-step forecast: each step's errors, the saved (else the last) epoch's and the
  // test split's.
  const nlohmann::json* by_step = nullptr;
  for (const auto& j : epochs)
    if (!by_step || (saved && j["epoch"].get<double>() == *saved)) by_step = &j;
  // The steps of one metric (val_mae_h1, ... for "mae") of an epoch's (or the test split's)
  // line, in step order.
  auto step_series = [&](const nlohmann::json* j, const std::string& metric,
                         const std::string& label) {
    std::vector<std::pair<int, double>> points;
    if (j && j->is_object())
      for (const auto& [k, v] : j->items())
        if (const int step = metric_step(k); step && v.is_number()) {
          const size_t split_end = k.find('_'), step_begin = k.rfind("_h");
          if (k.substr(split_end + 1, step_begin - split_end - 1) == metric)
            points.emplace_back(step, v.get<double>());
        }
    std::sort(points.begin(), points.end());
    Series s{label};
    for (const auto& [step, y] : points) {
      s.x.push_back(step);
      s.y.push_back(y);
    }
    return s;
  };
  if (Series mae = step_series(by_step, "mae", "validation MAE"); !mae.x.empty()) {
    Chart c;
    c.title = "Error by step ahead";
    c.x_label = "step ahead";
    c.x_kind = report::XKind::integer;
    c.series = {mae, step_series(by_step, "rmse", "validation RMSE")};
    if (Series naive = step_series(by_step, "snaive_mae", "validation seasonal naive MAE");
        !naive.x.empty())
      c.series.push_back(naive);
    if (Series t = step_series(&test, "mae", "test MAE"); !t.x.empty()) c.series.push_back(t);
    for (Series& one : c.series) one.style = Series::Style::line_and_points;
    o << report::render(c);
  }
  o << chart("Throughput (samples/s)", {series("samples_per_second", "samples/s")}, false,
             report::Scale::linear);
  o << chart("Learning rate (end of epoch)", {series("lr", "lr")}, false);
  o << chart("Epoch time (s)",
             {series("epoch_seconds", "epoch"), series("train_seconds", "training")}, false,
             report::Scale::linear);
  bool resources = false;
  for (const auto& j : epochs) resources |= j.contains("cpu_percent");
  if (resources) {
    o << chart("CPU use (% of one core)", {series("cpu_percent", "cpu %")}, false,
               report::Scale::linear);
    o << chart("Memory (MB)",
               {series("rss_mb", "resident"), series("peak_rss_mb", "peak resident")}, false,
               report::Scale::linear);
  }
  o << "</div>\n";

  if (const fs::path p = dir / "val_predictions.csv"; fs::exists(p)) {
    const Table t = read_table(p);
    if (t.rows > 0)
      o << (facts.task == "classify" || facts.task == "text_classify"
                ? confusion_section(t, model_classes(dir),
                                    facts.task == "text_classify" ? "examples" : "windows")
                : forecast_section(t, facts.target.empty() ? "target" : facts.target));
  }
  if (const fs::path p = dir / "val_reconstructions.csv"; fs::exists(p))
    o << reconstruction_section(read_table(p));
  if (!facts.config_text.empty())
    o << "<h2>Configuration</h2><details><summary>config.resolved.yaml</summary><pre>"
      << escape(facts.config_text) << "</pre></details>\n";
  o << "</body></html>\n";
  return o.str();
}

int metric_step(const std::string& key) {
  const size_t at = key.rfind("_h");
  if (at == std::string::npos || at + 2 >= key.size()) return 0;
  int step = 0;
  for (size_t i = at + 2; i < key.size(); ++i) {
    if (key[i] < '0' || key[i] > '9' || step > 100000000) return 0;
    step = step * 10 + (key[i] - '0');
  }
  return step;
}

bool metric_order(const std::string& a, const std::string& b) {
  const int sa = metric_step(a), sb = metric_step(b);
  if (!sa || !sb) return a < b;
  const std::string_view base_a(a.data(), a.rfind("_h")), base_b(b.data(), b.rfind("_h"));
  return base_a != base_b ? a < b : sa < sb;
}

std::string write_run_report(const std::string& run_dir, bool while_training) {
  const std::string html = render_run_report(run_dir, while_training);
  const std::string path = (fs::path(run_dir) / "report.html").string();
  io::write_file_atomically(path, {{html.data(), html.size()}});
  return path;
}

}  // namespace seqforge
