#pragma once
// Dates and times as data files write them: ISO 8601 and the other layouts a date column may use,
// read into seconds since 1970 (UTC); calendar arithmetic on those seconds; ISO text back.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace seqforge::io {

// Seconds since 1970-01-01T00:00:00 UTC of an ISO 8601 date or date-time: "2012-01-01",
// "2012-01-01 13:00", "2012-01-01T13:00:00", with optional fractional seconds after a '.' or ISO's
// ',' ("13:00:00,250", as loggers write them; dropped: see microseconds_of) and an optional "Z" (or
// " UTC") or "+HH:MM"/"-HH:MM" offset after a time. Surrounding spaces are ignored. Returns nullopt
// for anything else, including impossible dates such as 2013-02-29 or 24:00.
std::optional<int64_t> parse_datetime(std::string_view s);

// The ways a date column may write its dates: ISO 8601 (parse_datetime; also with '/' between
// year, month and day, or one digit for either), day first ("31/12/2020", "31.12.2020",
// "31-12-2020", with one or two digits for day and month), month first ("12/31/2020"), compact
// ("20201231"), or with the month's English name or its abbreviation ("Dec 31, 2020",
// "December 31 2020", "31 Dec 2020", "31-Dec-2020"; four-digit years). All but compact take an
// optional time as ISO's; day and month first and named months also one-digit hours and AM/PM
// on a 12-hour clock ("31/12/2020 13:45", "12/31/2020 1:45:00 PM"). A time may end in " UTC".
// compact: YYYYMMDD; compact_month: YYYYMM (a month's first day, as statistics offices and
// databases write months); both also with a float column's ".0" ("20201231.0"); compact_time:
// YYYYMMDDHH, YYYYMMDDHHMM or YYYYMMDDHHMMSS (10, 12 or 14 digits, as Germany's weather service
// writes MESS_DATUM).
enum class DateLayout {
  iso,
  day_first,
  month_first,
  compact,
  compact_month,
  compact_time,
  named_month
};

// Seconds since 1970 (UTC) of `s` written in `layout`; nullopt when it is not such a date.
// `offset`, where given, receives the UTC offset written after a time in seconds (0 without one):
// the local time is the result plus it; `zoned`, whether the time is marked as UTC or with an
// offset (Z, " UTC" and +00:00 too).
std::optional<int64_t> parse_date(std::string_view s, DateLayout layout, int64_t* offset = nullptr,
                                  bool* zoned = nullptr);

// The fraction of a second a date-time writes after its seconds, in microseconds
// ("13:45:07.250" or "13:45:07,250" -> 250000; digits past the sixth are dropped), which parse_date
// drops; 0 without one.
int64_t microseconds_of(std::string_view s);

// The day-and-month fields of a day- or month-first date ("31/12/2020" -> {31, 12}); nullopt for
// any other text.
std::optional<std::pair<int, int>> day_month_fields(std::string_view s);

// The calendar parts of seconds since 1970 (UTC).
struct CivilTime {
  int64_t month_index = 0;  // year * 12 + month - 1
  unsigned day = 0, days_in_month = 0;
  int64_t second_of_day = 0;
};
CivilTime civil_time(int64_t seconds);

// Seconds since 1970 (UTC) plus `months` calendar months at the same time of day: on the same day
// of the month (the month's last day where that day does not exist), or with `month_end` on the
// month's last day.
int64_t add_months(int64_t seconds, int64_t months, bool month_end = false);

// The ISO 8601 text of seconds since 1970 (UTC): "2012-01-01" when it is midnight and
// `date_only`, else "2012-01-01T13:00:00".
std::string format_datetime(int64_t seconds, bool date_only = true);

}  // namespace seqforge::io
