#include "data/calendar.hpp"

#include <cmath>
#include <ctime>
#include <numbers>

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

}  // namespace seqforge
