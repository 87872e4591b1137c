#pragma once
// Calendar features from dates (data.calendar).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace seqforge {

// The sine and cosine of where seconds-since-1970 `t` (UTC) lies in the cycle `name`
// (data.calendar): the hour of the day out of 24, the day of the week (Monday 0) out of 7, the
// day of the month out of the month's days, the day of the year out of the year's, the month
// out of 12.
std::pair<double, double> calendar_features(const std::string& name, int64_t t);

// Business days: Monday to Friday, less holidays (days since 1970-01-01, sorted).
class BusinessCalendar {
 public:
  explicit BusinessCalendar(std::vector<int64_t> holidays = {});
  bool is_business_day(int64_t t) const;  // the day of seconds-since-1970 `t`
  bool is_holiday(int64_t t) const;
  // The time `n` (>= 0) business days after `t`, at the same time of day.
  int64_t add(int64_t t, int64_t n) const;
  // Business days from the day of `a` to the day of `b` (b later): 1 for consecutive ones.
  int64_t between(int64_t a, int64_t b) const;

 private:
  std::vector<int64_t> holidays_;
};

// The dates of a holidays file (data.holidays): one ISO date per line, the first field of a CSV
// line (a first line that is not a date, a header, is skipped; blank lines and # comments too).
// Errors name the file and line. Returns days since 1970-01-01, sorted.
std::vector<int64_t> read_holidays(const std::string& path);

}  // namespace seqforge
