#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "data/data_file.hpp"
#include "data/series_stages.hpp"
#include "data/splits.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/rng.hpp"

namespace seqforge::series {

namespace {

// Start positions of the windows in rows [begin, end) of the source, every `stride`: with
// `targets`, those whose target row lies inside, else every complete input window.
void add_windows(const SeriesData& d, int64_t begin, int64_t end, int64_t stride, bool targets,
                 std::vector<int64_t>* out) {
  for (int64_t s = begin; (targets ? d.target_row(s) : d.last_row(s)) < end; s += stride)
    out->push_back(s);
}

// Split boundaries of every span: [begin, a), [a, b), [b, end), by row shares or shared dates.
std::vector<std::pair<int64_t, int64_t>> split_points(const SplitOptions& o, const SeriesData& d) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (o.by == "rows") {
    for (const SeriesSpan& s : d.series) {
      const auto [a, b] = boundaries(o, s.end - s.begin);
      out.emplace_back(s.begin + a, s.begin + b);
    }
    return out;
  }
  std::vector<int64_t> pooled = d.times;
  std::sort(pooled.begin(), pooled.end());
  const auto [a, b] = boundaries(o, static_cast<int64_t>(pooled.size()));
  const int64_t n = static_cast<int64_t>(pooled.size());
  const int64_t cut_a = a < n ? pooled[a] : INT64_MAX, cut_b = b < n ? pooled[b] : INT64_MAX;
  for (const SeriesSpan& s : d.series) {
    auto first_at = [&](int64_t cut) {
      return std::lower_bound(d.times.begin() + s.begin, d.times.begin() + s.end, cut) -
             d.times.begin();
    };
    out.emplace_back(first_at(cut_a), first_at(cut_b));
  }
  return out;
}

void note_windowless_series(const DataOptions& opt, bool targets, SeriesData* d) {
  if (d->series.size() < 2) return;
  std::vector<char> starts(d->rows, 0);
  for (const auto* list : {&d->split.train, &d->split.val, &d->split.test})
    for (int64_t start : *list) starts[start] = 1;
  std::vector<std::string> names;
  for (const SeriesSpan& s : d->series) {
    if (std::find(starts.begin() + s.begin, starts.begin() + s.end, 1) == starts.begin() + s.end)
      names.push_back(io::quoted(s.name) + " (" + std::to_string(s.end - s.begin) + " rows)");
  }
  if (names.empty()) return;
  const int64_t span = (targets ? d->target_row(0) : d->last_row(0)) + 1;
  const bool one = names.size() == 1;
  std::ostringstream note;
  note << names.size() << " of " << d->series.size() << " series in " << opt.path << " ("
       << opt.series.series_col << ") " << (one ? "is" : "are") << " shorter than one window ("
       << span << " rows: data.lookback " << d->lookback;
  if (span > d->lookback) note << " + data.horizon " << span - d->lookback;
  note << ") and " << (one ? "gives" : "give") << " none: ";
  for (size_t i = 0; i < names.size() && i < 5; ++i) note << (i ? ", " : "") << names[i];
  if (names.size() > 5) note << " and " << names.size() - 5 << " more";
  d->notes.push_back(note.str());
}

}  // namespace

void list_windows(const DataOptions& opt, WindowSet which, SeriesData* d) {
  const SeriesOptions& o = opt.series;
  if (which != WindowSet::splits) {
    for (const SeriesSpan& s : d->series)
      add_windows(*d, s.begin, s.end, 1, which == WindowSet::with_targets, &d->split.test);
    note_windowless_series(opt, which == WindowSet::with_targets, d);
    return;
  }
  if (opt.split.mode == "random") {
    std::vector<int64_t> all;
    for (const SeriesSpan& s : d->series) add_windows(*d, s.begin, s.end, o.stride, true, &all);
    random_split(opt.split, all, &d->split);
    note_windowless_series(opt, true, d);
    return;
  }
  const auto points = split_points(opt.split, *d);
  // With history context, a validation or test window may start in the parts before its own:
  // its first target is the part's first row that has a full window behind it in the series.
  const bool history = opt.split.context == "history" && d->task != TaskKind::mae;
  auto first_start = [&](const SeriesSpan& s, int64_t part_begin) {
    if (!history) return part_begin;
    return std::max(s.begin, part_begin - d->target_row(0, 0));
  };
  for (size_t i = 0; i < d->series.size(); ++i) {
    const SeriesSpan& s = d->series[i];
    const auto [a, b] = points[i];
    add_windows(*d, s.begin, a, o.stride, true, &d->split.train);
    add_windows(*d, first_start(s, a), b, o.stride, true, &d->split.val);
    add_windows(*d, first_start(s, b), s.end, o.stride, true, &d->split.test);
  }
  for (auto* v : {&d->split.train, &d->split.val, &d->split.test}) std::sort(v->begin(), v->end());
  note_windowless_series(opt, true, d);
  if (opt.split.by == "date" && !d->times.empty()) {
    std::vector<int64_t> pooled = d->times;
    std::sort(pooled.begin(), pooled.end());
    const auto [a, b] = boundaries(opt.split, static_cast<int64_t>(pooled.size()));
    const int64_t n = static_cast<int64_t>(pooled.size());
    // Written as the file writes its dates.
    const std::string like = d->dates.empty() ? std::string() : d->dates.front();
    d->notes.push_back("split by date: validation from " +
                       (a < n ? d->time_text(pooled[a], like) : std::string("(none)")) +
                       ", test from " +
                       (b < n ? d->time_text(pooled[b], like) : std::string("(none)")));
  }
}

void keep_last_windows(const DataFile& table, const std::vector<int64_t>& file_rows,
                       SeriesData* d) {
  // Names a missing input of the window at `start`, if any: the file's empty cell, or the one
  // before it that a transform differences against (not the data.known_future values ahead,
  // which the rows past a series' end hold or not: a note says so).
  const auto check_inputs = [&](int64_t start) {
    const SeriesSpan& s = d->series_of(start);
    for (int64_t r = start; r <= d->last_row(start); ++r)
      for (int64_t j = 0; j < d->num_features(); ++j) {
        if ((j >= d->known_begin && j < d->known_end) ||
            !std::isnan(d->source.at(r, d->feature_cols[size_t(j)])))
          continue;
        const std::string& name = d->feature_names[size_t(j)];
        const bool own = !table.has_column(name) ||
                         std::isnan(table.column(name, true)[size_t(file_rows[size_t(r)])]);
        const bool before = !own && r > s.begin;  // the row before, in the source too
        const int64_t row = file_rows[size_t(before ? r - 1 : r)];
        // The cell as the file writes it: "NA" or a data.missing_values code is no empty cell.
        const bool written = !table.is_array() && table.has_column(name);
        const std::string_view text = written ? io::trim(table.text(name)[row]) : "";
        const std::string cell = !written       ? "missing value"
                                 : text.empty() ? "empty cell"
                                                : io::quoted(text) + " (a missing value)";
        fail(table.where(row), ": column ", io::quoted(name), ": ",
             own      ? cell
             : before ? cell + ", which data.transform differences the window's first row against,"
                      : "its change from the row before, which is missing,",
             " in the last window of ",
             s.name.empty() ? "the file" : "series " + io::quoted(s.name),
             " (--last forecasts from its last ", d->lookback,
             " rows; --missing ffill or interpolate fills the file's missing cells)");
      }
  };
  std::vector<int64_t> last;
  for (int64_t start : d->split.test)
    if (!last.empty() && d->series_of(last.back()).begin == d->series_of(start).begin)
      last.back() = start;
    else
      last.push_back(start);
  d->split.test = std::move(last);
  if (d->masks_missing) return;  // a masked model reads missing inputs
  for (int64_t start : d->split.test) check_inputs(start);
  // With data.known_future the windows lacking any input were left out: the window ending at a
  // series' last row with its inputs (before the future rows) must not be one for a missing cell.
  if (d->known_end == d->known_begin) return;
  for (const SeriesSpan& s : d->series) {
    const int64_t start = d->last_observed_row(s) - d->lookback + 1;
    if (start >= s.begin) check_inputs(start);
  }
}

void keep_labeled_fraction(const DataOptions& opt, SeriesData* d) {
  const double fraction = opt.series.label_fraction;
  if (fraction == 1) return;
  Rng rng(opt.split.seed ^ 0x1abe1ull);
  std::vector<int64_t> pick(d->split.train.size());
  std::iota(pick.begin(), pick.end(), 0);
  for (int64_t i = static_cast<int64_t>(pick.size()) - 1; i > 0; --i)
    std::swap(pick[i], pick[rng.next() % (i + 1)]);
  pick.resize(std::max<size_t>(1, static_cast<size_t>(std::ceil(fraction * pick.size()))));
  std::sort(pick.begin(), pick.end());
  std::vector<int64_t> kept;
  for (int64_t i : pick) kept.push_back(d->split.train[i]);
  d->split.train = std::move(kept);
}

}  // namespace seqforge::series
