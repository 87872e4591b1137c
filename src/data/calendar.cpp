#include "data/calendar.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <numbers>
#include <sstream>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/data/options.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/dates.hpp"

namespace seqforge {

namespace {

// Where `t` lies in the cycle `name`, and the cycle's length.
std::pair<double, double> calendar_phase(const std::string& name, int64_t t) {
  const std::time_t seconds = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  const double hour = tm.tm_hour + tm.tm_min / 60.0 + tm.tm_sec / 3600.0;
  const int year = tm.tm_year + 1900;
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  static constexpr int kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (name == "hour") return {hour, 24.0};
  if (name == "dayofweek") return {(tm.tm_wday + 6) % 7 + hour / 24, 7.0};
  if (name == "dayofmonth")
    return {tm.tm_mday - 1 + hour / 24, double(kDays[tm.tm_mon] + (tm.tm_mon == 1 && leap))};
  if (name == "dayofyear") return {tm.tm_yday + hour / 24, leap ? 366.0 : 365.0};
  return {double(tm.tm_mon), 12.0};  // month
}

}  // namespace

std::pair<double, double> calendar_features(const std::string& name, int64_t t) {
  const auto [phase, period] = calendar_phase(name, t);
  const double angle = 2 * std::numbers::pi * phase / period;
  return {std::sin(angle), std::cos(angle)};
}

namespace {
constexpr int64_t kDay = 86400;
int64_t day_of(int64_t t) { return t >= 0 ? t / kDay : -((-t + kDay - 1) / kDay); }
bool weekend(int64_t day) { return ((day % 7 + 7) % 7 + 3) % 7 >= 5; }  // day 0: a Thursday
}  // namespace

BusinessCalendar::BusinessCalendar(std::vector<int64_t> holidays) : holidays_(std::move(holidays)) {
  std::sort(holidays_.begin(), holidays_.end());
}

bool BusinessCalendar::is_holiday(int64_t t) const {
  return std::binary_search(holidays_.begin(), holidays_.end(), day_of(t));
}

bool BusinessCalendar::is_business_day(int64_t t) const {
  return !weekend(day_of(t)) && !is_holiday(t);
}

int64_t BusinessCalendar::add(int64_t t, int64_t n) const {
  while (n > 0) {
    t += kDay;
    n -= is_business_day(t);
  }
  return t;
}

int64_t BusinessCalendar::between(int64_t a, int64_t b) const {
  int64_t n = 0;
  for (int64_t day = day_of(a) + 1; day <= day_of(b); ++day) n += is_business_day(day * kDay);
  return n;
}

Frequency parse_frequency(const std::string& text, const std::string& where) {
  Frequency f;
  f.text = text;
  if (text == "auto") return f;
  if (text == "B") return f.kind = Frequency::business, f;
  if (text == "M" || text == "Q" || text == "Y") {
    f.kind = Frequency::calendar_months;
    f.months = text == "M" ? 1 : text == "Q" ? 3 : 12;
    return f;
  }
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  const int64_t n = digits ? std::strtoll(text.substr(0, digits).c_str(), nullptr, 10) : 1;
  constexpr int64_t kSecond = 1000000;
  const std::pair<const char*, int64_t> units[] = {{"us", 1},
                                                   {"ms", 1000},
                                                   {"s", kSecond},
                                                   {"min", 60 * kSecond},
                                                   {"h", 3600 * kSecond},
                                                   {"H", 3600 * kSecond},
                                                   {"D", 86400 * kSecond},
                                                   {"W", 7 * 86400 * kSecond}};
  for (const auto& [name, micros] : units)
    if (unit == name && n > 0 && digits <= 9) {
      if (n > std::numeric_limits<int64_t>::max() / micros)
        fail(where, ": data.frequency '", text, "' is longer than any span of dates");
      f.kind = Frequency::fixed;
      f.micros = n * micros;
      return f;
    }
  fail(where,
       ": data.frequency must be auto, B (business days), M, Q, Y (calendar months, "
       "quarters, years) or a step such as 250ms, s, 15min, h, 6h, D or W; got '",
       text, "'");
}

std::vector<int64_t> read_holidays(const std::string& path) {
  std::string text;
  try {
    text = io::read_text_file(path);
  } catch (const std::exception& e) {
    fail(e.what(), " (data.holidays)");
  }
  std::istringstream in(text);
  std::vector<int64_t> days;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string field = line.substr(0, line.find(','));
    if (field.empty() || field[0] == '#') continue;
    const auto t = io::parse_datetime(field);
    if (!t) {
      if (number == 1) continue;  // a header
      fail(path, ":", number, ": '", field, "' is not an ISO date (data.holidays)");
    }
    days.push_back(day_of(*t));
  }
  std::sort(days.begin(), days.end());
  return days;
}

int64_t calendar_months(const std::vector<int64_t>& when, const std::vector<int64_t>& order,
                        int64_t p, int64_t q, int64_t want, bool* month_end,
                        std::vector<int64_t>* spanned) {
  if (q - p < 2) return 0;
  const io::CivilTime first = io::civil_time(when[order[p]]);
  bool same_day = true, last_day = first.day == first.days_in_month;
  std::vector<int64_t> months;
  io::CivilTime prev = first;
  for (int64_t k = p + 1; k < q; ++k) {
    const io::CivilTime c = io::civil_time(when[order[k]]);
    same_day = same_day && c.day == first.day;
    last_day = last_day && c.day == c.days_in_month;
    if ((!same_day && !last_day) || c.second_of_day != first.second_of_day) return 0;
    const int64_t step = c.month_index - prev.month_index;
    if (step <= 0) return 0;
    months.push_back(step);
    prev = c;
  }
  int64_t unit = want;
  if (unit == 0) {
    std::vector<int64_t> sorted = months;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    unit = sorted[sorted.size() / 2];
  }
  for (int64_t m : months)
    if (m % unit != 0) return 0;
  *month_end = !same_day;
  spanned->resize(months.size());
  for (size_t k = 0; k < months.size(); ++k) (*spanned)[k] = months[k] / unit;
  return unit;
}

bool clock_set_back(int64_t when, const std::string& text) {
  if (text.find(':') == std::string::npos) return false;
  const io::CivilTime t = io::civil_time(when);
  const int64_t days = (when - t.second_of_day) / 86400;
  const int64_t weekday = ((days % 7) + 7 + 4) % 7;  // 1970-01-01 was a Thursday; 0: Sunday
  const int64_t month = t.month_index % 12 + 1;
  return weekday == 0 && (month == 3 || month == 4 || month == 10 || month == 11) &&
         t.second_of_day < 4 * 3600;
}

bool is_date_cell(std::string_view cell) {
  if (io::parse_finite(cell)) return false;
  for (io::DateLayout layout : {io::DateLayout::iso, io::DateLayout::day_first,
                                io::DateLayout::month_first, io::DateLayout::named_month})
    if (io::parse_date(cell, layout)) return true;
  return false;
}

}  // namespace seqforge
