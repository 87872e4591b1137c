#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/calendar.hpp"
#include "data/series_stages.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/dates.hpp"

namespace seqforge::series {

namespace {

// How the date column of a CSV writes its dates: its first cell tells ISO, YYYYMMDD or day and
// month first, whose order a field past 12 anywhere in the column tells (or data.date_order).
// nullopt: the column holds numbers, not dates.
std::optional<io::DateLayout> date_layout(const DataFile& table, const SeriesOptions& o) {
  const io::CsvColumn& cells = table.text(o.date_col);
  const std::string first(cells[0]);
  if (io::parse_datetime(first)) return io::DateLayout::iso;
  if (io::parse_date(first, io::DateLayout::compact)) return io::DateLayout::compact;
  // YYYYMMDDHH where every cell reads so (a column of Unix seconds would fail in a few rows).
  if (io::parse_date(first, io::DateLayout::compact_time)) {
    bool all = true;
    for (int64_t r = 0; r < table.rows() && all; ++r)
      all = io::parse_date(cells[r], io::DateLayout::compact_time).has_value();
    if (all) return io::DateLayout::compact_time;
  }
  // YYYYMM where every cell reads so (a count of six digits would pass month 12 within a year).
  if (io::parse_date(first, io::DateLayout::compact_month)) {
    bool all = true;
    for (int64_t r = 0; r < table.rows() && all; ++r)
      all = io::parse_date(cells[r], io::DateLayout::compact_month).has_value();
    if (all) return io::DateLayout::compact_month;
  }
  if (io::parse_date(first, io::DateLayout::named_month)) return io::DateLayout::named_month;
  std::string point = first;  // "0,5" in a column of decimal commas
  if (table.decimal_commas(o.date_col)) std::replace(point.begin(), point.end(), ',', '.');
  if (io::parse_finite(point)) return std::nullopt;
  if (!io::day_month_fields(first)) return io::DateLayout::iso;  // each cell's error says why
  if (o.date_order != "auto")
    return o.date_order == "dmy" ? io::DateLayout::day_first : io::DateLayout::month_first;
  int64_t day_past_12 = -1, month_past_12 = -1;  // rows whose first or second field is past 12
  for (int64_t r = 0; r < table.rows() && (day_past_12 < 0 || month_past_12 < 0); ++r)
    if (const auto f = io::day_month_fields(cells[r])) {
      if (f->first > 12 && day_past_12 < 0) day_past_12 = r;
      if (f->second > 12 && month_past_12 < 0) month_past_12 = r;
    }
  if (day_past_12 >= 0 && month_past_12 >= 0)
    fail(table.where(month_past_12), ": column '", o.date_col, "': '", cells[month_past_12],
         "' has its month first where '", cells[day_past_12], "' (", table.where(day_past_12),
         ") has its day first: one order per column");
  if (day_past_12 >= 0) return io::DateLayout::day_first;
  if (month_past_12 >= 0) return io::DateLayout::month_first;
  fail(table.where(0), ": column '", o.date_col, "': '", first,
       "' may have its day or its month first, and no date of the column has a field past 12 "
       "to tell: set data.date_order (eval and predict: --date-order) to dmy (day first) or mdy "
       "(month first)");
}

std::string layout_note(const DataFile& table, const SeriesOptions& o, io::DateLayout layout) {
  const std::string column = "column '" + o.date_col + "' writes its dates ";
  if (layout == io::DateLayout::compact)
    return column + "as YYYYMMDD; predictions write them as ISO dates";
  if (layout == io::DateLayout::compact_month)
    return column + "as YYYYMM months; predictions write them as ISO dates (a month's first day)";
  if (layout == io::DateLayout::compact_time)
    return column + "as YYYYMMDDHH[MM[SS]] date-times; predictions write them as ISO dates";
  if (layout == io::DateLayout::named_month)
    return column + "with the months' names; predictions write them as ISO dates";
  const bool day = layout == io::DateLayout::day_first;
  std::string why = "data.date_order";
  if (o.date_order == "auto")
    for (int64_t r = 0; r < table.rows(); ++r)
      if (const auto f = io::day_month_fields(table.text(o.date_col)[r]);
          f && (day ? f->first : f->second) > 12) {
        why.assign("'").append(table.text(o.date_col)[r]).append("' at " + table.where(r));
        break;
      }
  return column + (day ? "day first (day/month/year: " : "month first (month/day/year: ") + why +
         "); predictions write them as ISO dates";
}

// Whether a date-time writes digits of its seconds past the sixth (dropped: microseconds_of).
bool past_microseconds(std::string_view date) {
  const size_t colon = date.rfind(':');
  if (colon == std::string_view::npos) return false;
  const size_t point = date.find_first_of(".,", colon);
  if (point == std::string_view::npos) return false;
  size_t end = point + 1;
  while (end < date.size() && std::isdigit(static_cast<unsigned char>(date[end]))) ++end;
  return end - point - 1 > 6;
}

}  // namespace

RowOrder order_rows(const DataFile& table, const SeriesOptions& o, const std::string& path) {
  RowOrder out;
  const BusinessCalendar business(o.holidays);
  const int64_t n = table.rows();
  std::vector<int64_t> when(n, 0);
  // A date column of numbers (elapsed seconds, a Unix time, a sample index) orders the rows in
  // its own units, kept in millionths so that fractional steps survive; it has no calendar.
  std::optional<io::DateLayout> layout;  // a CSV's dates; nullopt: numbers
  if (!o.date_col.empty() && n > 0 && !table.is_array()) layout = date_layout(table, o);
  if (layout == io::DateLayout::day_first) out.date_order = "dmy";
  if (layout == io::DateLayout::month_first) out.date_order = "mdy";
  out.numeric_times = !o.date_col.empty() && n > 0 && !layout;
  std::vector<bool> zoned(n, false);  // the date's time is marked as UTC or with an offset
  if (out.numeric_times) {
    const std::string numbers = "column '" + o.date_col + "' holds numbers, not dates";
    if (!o.calendar.empty()) fail(path, ": data.calendar needs dates; ", numbers);
    for (const std::string& name : o.known_future)
      if (is_calendar(o, name))
        fail(path, ": data.known_future '", name, "' needs dates; ", numbers);
    if (o.frequency.kind != Frequency::automatic)
      fail(path, ": data.frequency ", o.frequency.text, " needs dates; ", numbers);
    if (!o.holidays.empty()) fail(path, ": data.holidays need dates; ", numbers);
    const std::vector<double> x = table.column(o.date_col);  // names a cell that is no number
    for (int64_t r = 0; r < n; ++r) {
      if (!(std::fabs(x[r]) < 9e12))
        fail(table.where(r), ": column '", o.date_col, "': ", x[r],
             " is too large a time (at most 9e12 in magnitude)",
             std::fabs(x[r]) < 1e20 ? ": a Unix time in microseconds or "
                                      "nanoseconds? Write it in seconds, or as dates "
                                      "(2023-11-14T22:13:20Z)"
                                    : "");
      // The whole units exactly: a Unix time in milliseconds in millionths passes 2^53.
      const double whole = std::trunc(x[r]);
      when[r] = static_cast<int64_t>(whole) * static_cast<int64_t>(SeriesData::kNumericTimeScale) +
                std::llround((x[r] - whole) * SeriesData::kNumericTimeScale);
    }
    if (!table.is_array()) {  // the decimals all cells are written with, for times past the end
      int common = -1;
      for (const std::string_view text : table.text(o.date_col)) {
        const size_t point = text.find('.');
        const bool plain = text.find_first_of("eE") == std::string_view::npos;
        const int decimals = point == std::string_view::npos || !plain
                                 ? 0
                                 : static_cast<int>(text.size() - point - 1);
        if (common != -1 && decimals != common) {
          common = 0;
          break;
        }
        common = decimals;
      }
      out.numeric_decimals = std::clamp(common, 0, 6);
    }
    out.notes.push_back(path + ": " + numbers +
                        ", times in its own units (ISO dates give a calendar)");
  } else if (!o.date_col.empty() && n > 0) {
    const auto& dates = table.text(o.date_col);
    std::vector<int64_t> offsets(n, 0);  // the UTC offsets written (seconds)
    std::vector<int64_t> micros(n, 0);   // the fractions of a second written
    for (int64_t r = 0; r < n; ++r) {
      bool zone = false;
      const auto t = io::parse_date(dates[r], *layout, &offsets[r], &zone);
      zoned[r] = zone;
      if (!t && (layout == io::DateLayout::day_first || layout == io::DateLayout::month_first)) {
        const bool day = layout == io::DateLayout::day_first;
        const auto other = day ? io::DateLayout::month_first : io::DateLayout::day_first;
        if (o.date_order != "auto" && io::parse_date(dates[r], other))
          fail(table.where(r), ": column '", o.date_col, "': ", io::quoted(dates[r]),
               " is not a date with its ", day ? "day" : "month", " first (", o.date_order,
               ": data.date_order, or for eval and predict --date-order or the run's order) but "
               "reads with its ",
               day ? "month" : "day",
               " first: set data.date_order, or --date-order for eval and "
               "predict, to ",
               day ? "mdy" : "dmy");
      }
      if (!t && r == 0)
        fail(table.where(r), ": column '", o.date_col, "': ", io::quoted(dates[r]),
             " is neither a date (2012-01-31, 2012-01-31 13:45, 2012/01/31, 20120131, 2012013113, "
             "31/01/2012, 01/31/2012 1:45 PM, 31.01.2012, Jan 31, 2012, 31-Jan-2012) nor a "
             "number");
      if (!t)
        fail(table.where(r), ": column '", o.date_col, "': ", io::quoted(dates[r]),
             " is not a date written as the column's first, ", io::quoted(dates[0]),
             layout == io::DateLayout::iso ? "" : " (" + layout_note(table, o, *layout) + ")");
      micros[r] = io::microseconds_of(dates[r]);
      when[r] = *t;
    }
    // Times a fraction of a second apart (a sensor sampled faster than once a second) are kept in
    // microseconds, their steps too; the calendar's units (days, months, business days) have no
    // meaning at such steps.
    const auto fraction = std::find_if(micros.begin(), micros.end(), [](int64_t m) { return m; });
    out.subsecond_times = fraction != micros.end();
    if (out.subsecond_times) {
      const std::string why = " needs dates to the whole second; column '" + o.date_col +
                              "' holds fractions of a second ('" +
                              std::string(dates[fraction - micros.begin()]) + "' at " +
                              table.where(fraction - micros.begin()) + ")";
      if (o.frequency.kind == Frequency::business || o.frequency.kind == Frequency::calendar_months)
        fail(path, ": data.frequency ", o.frequency.text, why);
      if (!o.holidays.empty()) fail(path, ": data.holidays", why);
    }
    // Days at local midnight with their UTC offsets (a pandas frame's dates in a time zone): the
    // offset changes with daylight saving time, so in UTC the steps would be 23 and 25 hours.
    // Such dates are read as the local days they name; other times stay instants (UTC), whose
    // order and steps hold across the clock's changes.
    const bool offsets_written =
        std::any_of(offsets.begin(), offsets.end(), [](int64_t o) { return o != 0; });
    // Some times marked as UTC (or with an offset) and others not: the others are read as UTC,
    // which they may not be.
    int64_t marked = 0, unmarked = 0, first_unmarked = -1;
    for (int64_t r = 0; r < n; ++r)
      if (zoned[r])
        ++marked;
      else if (dates[r].find(':') != std::string_view::npos && unmarked++ == 0)
        first_unmarked = r;
    if (marked > 0 && unmarked > 0)
      out.notes.push_back(path + ": column '" + o.date_col + "' marks " + std::to_string(marked) +
                          " of its times as UTC or with a UTC offset and " +
                          std::to_string(unmarked) + " not (the first '" +
                          std::string(io::trim(dates[first_unmarked])) + "' at " +
                          table.where(first_unmarked) + "): those are read as UTC");
    bool local_days = offsets_written;
    for (int64_t r = 0; r < n && local_days; ++r) local_days = (when[r] + offsets[r]) % 86400 == 0;
    if (local_days) {
      for (int64_t r = 0; r < n; ++r) when[r] += offsets[r];
      out.notes.push_back(path + ": column '" + o.date_col +
                          "' holds local midnights with UTC offsets: read as the days they name");
    } else if (offsets_written) {
      out.utc_times = true;
      out.notes.push_back(path + ": column '" + o.date_col +
                          "' holds times with UTC offsets: read as instants, written in UTC ('" +
                          std::string(io::trim(dates[0])) + "' as " +
                          date_time_text(when[0], false, true, out.subsecond_times) +
                          "), data.calendar's hours and days UTC's");
    }
    bool midnights = true;
    for (int64_t r = 0; r < n; ++r) midnights = midnights && when[r] % 86400 == 0;
    if (layout != io::DateLayout::iso)
      out.notes.push_back(path + ": " + layout_note(table, o, *layout));
    if (out.subsecond_times)
      for (int64_t r = 0; r < n; ++r)
        when[r] = when[r] * static_cast<int64_t>(SeriesData::kNumericTimeScale) + micros[r];
    // Predictions write every date one way: 2012/01/31, a month's 2012-01 and a fraction after a
    // comma (10:00:00,250) as 2012-01-31, 2012-01-01 and 10:00:00.250, like the dates they add
    // past a series' end.
    const std::string_view first = io::trim(dates[0]);
    const bool month = first.size() == 7;
    const bool padded =
        first.size() >= 10 && first[7] == '-' && std::isdigit(static_cast<unsigned char>(first[9]));
    if (layout != io::DateLayout::iso || first.find_first_of("/,") != std::string::npos || month ||
        !padded || offsets_written)
      for (int64_t r = 0; r < n; ++r)
        out.iso_dates.push_back(
            date_time_text(when[r], midnights, out.utc_times, out.subsecond_times));
    // ISO dates written several ways in one column (a midnight without its time, UTC as Z and as
    // +00:00, blanks around a date): every one as the first with a time is written (the first,
    // where every time is a midnight), or as the longest where the first cannot write a finer
    // one (minutes before a time with seconds, seconds before a fraction).
    if (out.iso_dates.empty()) {
      int64_t styled = 0;
      while (!midnights && styled + 1 < n && io::trim(dates[styled]).size() <= 10) ++styled;
      std::string like(io::trim(dates[styled]));
      auto as_like = [&](int64_t r) {
        return date_in_style_of(like, date_time_text(when[r], midnights && like.size() <= 10,
                                                     out.utc_times, out.subsecond_times));
      };
      // Digits where `like` has digits, its other characters where it has them.
      auto shaped_like = [&](std::string_view t) {
        bool shape = t.size() == like.size();
        for (size_t i = 0; shape && i < t.size(); ++i) {
          const bool digit = std::isdigit(static_cast<unsigned char>(like[i]));
          shape = digit ? std::isdigit(static_cast<unsigned char>(t[i])) != 0 : t[i] == like[i];
        }
        return shape;
      };
      // Only rows of another shape are written out to compare, so that a long file of one style
      // costs a scan.
      bool mixed = false, finer = false;
      for (int64_t r = 0; r < n && !finer; ++r) {
        if (shaped_like(dates[r])) continue;
        const std::string written = as_like(r);
        mixed = mixed || written != dates[r];
        finer = !shaped_like(written);
      }
      if (finer) {
        for (int64_t r = 0; r < n; ++r)
          if (io::trim(dates[r]).size() > like.size()) like = std::string(io::trim(dates[r]));
        mixed = true;
      }
      if (mixed)
        for (int64_t r = 0; r < n; ++r) out.iso_dates.push_back(as_like(r));
    }
  }
  // A file row's date as the file writes it.
  auto date_text = [&](int64_t r) {
    return table.is_array() ? numeric_time_text(when[r]) : std::string(table.text(o.date_col)[r]);
  };
  static const io::CsvColumn no_names;
  const io::CsvColumn& names = o.series_col.empty() ? no_names : table.text(o.series_col);
  if (!o.series_col.empty()) table.check_utf8(o.series_col, "data.series_column");
  out.rows.resize(n);
  std::iota(out.rows.begin(), out.rows.end(), 0);
  // Rows already in order (one series, dates rising or none) are not sorted: a tall array's sort
  // took a third of its loading and a buffer of its size.
  if (!names.empty() || !std::is_sorted(when.begin(), when.end()))
    std::stable_sort(out.rows.begin(), out.rows.end(), [&](int64_t a, int64_t b) {
      if (!names.empty() && names[a] != names[b]) return names[a] < names[b];
      return when[a] < when[b];
    });
  int64_t gaps = 0, largest = 0;
  std::string largest_at;
  out.gap_before.assign(size_t(n), 0);
  // Steps that are no whole number of their series' usual one: later dates are then unknown.
  int64_t off_grid = 0, off_grid_series = 0, off_grid_step = 0;
  std::string off_grid_at;
  const int64_t ticks =
      out.subsecond_times ? static_cast<int64_t>(SeriesData::kNumericTimeScale) : 1;
  for (int64_t p = 0; p < n;) {
    SeriesSpan span;
    span.name = names.empty() ? "" : std::string(names[out.rows[p]]);
    span.begin = p;
    int64_t q = p + 1;
    while (q < n && (names.empty() || names[out.rows[q]] == span.name)) ++q;
    span.end = q;
    if (!o.date_col.empty()) {
      std::vector<int64_t> steps;
      for (int64_t k = p + 1; k < q; ++k) {
        const int64_t a = out.rows[k - 1], b = out.rows[k];
        if (when[a] == when[b]) {
          const std::string date = date_text(b);
          const std::string set_back =
              clock_set_back(whole_seconds(when[b], out.subsecond_times), date)
                  ? ": a local clock set back an hour for daylight saving time? Write the times "
                    "in UTC or with their UTC offsets (2021-11-07T01:30-04:00)"
                  : "";
          // Written otherwise (another UTC offset), the first is named as written.
          const std::string first = date_text(a);
          const std::string seen = first == date
                                       ? "first at " + table.where(a)
                                       : "as " + io::quoted(first) + " at " + table.where(a);
          const std::string unmarked =
              zoned[a] != zoned[b] ? ": times without a UTC offset are read as UTC; write every "
                                     "time with its offset, or none"
                                   : "";
          // 09:30:00.000000100 after 09:30:00.000000000 (pandas' nanoseconds)
          const std::string finer =
              past_microseconds(date) || past_microseconds(first)
                  ? ": times are kept to the microsecond, and these differ only past it; round "
                    "them to microseconds"
                  : "";
          const std::string why = !unmarked.empty() ? unmarked : !finer.empty() ? finer : set_back;
          if (o.series_col.empty())
            fail(table.where(b), ": date ", io::quoted(date), " appears again (", seen, ")",
                 why.empty() ? ": several series in one file? Name the column that tells them "
                               "apart in data.series_column"
                             : why);
          fail(table.where(b), ": series ", io::quoted(span.name), ": duplicate date ",
               io::quoted(date), " (", seen, ")", why);
        }
        steps.push_back(when[b] - when[a]);
      }
      if (!steps.empty()) {
        const Frequency& f = o.frequency;
        // How many steps of the calendar each one spans: 1, or more across a gap.
        std::vector<int64_t> spanned(steps.size());
        if (!out.numeric_times && !out.subsecond_times)
          span.months = calendar_months(when, out.rows, p, q,
                                        f.kind == Frequency::calendar_months ? f.months : 0,
                                        &span.month_end, &spanned);
        std::vector<int64_t> sorted = steps;
        std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
        span.step = sorted[sorted.size() / 2];
        // How many usual steps `s` spans, 0 if not a whole number of them. Numeric times are
        // rounded to millionths: a step of 1/24 reads as 41666 or 41667, and k of them within
        // k millionths of k usual steps (for a step of a thousand millionths or more, where a
        // millionth is rounding, not another step).
        auto whole_steps = [&](int64_t s) -> int64_t {
          if (!out.numeric_times || span.step < 1000) return s % span.step == 0 ? s / span.step : 0;
          const int64_t k = std::llround(double(s) / double(span.step));
          return k >= 1 && std::llabs(s - k * span.step) <= k ? k : 0;
        };
        // On a grid: every step a whole number of the usual one (or of calendar months).
        span.regular = span.months > 0 || std::all_of(steps.begin(), steps.end(), [&](int64_t s) {
                         return whole_steps(s) > 0;
                       });
        auto where = [&](int64_t k) { return table.where(out.rows[p + k]); };
        auto date = [&](int64_t k) { return io::quoted(date_text(out.rows[p + k])); };
        // Detected from the weekdays alone: a date of data.holidays in the data is then named
        // below, where a calendar-day reading would put forecasts on weekends.
        auto on_weekdays = [&] {
          const BusinessCalendar weekdays;
          for (int64_t k = p; k < q; ++k)
            if (!weekdays.is_business_day(when[out.rows[k]])) return false;
          return true;
        };
        if (f.kind == Frequency::business ||
            (f.kind == Frequency::automatic && !out.numeric_times && !out.subsecond_times &&
             span.months == 0 && span.step == 86400 &&
             std::any_of(steps.begin(), steps.end(), [](int64_t s) { return s != 86400; }) &&
             on_weekdays())) {
          span.business_days = true;
          const std::string why = f.kind == Frequency::business
                                      ? " (data.frequency B)"
                                      : " (the dates step by business days)";
          for (int64_t k = 0; k < q - p; ++k)
            if (const int64_t t = when[out.rows[p + k]]; !business.is_business_day(t))
              fail(where(k), ": ", date(k), " is ",
                   business.is_holiday(t) ? "listed in data.holidays" : "on a weekend",
                   ", not a business day", why);
          for (size_t k = 0; k < steps.size(); ++k) {
            spanned[k] = business.between(when[out.rows[p + k]], when[out.rows[p + k + 1]]);
            if (steps[k] % 86400 != 0)
              fail(where(int64_t(k) + 1), ": ", date(int64_t(k) + 1),
                   " is not at the time of day of the row before", why);
          }
          span.regular = true;
          span.step = 86400;
          span.months = 0;
        } else if (f.kind == Frequency::fixed) {
          // The steps are in microseconds where the dates hold fractions of a second, else in
          // seconds, where a step finer than a second cannot fall on them.
          const int64_t micros_per_tick = int64_t(SeriesData::kNumericTimeScale) / ticks;
          if (f.micros % micros_per_tick != 0)
            fail(path, ": data.frequency ", o.frequency.text,
                 " is finer than a second, and column '", o.date_col, "' holds whole seconds only");
          const int64_t step = f.micros / micros_per_tick;
          for (size_t k = 0; k < steps.size(); ++k) {
            if (steps[k] % step != 0)
              fail(where(int64_t(k) + 1), ": ", date(int64_t(k) + 1), " is ",
                   format_duration(steps[k], ticks), " after the row before, not a whole number ",
                   "of data.frequency ", o.frequency.text);
            spanned[k] = steps[k] / step;
          }
          span.step = step;
          span.months = 0;
          span.regular = true;
        } else if (f.kind == Frequency::calendar_months) {
          if (span.months != f.months && q - p > 1)
            fail(path, ": ", span.name.empty() ? "the" : "series '" + span.name + "':",
                 " dates do not step by whole multiples of ", f.months, " calendar month",
                 f.months > 1 ? "s" : "", " on one day of the month (data.frequency ",
                 o.frequency.text, "): see ", where(1));
        } else if (span.months == 0) {
          for (size_t k = 0; k < steps.size(); ++k)
            spanned[k] = span.regular                   ? whole_steps(steps[k])
                         : 2 * steps[k] > 3 * span.step ? 2
                                                        : 1;
          if (span.regular && out.numeric_times) {
            int64_t total = 0, count = 0;
            for (size_t k = 0; k < steps.size(); ++k) total += steps[k], count += spanned[k];
            span.exact_step = double(total) / double(count);
          }
          if (!span.regular) {
            ++off_grid_series;
            for (size_t k = 0; k < steps.size(); ++k)
              if (whole_steps(steps[k]) == 0 && off_grid++ == 0) {
                off_grid_step = span.step;
                off_grid_at = date(int64_t(k) + 1) + " at " + where(int64_t(k) + 1) + ", " +
                              (out.numeric_times ? numeric_time_text(steps[k])
                                                 : format_duration(steps[k], ticks)) +
                              " after the row before";
              }
          }
        }
        for (size_t k = 0; k < steps.size(); ++k)
          if (spanned[k] > 1) {
            ++gaps;
            out.gap_before[size_t(p) + k + 1] = 1;
            if (steps[k] > largest) {
              largest = steps[k];
              largest_at = date_text(out.rows[p + k]);
              if (!span.name.empty())
                largest_at = "series '" + span.name + "' after " + largest_at;
              else
                largest_at = "after " + largest_at;
            }
          }
      }
    }
    out.spans.push_back(span);
    p = q;
  }
  if (!o.date_col.empty()) {
    out.times.resize(n);
    for (int64_t p = 0; p < n; ++p) out.times[p] = when[out.rows[p]];
  }
  if (!o.series_col.empty()) {
    std::vector<std::string> series_names;
    for (const SeriesSpan& s : out.spans) series_names.push_back(s.name);
    if (const std::string alike = io::names_alike(series_names); !alike.empty())
      out.notes.push_back(path + ": series " + alike + " in column '" + o.series_col +
                          "' differ only in case, spaces or how a number is written: each is a "
                          "series of its own");
  }
  if (off_grid > 0)
    out.notes.push_back(
        path + ": " + std::to_string(off_grid) + " step" + (off_grid == 1 ? "" : "s") +
        " between " + (out.numeric_times ? "times" : "dates") +
        (off_grid_series > 1 ? " (in " + std::to_string(off_grid_series) + " series)" : "") +
        " not a whole number of the usual one (" +
        (out.numeric_times ? numeric_time_text(off_grid_step)
                           : format_duration(off_grid_step, ticks)) +
        "; the first " + off_grid_at +
        "): the rows are read as evenly spaced, and predict cannot date forecasts past the end" +
        (out.numeric_times ? "" : " (data.frequency makes a date off its step an error)"));
  if (gaps > 0)
    out.notes.push_back(
        path + ": " + std::to_string(gaps) + " gap" + (gaps == 1 ? "" : "s") + " in the " +
        (out.numeric_times ? "times" : "dates") + " longer than the usual step (the largest " +
        (out.numeric_times ? numeric_time_text(largest) + " in column '" + o.date_col + "'"
                           : format_duration(largest, ticks)) +
        ", " + largest_at + ")");
  return out;
}

}  // namespace seqforge::series
