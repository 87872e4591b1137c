// Dates and times as data files write them (see dates.hpp): a small scanner per layout, and
// std::chrono's civil calendar for the arithmetic.
#include "seqforge/io/dates.hpp"

#include <cctype>
#include <chrono>
#include <cstdio>

#include "io/file_util.hpp"

namespace seqforge::io {

namespace {

// A cursor over a date's text.
struct DateScanner {
  std::string_view s;
  size_t i = 0;

  bool done() const { return i == s.size(); }
  // From `least` to `most` digits, as many as there are.
  bool number(size_t least, size_t most, int* out) {
    size_t k = 0;
    int v = 0;
    while (k < most && i + k < s.size() && s[i + k] >= '0' && s[i + k] <= '9')
      v = v * 10 + (s[i + k++] - '0');
    if (k < least) return false;
    *out = v;
    i += k;
    return true;
  }
  bool literal(char c) {
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool word(std::string_view w) {  // any case
    if (s.size() - i < w.size()) return false;
    for (size_t k = 0; k < w.size(); ++k)
      if (std::toupper(static_cast<unsigned char>(s[i + k])) != w[k]) return false;
    i += w.size();
    return true;
  }
};

// Seconds since 1970 at midnight of a calendar date; nullopt for an impossible one.
std::optional<int64_t> midnight(int y, int mo, int d) {
  namespace chr = std::chrono;
  const chr::year_month_day ymd{chr::year{y}, chr::month{static_cast<unsigned>(mo)},
                                chr::day{static_cast<unsigned>(d)}};
  if (!ymd.ok()) return std::nullopt;
  return int64_t{chr::sys_days{ymd}.time_since_epoch().count()} * 86400;
}

// The rest of a date-time after its date: nothing, or 'T' or ' ' and HH:MM[:SS[.fff]] and an
// optional Z or UTC offset (+HH:MM, +HHMM or +HH). Returns the seconds to add (the offset taken
// off; `*zoned`: one was written, Z included). `clock12`: one-digit hours too, and an optional
// AM/PM after a space.
std::optional<int64_t> time_of_day(DateScanner& c, bool clock12, int64_t* offset, bool* zoned) {
  *offset = 0;
  *zoned = false;
  if (c.done()) return 0;
  if (!c.literal('T') && !c.literal('t') && !c.literal(' ')) return std::nullopt;
  int h = 0, mi = 0, sec = 0;
  if (!c.number(clock12 ? 1 : 2, 2, &h) || !c.literal(':') || !c.number(2, 2, &mi))
    return std::nullopt;
  if (c.literal(':')) {
    if (!c.number(2, 2, &sec)) return std::nullopt;
    if (c.literal('.') || c.literal(',')) {  // a fraction (ISO's comma too): 1+ digits, dropped
      const size_t start = c.i;
      while (!c.done() && c.s[c.i] >= '0' && c.s[c.i] <= '9') ++c.i;
      if (c.i == start) return std::nullopt;
    }
  }
  if (clock12 && c.literal(' ')) {
    const bool am = c.word("AM"), pm = !am && c.word("PM");
    if ((!am && !pm) || h < 1 || h > 12) return std::nullopt;
    h = h % 12 + (pm ? 12 : 0);
  }
  if (h > 23 || mi > 59 || sec > 59) return std::nullopt;
  const int64_t seconds = h * 3600 + mi * 60 + sec;
  if (c.done()) return seconds;
  *zoned = true;
  if (c.literal('Z') || c.literal('z') || c.word(" UTC") || c.word(" GMT"))
    return c.done() ? std::optional(seconds) : std::nullopt;
  const int sign = c.literal('+') ? 1 : c.literal('-') ? -1 : 0;
  int oh = 0, om = 0;
  if (sign == 0 || !c.number(2, 2, &oh)) return std::nullopt;
  // +HH:MM, +HHMM, or +HH (PostgreSQL's timestamptz output)
  if (!c.done() && (c.literal(':'), !c.number(2, 2, &om))) return std::nullopt;
  if (oh > 23 || om > 59 || !c.done()) return std::nullopt;
  *offset = sign * (oh * 3600 + om * 60);
  return seconds - *offset;
}

}  // namespace

std::optional<int64_t> parse_datetime(std::string_view s) { return parse_date(s, DateLayout::iso); }

int64_t microseconds_of(std::string_view s) {
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  for (size_t i = 0; i + 4 < s.size(); ++i) {  // ":SS." (or ":SS,") and its digits
    if (s[i] != ':' || !digit(s[i + 1]) || !digit(s[i + 2]) || (s[i + 3] != '.' && s[i + 3] != ','))
      continue;
    int64_t micros = 0;
    size_t k = i + 4;
    for (int place = 0; place < 6; ++place) {
      const bool more = k < s.size() && digit(s[k]);
      micros = micros * 10 + (more ? s[k++] - '0' : 0);
    }
    return micros;
  }
  return 0;
}

namespace {

std::optional<int64_t> parse_iso(std::string_view s, int64_t* offset, bool* zoned) {
  DateScanner c{trim(s)};
  int y = 0, mo = 0, d = 0;
  if (!c.number(4, 4, &y)) return std::nullopt;
  const char sep = c.literal('-') ? '-' : c.literal('/') ? '/' : 0;
  const size_t month_at = c.i;
  if (sep == 0 || !c.number(1, 2, &mo)) return std::nullopt;
  if (c.done())  // a month: "2012-01"
    return sep == '-' && c.i - month_at == 2 ? midnight(y, mo, 1) : std::nullopt;
  if (!c.literal(sep) || !c.number(1, 2, &d)) return std::nullopt;
  const auto day = midnight(y, mo, d);
  const auto time = day ? time_of_day(c, false, offset, zoned) : std::nullopt;
  if (!time) return std::nullopt;
  return *day + *time;
}

// "D/M/YYYY" (also with '.' or '-', one or two digits each for D and M): the two leading fields
// and the year, the cursor past them.
bool day_month_year(DateScanner& c, int* first, int* second, int* year) {
  if (!c.number(1, 2, first)) return false;
  const char sep = c.literal('/') ? '/' : c.literal('.') ? '.' : c.literal('-') ? '-' : 0;
  return sep != 0 && c.number(1, 2, second) && c.literal(sep) && c.number(4, 4, year);
}

// A month's English name or abbreviation (Jan, Sept, January; any case, an optional '.' after an
// abbreviation): 1 to 12, the cursor past it; 0 for anything else.
int month_name(DateScanner& c) {
  static constexpr std::string_view kNames[] = {"JANUARY",   "FEBRUARY", "MARCH",    "APRIL",
                                                "MAY",       "JUNE",     "JULY",     "AUGUST",
                                                "SEPTEMBER", "OCTOBER",  "NOVEMBER", "DECEMBER"};
  size_t end = c.i;
  while (end < c.s.size() && std::isalpha(static_cast<unsigned char>(c.s[end]))) ++end;
  std::string word(c.s.substr(c.i, end - c.i));
  for (char& ch : word) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (int m = 0; m < 12; ++m) {
    const bool abbreviation = word == kNames[m].substr(0, 3) || (m == 8 && word == "SEPT");
    if (word != kNames[m] && !abbreviation) continue;
    c.i = end;
    if (abbreviation) c.literal('.');  // "May." too
    return m + 1;
  }
  return 0;
}

// "Dec 31, 2020", "December 31 2020", "31 Dec 2020", "31-Dec-2020": day, month and year, the
// cursor past them.
bool named_month_date(DateScanner& c, int* day, int* month, int* year) {
  if ((*month = month_name(c))) {  // month first
    if (!c.literal(' ') || !c.number(1, 2, day)) return false;
    c.literal(',');
    return c.literal(' ') && c.number(4, 4, year);
  }
  if (!c.number(1, 2, day)) return false;
  const char sep = c.literal(' ') ? ' ' : c.literal('-') ? '-' : c.literal('/') ? '/' : 0;
  if (sep == 0 || !(*month = month_name(c))) return false;
  if (sep == ' ') c.literal(',');
  return c.literal(sep) && c.number(4, 4, year);
}

}  // namespace

std::optional<std::pair<int, int>> day_month_fields(std::string_view s) {
  DateScanner c{trim(s)};
  int a = 0, b = 0, y = 0;
  if (!day_month_year(c, &a, &b, &y)) return std::nullopt;
  return std::pair{a, b};
}

std::optional<int64_t> parse_date(std::string_view s, DateLayout layout, int64_t* offset,
                                  bool* zoned) {
  int64_t ignored_offset = 0;
  bool ignored_zone = false;
  if (!offset) offset = &ignored_offset;
  if (!zoned) zoned = &ignored_zone;
  *offset = 0;
  *zoned = false;
  if (layout == DateLayout::iso) return parse_iso(s, offset, zoned);
  DateScanner c{trim(s)};
  int y = 0, mo = 0, d = 0;
  if (layout == DateLayout::compact || layout == DateLayout::compact_month) {
    const size_t digits = layout == DateLayout::compact ? 8 : 6;
    if (!c.number(digits, digits, &y)) return std::nullopt;
    if (c.literal('.')) {  // "20201231.0", as a float column writes it
      if (!c.literal('0')) return std::nullopt;
      while (c.literal('0')) {
      }
    }
    if (!c.done()) return std::nullopt;
    if (layout == DateLayout::compact)
      d = y % 100, mo = y / 100 % 100, y /= 10000;
    else
      d = 1, mo = y % 100, y /= 100;
    if (y < 1800 || y >= 2200) return std::nullopt;  // a number of so many digits, not a date
    return midnight(y, mo, d);
  }
  if (layout == DateLayout::compact_time) {
    const size_t digits = c.s.find_first_not_of("0123456789");
    if (digits != std::string_view::npos ||
        (c.s.size() != 10 && c.s.size() != 12 && c.s.size() != 14))
      return std::nullopt;
    int h = 0, mi = 0, sec = 0;
    if (!c.number(8, 8, &y) || !c.number(2, 2, &h) || (!c.done() && !c.number(2, 2, &mi)) ||
        (!c.done() && !c.number(2, 2, &sec)) || !c.done())
      return std::nullopt;
    d = y % 100, mo = y / 100 % 100, y /= 10000;
    if (y < 1800 || y >= 2200 || h > 23 || mi > 59 || sec > 59) return std::nullopt;
    const auto day = midnight(y, mo, d);
    if (!day) return std::nullopt;
    return *day + h * 3600 + mi * 60 + sec;
  }
  if (layout == DateLayout::named_month ? !named_month_date(c, &d, &mo, &y)
                                        : !day_month_year(c, &d, &mo, &y))
    return std::nullopt;
  if (layout == DateLayout::month_first) std::swap(d, mo);
  const auto day = midnight(y, mo, d);
  const auto time = day ? time_of_day(c, true, offset, zoned) : std::nullopt;
  if (!time) return std::nullopt;
  return *day + *time;
}

namespace {

// Whole days since 1970 (rounded down) and the seconds into the last of them.
std::pair<int64_t, int64_t> days_and_rest(int64_t seconds) {
  const int64_t days = seconds >= 0 ? seconds / 86400 : -((-seconds + 86399) / 86400);
  return {days, seconds - days * 86400};
}

}  // namespace

CivilTime civil_time(int64_t seconds) {
  namespace chr = std::chrono;
  const auto [days, rest] = days_and_rest(seconds);
  const chr::year_month_day ymd{chr::sys_days{chr::days{days}}};
  const chr::year_month_day_last last{ymd.year(), chr::month_day_last{ymd.month()}};
  return {.month_index =
              int64_t{static_cast<int>(ymd.year())} * 12 + static_cast<unsigned>(ymd.month()) - 1,
          .day = static_cast<unsigned>(ymd.day()),
          .days_in_month = static_cast<unsigned>(last.day()),
          .second_of_day = rest};
}

int64_t add_months(int64_t seconds, int64_t months, bool month_end) {
  namespace chr = std::chrono;
  const auto [days, rest] = days_and_rest(seconds);
  const chr::year_month_day ymd{chr::sys_days{chr::days{days}}};
  const chr::year_month ym = chr::year_month{ymd.year(), ymd.month()} + chr::months{months};
  const chr::day last = chr::year_month_day_last{ym.year(), chr::month_day_last{ym.month()}}.day();
  const chr::day day = month_end ? last : std::min(ymd.day(), last);
  return int64_t{chr::sys_days{ym / day}.time_since_epoch().count()} * 86400 + rest;
}

std::string format_datetime(int64_t seconds, bool date_only) {
  namespace chr = std::chrono;
  const auto [days, rest] = days_and_rest(seconds);
  const chr::year_month_day ymd{chr::sys_days{chr::days{days}}};
  char buf[48];
  if (date_only && rest == 0) {
    std::snprintf(buf, sizeof buf, "%04d-%02u-%02u", static_cast<int>(ymd.year()),
                  static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()));
  } else {
    std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d", static_cast<int>(ymd.year()),
                  static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                  static_cast<int>(rest / 3600), static_cast<int>(rest / 60 % 60),
                  static_cast<int>(rest % 60));
  }
  return buf;
}

}  // namespace seqforge::io
