#pragma once
// Inline SVG charts for the HTML pages (run report, tune report): round ticks, a log scale where
// values span decades, dates on the x axis, tooltips; no scripts, nothing fetched. Any input
// draws a finite page in bounded time: non-finite points are skipped, degenerate ranges padded.
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace seqforge::report {

// Text for HTML content and attribute values.
std::string escape(const std::string& s);
// printf-formatted number.
std::string fmt(double v, const char* format = "%.4g");

// Round tick values (1, 2, 5 x 10^k, at least `min_step`) in [lo, hi], about `target` intervals
// apart; never more than 2 * target + 2 of them.
std::vector<double> ticks(double lo, double hi, int target, double min_step = 0);

struct Series {
  enum class Style { line, points, line_and_points, steps };
  Series() = default;
  explicit Series(std::string legend) : name(std::move(legend)) {}
  std::string name;               // the legend's entry; "" for none
  std::vector<double> x, y;       // non-finite points are left out
  std::vector<std::string> tips;  // per point tooltip (optional)
  std::string color;              // "" for the palette's next
  Style style = Style::line;
  double opacity = 1;
};

enum class Scale { linear, log, automatic };  // automatic: log when positive and 2+ decades apart
enum class XKind { number, integer, date };   // date: seconds since 1970-01-01 UTC

struct Chart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  XKind x_kind = XKind::number;
  Scale x_scale = Scale::linear, y_scale = Scale::automatic;
  std::vector<std::string> x_categories;  // x = 0, 1, ... labelled by these
  std::optional<double> mark_x;           // a dashed vertical line (the saved epoch, say)
  std::string mark_label;
  double width = 460, height = 260;
};

// The chart as an SVG inside a <figure class="chart">.
std::string render(const Chart& chart);

// The pages' shared style sheet.
extern const char* const kStyle;

}  // namespace seqforge::report
