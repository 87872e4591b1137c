#include "seqforge/report/report.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

namespace fs = std::filesystem;

namespace {

constexpr const char* kColors[] = {"#2563eb", "#dc2626", "#16a34a",
                                   "#9333ea", "#ea580c", "#0891b2"};

std::string escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string num(double v, const char* fmt = "%.4g") {
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Round tick steps (1, 2, 5 x 10^k, at least `min_step`) covering [lo, hi], about `target`
// intervals, for any finite range: a step too fine for the values' resolution (two values an ulp
// apart) is widened, and there are never more than 2 * target + 2 ticks.
std::vector<double> ticks(double lo, double hi, int target, double min_step = 0) {
  const double magnitude = std::max(std::fabs(lo), std::fabs(hi));
  double raw = std::max({(hi - lo) / target, min_step, magnitude * 1e-12});
  if (!std::isfinite(raw) || !(raw > 0) || !(hi >= lo)) return {lo, hi};
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  const double first = std::ceil(lo / step), last = std::floor(hi / step + 1e-9);
  std::vector<double> out;
  for (double k = first; k <= last && out.size() < size_t(2 * target + 2); ++k) {
    const double t = k * step;
    out.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  if (out.empty()) out = {lo, hi};
  return out;
}

// A tick label with as many decimals as the tick step needs.
std::string tick_label(double v, double step) {
  if (v != 0 && (std::fabs(v) >= 1e7 || std::fabs(v) < 1e-4)) return num(v, "%.3g");
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

struct Series {
  std::string name;
  std::vector<double> x, y;
};

// A line chart: axes with round ticks, one polyline per series, a legend, point tooltips.
// `integer_x`: x ticks on whole numbers (epochs). `W`: width in CSS pixels.
std::string line_chart(const std::string& title, const std::string& x_label,
                       const std::vector<Series>& series, bool markers, bool integer_x = true,
                       double W = 460) {
  const double H = 260, left = 64, right = 14, top = 34, bottom = 42;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  std::ostringstream o;
  o << "<figure class=\"chart\"><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << W
    << " " << H << "\" role=\"img\" aria-label=\"" << escape(title) << "\">";
  o << "<text x=\"" << left << "\" y=\"20\" class=\"title\">" << escape(title) << "</text>";
  if (!std::isfinite(x0)) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2
      << "\" text-anchor=\"middle\" class=\"axis\">no finite values</text></svg></figure>";
    return o.str();
  }
  // A range narrower than the values' resolution (equal values, or an ulp apart) is padded by a
  // share of their size, so every axis spans something ticks can divide.
  auto widen = [](double* lo, double* hi, double share, double at_least) {
    const double span = *hi - *lo, size = std::max(std::fabs(*lo), std::fabs(*hi));
    const double pad = span > size * 1e-9 ? span * share : std::max(size * 0.05, at_least);
    *lo -= pad, *hi += pad;
    if (!std::isfinite(*lo) || !std::isfinite(*hi)) *lo = -1e300, *hi = 1e300;
  };
  if (x1 - x0 <= std::max(std::fabs(x0), std::fabs(x1)) * 1e-9) widen(&x0, &x1, 0, 1);
  widen(&y0, &y1, 0.05, 1e-6);
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (W - left - right); };
  auto py = [&](double y) { return top + (y1 - y) / (y1 - y0) * (H - top - bottom); };
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << W - left - right
    << "\" height=\"" << H - top - bottom << "\" class=\"plot\"/>";
  const std::vector<double> yt = ticks(y0, y1, 5);
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1.0;
  for (double t : yt)
    o << "<line x1=\"" << left << "\" x2=\"" << W - right << "\" y1=\"" << num(py(t), "%.1f")
      << "\" y2=\"" << num(py(t), "%.1f") << "\" class=\"grid\"/><text x=\"" << left - 6
      << "\" y=\"" << num(py(t) + 4, "%.1f") << "\" text-anchor=\"end\" class=\"axis\">"
      << tick_label(t, ystep) << "</text>";
  const std::vector<double> xt = ticks(x0, x1, 6, integer_x ? 1.0 : 0.0);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1.0;
  for (double t : xt)
    o << "<line x1=\"" << num(px(t), "%.1f") << "\" x2=\"" << num(px(t), "%.1f") << "\" y1=\""
      << top << "\" y2=\"" << H - bottom << "\" class=\"grid\"/><text x=\"" << num(px(t), "%.1f")
      << "\" y=\"" << H - bottom + 16 << "\" text-anchor=\"middle\" class=\"axis\">"
      << tick_label(t, xstep) << "</text>";
  o << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 6
    << "\" text-anchor=\"middle\" class=\"axis\">" << escape(x_label) << "</text>";
  double legend_x = W - right;  // legend entries right-aligned above the plot, last first
  for (size_t k = series.size(); k-- > 0;) {
    const Series& s = series[k];
    const char* color = kColors[k % std::size(kColors)];
    o << "<polyline class=\"series\" data-series=\"" << escape(s.name)
      << "\" fill=\"none\" stroke=\"" << color << "\" stroke-width=\"" << (W > 460 ? 1.2 : 1.8)
      << "\" points=\"";
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i]))
        o << num(px(s.x[i]), "%.1f") << "," << num(py(s.y[i]), "%.1f") << " ";
    o << "\"/>";
    if (markers)
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.y[i]))
          o << "<circle cx=\"" << num(px(s.x[i]), "%.1f") << "\" cy=\"" << num(py(s.y[i]), "%.1f")
            << "\" r=\"2.6\" fill=\"" << color << "\"><title>" << escape(s.name) << " "
            << num(s.x[i]) << ": " << num(s.y[i], "%.6g") << "</title></circle>";
    legend_x -= 6.2 * static_cast<double>(s.name.size()) + 30;
    const double ly = 20;
    o << "<line x1=\"" << legend_x << "\" x2=\"" << legend_x + 16 << "\" y1=\"" << ly - 4
      << "\" y2=\"" << ly - 4 << "\" stroke=\"" << color << "\" stroke-width=\"2.5\"/><text x=\""
      << legend_x + 21 << "\" y=\"" << ly << "\" class=\"legend\">" << escape(s.name) << "</text>";
  }
  o << "</svg></figure>\n";
  return o.str();
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (char ch : line) {
    if (ch == '"') {
      quoted = !quoted;
    } else if (ch == ',' && !quoted) {
      out.push_back(cur);
      cur.clear();
    } else if (ch != '\r') {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

// val_predictions.csv: row,actual,predicted (numbers, or class names).
struct Predictions {
  std::vector<double> row;
  std::vector<std::string> actual, predicted;
};

Predictions read_predictions(const fs::path& path) {
  Predictions p;
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line)) return p;  // header
  while (std::getline(f, line)) {
    const auto cells = split_csv_line(line);
    if (cells.size() < 3) continue;
    p.row.push_back(std::strtod(cells[0].c_str(), nullptr));
    p.actual.push_back(cells[1]);
    p.predicted.push_back(cells[2]);
  }
  return p;
}

std::string forecast_section(const Predictions& p, const std::string& target) {
  // At most ~1500 points per line: the page stays small and quick to draw.
  const size_t stride = std::max<size_t>(1, p.row.size() / 1500);
  Series actual{"actual", {}, {}}, predicted{"predicted", {}, {}};
  double abs_sum = 0;
  for (size_t i = 0; i < p.row.size(); ++i) {
    const double a = std::strtod(p.actual[i].c_str(), nullptr);
    const double q = std::strtod(p.predicted[i].c_str(), nullptr);
    abs_sum += std::fabs(a - q);
    if (i % stride) continue;
    actual.x.push_back(p.row[i]);
    actual.y.push_back(a);
    predicted.x.push_back(p.row[i]);
    predicted.y.push_back(q);
  }
  std::ostringstream o;
  o << "<h2>Validation predictions</h2><p>" << escape(target) << ", predicted by the saved model "
    << "against the actual values of the validation split (" << p.row.size() << " windows"
    << (stride > 1 ? ", every " + std::to_string(stride) + "th shown" : std::string()) << "; MAE "
    << num(abs_sum / std::max<size_t>(1, p.row.size())) << ").</p><div class=\"wide\">"
    << line_chart(target + ": predicted vs actual", "data row", {actual, predicted}, false, false,
                  940)
    << "</div>";
  return o.str();
}

std::string confusion_section(const Predictions& p) {
  std::vector<std::string> classes = p.actual;
  classes.insert(classes.end(), p.predicted.begin(), p.predicted.end());
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  const size_t C = classes.size();
  auto index = [&](const std::string& c) {
    return static_cast<size_t>(std::lower_bound(classes.begin(), classes.end(), c) -
                               classes.begin());
  };
  std::vector<int64_t> counts(C * C, 0), row_total(C, 0);
  int64_t correct = 0;
  for (size_t i = 0; i < p.actual.size(); ++i) {
    const size_t a = index(p.actual[i]), q = index(p.predicted[i]);
    ++counts[a * C + q];
    ++row_total[a];
    correct += a == q;
  }
  std::ostringstream o;
  o << "<h2>Confusion matrix (validation split)</h2><p>Rows: actual class; columns: predicted. "
    << "Shading: share of the row. Accuracy "
    << num(100.0 * correct / std::max<size_t>(1, p.actual.size()), "%.1f") << "% of "
    << p.actual.size()
    << " windows.</p><table class=\"confusion\"><tr><th>actual \\ predicted</th>";
  for (const auto& c : classes) o << "<th>" << escape(c) << "</th>";
  o << "<th>recall</th></tr>";
  for (size_t a = 0; a < C; ++a) {
    o << "<tr><th>" << escape(classes[a]) << "</th>";
    for (size_t q = 0; q < C; ++q) {
      const double share = row_total[a] ? double(counts[a * C + q]) / row_total[a] : 0.0;
      o << "<td style=\"background:rgba(37,99,235," << num(share, "%.3f")
        << ");color:" << (share > 0.55 ? "#fff" : "#111") << "\">" << counts[a * C + q] << "</td>";
    }
    o << "<td>"
      << (row_total[a] ? num(100.0 * counts[a * C + a] / row_total[a], "%.1f") + "%" : "-")
      << "</td></tr>";
  }
  o << "</table>";
  return o.str();
}

constexpr const char* kStyle = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#111;background:#fafafa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px}
.meta{color:#555;margin:0 0 12px}
.grid{display:flex;flex-wrap:wrap;gap:12px}
.chart{margin:0;background:#fff;border:1px solid #ddd;border-radius:6px;width:460px}
.wide .chart{width:940px}
svg{display:block;width:100%;height:auto}
svg .title{font-size:13px;font-weight:600;fill:#111}
svg .axis,svg .legend{font-size:10.5px;fill:#444}
svg .plot{fill:#fff;stroke:#bbb}
svg line.grid{stroke:#eee}
table{border-collapse:collapse;background:#fff}
td,th{border:1px solid #ddd;padding:4px 9px;text-align:right}
th{background:#f3f3f3}
pre{background:#fff;border:1px solid #ddd;padding:10px;overflow:auto;font-size:12px}
)";

}  // namespace

std::string render_run_report(const std::string& run_dir) {
  const fs::path dir(run_dir);
  const fs::path metrics_path = dir / "metrics.jsonl";
  if (!fs::exists(metrics_path)) fail(metrics_path.string(), ": missing (not a run directory?)");
  std::vector<nlohmann::json> epochs;
  {
    std::ifstream f(metrics_path);
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("epoch")) epochs.push_back(std::move(j));
    }
  }
  std::string task = "?", target, config_text;
  if (fs::exists(dir / "config.resolved.yaml")) {
    config_text = io::read_file((dir / "config.resolved.yaml").string());
    try {
      const YAML::Node c = YAML::Load(config_text);
      if (c["data"] && c["data"]["task"]) task = c["data"]["task"].as<std::string>();
      if (c["data"] && c["data"]["targets"] && c["data"]["targets"].size() > 0)
        target = c["data"]["targets"][0].as<std::string>();
    } catch (const YAML::Exception&) {  // the page still shows the curves
    }
  }
  // Every numeric key across the epochs, as series over the epoch number.
  auto series = [&](const std::string& key, const std::string& label) {
    Series s{label.empty() ? key : label, {}, {}};
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
      if (k.rfind("val_", 0) == 0 && k != "val_loss" && v.is_number() &&
          std::find(val_keys.begin(), val_keys.end(), k) == val_keys.end())
        val_keys.push_back(k);

  std::ostringstream o;
  const std::string name = fs::absolute(dir).lexically_normal().filename().string();
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>seqforge run "
    << escape(name) << "</title><style>" << kStyle << "</style></head><body>\n";
  o << "<h1>seqforge run: " << escape(name) << "</h1><p class=\"meta\">task " << escape(task)
    << " &middot; " << epochs.size() << " epochs";
  if (!epochs.empty()) {
    const auto& last = epochs.back();
    for (const char* k : {"val_loss", "train_loss"})
      if (last.contains(k) && last[k].is_number())
        o << " &middot; last " << k << " " << num(last[k].get<double>(), "%.5g");
    double total = 0;
    for (const auto& j : epochs) total += j.value("epoch_seconds", 0.0);
    o << " &middot; " << num(total, "%.1f") << " s of epochs";
  }
  o << " &middot; " << escape(fs::absolute(dir).lexically_normal().string()) << "</p>\n";

  const bool markers = epochs.size() <= 60;
  o << "<h2>Training</h2><div class=\"grid\">\n";
  o << line_chart("Loss", "epoch",
                  {series("train_loss", "train"), series("val_loss", "validation")}, markers);
  for (const auto& k : val_keys) o << line_chart(k, "epoch", {series(k, "")}, markers);
  o << line_chart("Throughput (samples/s)", "epoch", {series("samples_per_second", "samples/s")},
                  markers);
  o << line_chart("Learning rate (end of epoch)", "epoch", {series("lr", "lr")}, markers);
  o << line_chart("Epoch time (s)", "epoch",
                  {series("epoch_seconds", "epoch"), series("train_seconds", "training")}, markers);
  bool resources = false;
  for (const auto& j : epochs) resources |= j.contains("cpu_percent");
  if (resources) {
    o << line_chart("CPU use (% of one core)", "epoch", {series("cpu_percent", "cpu %")}, markers);
    o << line_chart("Memory (MB)", "epoch",
                    {series("rss_mb", "resident"), series("peak_rss_mb", "peak resident")},
                    markers);
  }
  o << "</div>\n";

  const fs::path predictions = dir / "val_predictions.csv";
  if (fs::exists(predictions)) {
    const Predictions p = read_predictions(predictions);
    if (!p.row.empty())
      o << (task == "classify" ? confusion_section(p)
                               : forecast_section(p, target.empty() ? "target" : target));
  }
  if (!config_text.empty())
    o << "<h2>Configuration</h2><details><summary>config.resolved.yaml</summary><pre>"
      << escape(config_text) << "</pre></details>\n";
  o << "</body></html>\n";
  return o.str();
}

std::string write_run_report(const std::string& run_dir) {
  const std::string html = render_run_report(run_dir);
  const std::string path = (fs::path(run_dir) / "report.html").string();
  io::write_file_atomically(path, {{html.data(), html.size()}});
  return path;
}

}  // namespace seqforge
