#include "chart.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <sstream>
#include <string_view>

#include "io/file_util.hpp"

namespace seqforge::report {

namespace {

constexpr const char* kColors[] = {"#2563eb", "#dc2626", "#16a34a",
                                   "#9333ea", "#ea580c", "#0891b2"};

// A tick label with as many decimals as the tick step needs (in e-notation, as many significant
// digits: 4.129e+08 and 4.1295e+08 for ticks 50000 apart).
std::string tick_label(double v, double step) {
  if (v != 0 && (std::fabs(v) >= 1e7 || std::fabs(v) < 1e-4)) {
    const int digits = step > 0 ? static_cast<int>(std::floor(std::log10(std::fabs(v))) -
                                                   std::floor(std::log10(step) + 1e-9)) +
                                      1
                                : 3;
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.*g", std::clamp(digits, 3, 10), v);
    return buf;
  }
  const int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)), 0, 12);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// A date tick's label, to the second, the minute or the day as the ticks' step needs.
std::string date_label(double seconds, double step) {
  const std::time_t t = static_cast<std::time_t>(std::floor(seconds));
  std::tm tm{};
  if (!gmtime_r(&t, &tm)) return fmt(seconds);
  char buf[32];
  std::strftime(buf, sizeof buf,
                step < 60      ? "%H:%M:%S"
                : step < 86400 ? "%m-%d %H:%M"
                               : "%Y-%m-%d",
                &tm);
  return buf;
}

// Date ticks: steps of seconds, minutes, hours, days, weeks, months (30 days) or years (365
// days), aligned to whole steps since 1970 (midnight UTC for days).
std::vector<double> date_ticks(double lo, double hi, int target, double min_step,
                               double* step_out) {
  constexpr double m = 60, h = 3600, d = 86400;
  const double steps[] = {1,      2,       5,       10,      15,       30,       m,
                          2 * m,  5 * m,   10 * m,  15 * m,  30 * m,   h,        3 * h,
                          6 * h,  12 * h,  d,       2 * d,   7 * d,    14 * d,   30 * d,
                          91 * d, 182 * d, 365 * d, 730 * d, 1825 * d, 3650 * d, 36500 * d};
  double step = steps[std::size(steps) - 1];
  for (double s : steps)
    if (s >= min_step && (hi - lo) / s <= target) {
      step = s;
      break;
    }
  *step_out = step;
  std::vector<double> out;
  for (double k = std::ceil(lo / step); k * step <= hi && out.size() < size_t(2 * target + 2); ++k)
    out.push_back(k * step);
  if (out.empty()) out = {lo};
  return out;
}

// Pads [lo, hi] so that ticks can divide it: a range narrower than the values' resolution
// (equal values, or an ulp apart) by a share of their size. Spans are taken in halves, so that
// ranges as wide as the doubles' own stay finite.
void widen(double* lo, double* hi, double share, double at_least) {
  const double half_span = *hi * 0.5 - *lo * 0.5, size = std::max(std::fabs(*lo), std::fabs(*hi));
  const double pad =
      half_span > size * 0.5e-9 ? half_span * 2 * share : std::max(size * 0.05, at_least);
  *lo = std::max(*lo - pad, -DBL_MAX), *hi = std::min(*hi + pad, DBL_MAX);
}

// Where v falls in [lo, hi], 0 to 1, in halves for ranges wider than the largest double.
double fraction(double v, double lo, double hi) {
  return (v * 0.5 - lo * 0.5) / (hi * 0.5 - lo * 0.5);
}

// Powers of ten for a log axis over [lo, hi] (decimal exponents): every decade (and 2 and 5
// between when under three show), or every 2nd, 5th, 10th, ... decade, about `target` of them.
std::vector<std::pair<double, std::string>> log_ticks(double lo, double hi, int target) {
  std::vector<std::pair<double, std::string>> out;
  const bool fine = hi - lo < 3;
  for (double k : ticks(std::floor(lo), std::ceil(hi), target, 1.0))
    for (double m : fine ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
      const double e = k + std::log10(m);
      if (e >= lo - 1e-9 && e <= hi + 1e-9) out.emplace_back(m * std::pow(10.0, k), "");
    }
  for (auto& [v, label] : out) label = fmt(v, "%.3g");
  if (out.empty()) out.emplace_back(std::pow(10.0, lo), fmt(std::pow(10.0, lo), "%.3g"));
  return out;
}

bool use_log(Scale scale, const std::vector<Series>& series, bool x) {
  if (scale == Scale::linear) return false;
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      const double v = x ? s.x[i] : s.y[i];
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      if (v <= 0) return false;  // a log axis cannot show it
      lo = std::min(lo, v), hi = std::max(hi, v);
    }
  if (!(lo <= hi)) return false;
  return scale == Scale::log || hi / lo >= 100;
}

}  // namespace

std::string escape(const std::string& text) {
  // Bytes that are not UTF-8 (a file name, a damaged config) as U+FFFD: the page says utf-8.
  std::string s;
  for (std::string_view rest = text;;) {
    const size_t bad = io::first_non_utf8(rest);
    s += rest.substr(0, bad);
    if (bad == std::string_view::npos) break;
    s += "\xEF\xBF\xBD";
    rest.remove_prefix(bad + 1);
  }
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    // A bidirectional control in a name (U+202E) would turn the rest of its line around, the
    // numbers after it too: shown as its code instead.
    unsigned code = 0;
    if (const size_t n = bidi_control(s, i, &code)) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", code);
      out += escaped;
      i += n - 1;
      continue;
    }
    const char ch = s[i];
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
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string fmt(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::vector<double> ticks(double lo, double hi, int target, double min_step) {
  const double magnitude = std::max(std::fabs(lo), std::fabs(hi));
  const double raw = std::max({hi / target - lo / target, min_step, magnitude * 1e-12});
  if (!std::isfinite(raw) || !(raw > 0) || !(hi >= lo)) return {lo, hi};
  // The round step (1, 2, 5 x 10^k) nearest the raw one in ratio, at least the smallest allowed.
  const double floor_step = std::max(min_step, magnitude * 1e-12);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= floor_step &&
        std::fabs(std::log(m * mag / raw)) < std::fabs(std::log(step / raw)))
      step = m * mag;
  const double first = std::ceil(lo / step), last = std::floor(hi / step + 1e-9);
  std::vector<double> out;
  for (double k = first; k <= last && out.size() < size_t(2 * target + 2); ++k) {
    const double t = k * step;
    out.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  if (out.empty()) out = {lo, hi};
  return out;
}

std::string render(const Chart& c) {
  const double W = c.width, H = c.height, left = 64, right = 14, top = 34, bottom = 42;
  const bool log_x =
      c.x_categories.empty() && c.x_kind == XKind::number && use_log(c.x_scale, c.series, true);
  const bool log_y = use_log(c.y_scale, c.series, false);
  auto tx = [&](double x) { return log_x ? std::log10(x) : x; };
  auto ty = [&](double y) { return log_y ? std::log10(y) : y; };
  auto usable = [&](const Series& s, size_t i) {
    return std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && (!log_x || s.x[i] > 0) &&
           (!log_y || s.y[i] > 0);
  };
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : c.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!usable(s, i)) continue;
      x0 = std::min(x0, tx(s.x[i])), x1 = std::max(x1, tx(s.x[i]));
      y0 = std::min(y0, ty(s.y[i])), y1 = std::max(y1, ty(s.y[i]));
    }
  if (!c.x_categories.empty() && std::isfinite(x0)) {
    x0 = std::min(x0, 0.0);
    x1 = std::max(x1, double(c.x_categories.size()) - 1);
  }
  std::ostringstream o;
  o << "<figure class=\"chart\"" << (W > 460 ? " style=\"width:" + fmt(W, "%.0f") + "px\"" : "")
    << "><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << W << " " << H
    << "\" role=\"img\" aria-label=\"" << escape(c.title) << "\">";
  o << "<text x=\"" << left << "\" y=\"20\" class=\"title\">" << escape(c.title)
    << (log_y ? " (log scale)" : "") << "</text>";
  if (!std::isfinite(x0)) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2
      << "\" text-anchor=\"middle\" class=\"axis\">no finite values</text></svg></figure>\n";
    return o.str();
  }
  const bool pad_x = !c.x_categories.empty() && x1 - x0 < 1;
  if (pad_x || x1 - x0 <= std::max(std::fabs(x0), std::fabs(x1)) * 1e-9)
    widen(&x0, &x1, 0, c.x_kind == XKind::date ? 43200 : pad_x ? 0.5 : 1);
  else if (!c.x_categories.empty())
    x0 -= 0.5, x1 += 0.5;
  widen(&y0, &y1, 0.05, 1e-6);
  auto px = [&](double x) { return left + fraction(tx(x), x0, x1) * (W - left - right); };
  auto py = [&](double y) { return top + (1 - fraction(ty(y), y0, y1)) * (H - top - bottom); };
  auto at = [](double v) { return fmt(v, "%.1f"); };
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << W - left - right
    << "\" height=\"" << H - top - bottom << "\" class=\"plot\"/>";

  // y ticks: round values, or powers of ten (with 2 and 5 between when few decades show).
  std::vector<std::pair<double, std::string>> yticks;
  if (log_y) {
    yticks = log_ticks(y0, y1, 5);
  } else {
    const std::vector<double> yt = ticks(y0, y1, 5);
    const double step = yt.size() > 1 ? yt[1] - yt[0] : 1.0;
    for (double t : yt) yticks.emplace_back(t, tick_label(t, step));
  }
  for (const auto& [v, label] : yticks)
    o << "<line x1=\"" << left << "\" x2=\"" << W - right << "\" y1=\"" << at(py(v)) << "\" y2=\""
      << at(py(v)) << "\" class=\"grid\"/><text x=\"" << left - 6 << "\" y=\"" << at(py(v) + 4)
      << "\" text-anchor=\"end\" class=\"axis\">" << escape(label) << "</text>";

  // x ticks.
  std::vector<std::pair<double, std::string>> xticks;
  const int x_target = std::max(2, static_cast<int>(W / 80));
  if (!c.x_categories.empty()) {
    for (size_t i = 0; i < c.x_categories.size() && i < 60; ++i)
      xticks.emplace_back(double(i), c.x_categories[i]);
  } else if (c.x_kind == XKind::date) {
    bool days = true;  // dates without times: no ticks between days
    for (const Series& s : c.series)
      for (size_t i = 0; i < s.x.size() && days; ++i)
        days = !std::isfinite(s.x[i]) || std::fmod(s.x[i], 86400.0) == 0;
    double step = 86400;
    for (double t : date_ticks(x0, x1, x_target, days ? 86400 : 0, &step))
      xticks.emplace_back(t, date_label(t, step));
  } else if (log_x) {
    xticks = log_ticks(x0, x1, x_target);
  } else {
    const std::vector<double> xt = ticks(x0, x1, x_target, c.x_kind == XKind::integer ? 1.0 : 0.0);
    const double step = xt.size() > 1 ? xt[1] - xt[0] : 1.0;
    for (double t : xt) xticks.emplace_back(t, tick_label(t, step));
  }
  for (const auto& [v, label] : xticks)
    o << "<line x1=\"" << at(px(v)) << "\" x2=\"" << at(px(v)) << "\" y1=\"" << top << "\" y2=\""
      << H - bottom << "\" class=\"grid\"/><text x=\"" << at(px(v)) << "\" y=\"" << H - bottom + 16
      << "\" text-anchor=\"middle\" class=\"axis\">" << escape(label) << "</text>";
  o << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 6
    << "\" text-anchor=\"middle\" class=\"axis\">" << escape(c.x_label) << "</text>";
  if (!c.y_label.empty())
    o << "<text x=\"12\" y=\"" << (top + H - bottom) / 2 << "\" transform=\"rotate(-90 12 "
      << (top + H - bottom) / 2 << ")\" text-anchor=\"middle\" class=\"axis\">" << escape(c.y_label)
      << "</text>";
  if (c.mark_x && std::isfinite(*c.mark_x) && (!log_x || *c.mark_x > 0)) {
    const double x = px(*c.mark_x);
    if (x >= left - 0.5 && x <= W - right + 0.5)
      o << "<line x1=\"" << at(x) << "\" x2=\"" << at(x) << "\" y1=\"" << top << "\" y2=\""
        << H - bottom << "\" class=\"mark\"><title>" << escape(c.mark_label)
        << "</title></line><text x=\"" << at(x + 3) << "\" y=\"" << top + 11 << "\" class=\"axis\">"
        << escape(c.mark_label) << "</text>";
  }

  // The series, last first, so that the first is drawn on top; the legend right-aligned.
  double legend_x = W - right;
  for (size_t k = c.series.size(); k-- > 0;) {
    const Series& s = c.series[k];
    const std::string color = s.color.empty() ? kColors[k % std::size(kColors)] : s.color;
    const size_t n = std::min(s.x.size(), s.y.size());
    const std::string opacity = s.opacity < 1 ? " opacity=\"" + fmt(s.opacity, "%.2f") + "\"" : "";
    if (s.style != Series::Style::points) {
      o << "<polyline class=\"series\" data-series=\"" << escape(s.name) << "\" fill=\"none\" "
        << "stroke=\"" << color << "\" stroke-width=\"" << (W > 460 ? 1.2 : 1.8) << "\"" << opacity
        << " points=\"";
      bool first = true;
      double prev_y = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!usable(s, i)) continue;
        if (s.style == Series::Style::steps && !first)
          o << at(px(s.x[i])) << "," << at(py(prev_y)) << " ";
        o << at(px(s.x[i])) << "," << at(py(s.y[i])) << " ";
        prev_y = s.y[i];
        first = false;
      }
      o << "\"/>";
    }
    if (s.style == Series::Style::points || s.style == Series::Style::line_and_points)
      for (size_t i = 0; i < n; ++i) {
        if (!usable(s, i)) continue;
        o << "<circle cx=\"" << at(px(s.x[i])) << "\" cy=\"" << at(py(s.y[i])) << "\" r=\""
          << (s.style == Series::Style::points ? 3.5 : 2.6) << "\" fill=\"" << color << "\""
          << opacity << "><title>"
          << escape(i < s.tips.size() ? s.tips[i]
                                      : s.name + " " + fmt(s.x[i]) + ": " + fmt(s.y[i], "%.6g"))
          << "</title></circle>";
      }
    if (s.name.empty()) continue;
    legend_x -= 6.2 * static_cast<double>(s.name.size()) + 30;
    const double ly = 20;
    o << "<line x1=\"" << legend_x << "\" x2=\"" << legend_x + 16 << "\" y1=\"" << ly - 4
      << "\" y2=\"" << ly - 4 << "\" stroke=\"" << color << "\" stroke-width=\"2.5\"/><text x=\""
      << legend_x + 21 << "\" y=\"" << ly << "\" class=\"legend\">" << escape(s.name) << "</text>";
  }
  o << "</svg></figure>\n";
  return o.str();
}

const char* const kStyle = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#111;background:#fafafa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px}
.meta{color:#555;margin:0 0 12px}
.grid{display:flex;flex-wrap:wrap;gap:12px}
.chart{margin:0;background:#fff;border:1px solid #ddd;border-radius:6px;width:460px}
svg{display:block;width:100%;height:auto}
svg .title{font-size:13px;font-weight:600;fill:#111}
svg .axis,svg .legend{font-size:10.5px;fill:#444}
svg .plot{fill:#fff;stroke:#bbb}
svg line.grid{stroke:#eee}
svg line.mark{stroke:#111;stroke-dasharray:4 3;stroke-width:1}
table{border-collapse:collapse;background:#fff}
td,th{border:1px solid #ddd;padding:4px 9px;text-align:right}
th{background:#f3f3f3}
td.text,th.text{text-align:left}
tr.failed td{color:#b91c1c}
pre{background:#fff;border:1px solid #ddd;padding:10px;overflow:auto;font-size:12px}
)";

}  // namespace seqforge::report
