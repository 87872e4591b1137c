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

// The calendar months `unit` that the dates of rows [p, q) of `order` step by (`when` holds each
// file row's time), each step a whole number of units (more than one across a gap, counted into
// `spanned`), at the same time of day and on the same day of the month (or else each month's last
// day: `*month_end`); the unit is `want`, or with 0 the median step; 0 when the dates do not step
// so.
int64_t calendar_months(const std::vector<int64_t>& when, const std::vector<int64_t>& order,
                        int64_t p, int64_t q, int64_t want, bool* month_end,
                        std::vector<int64_t>* spanned);

// Whether a time written twice (its text `text`) may be the hour a local clock repeats when it is
// set back for daylight saving time: a time of day before 04:00 on a Sunday of March, April,
// October or November (the northern and southern hemispheres' autumns).
bool clock_set_back(int64_t when, const std::string& text);

// Whether a cell is a date or date-time in any layout that is not also a number (20201231 is
// both).
bool is_date_cell(std::string_view cell);

}  // namespace seqforge
