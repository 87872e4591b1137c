#pragma once
// Calendar features from dates (data.calendar).
#include <cstdint>
#include <string>
#include <utility>

namespace seqforge {

// The sine and cosine of where seconds-since-1970 `t` (UTC) lies in the cycle `name`
// (data.calendar): the hour of the day out of 24, the day of the week (Monday 0) out of 7, the
// day of the month out of the month's days, the day of the year out of the year's, the month
// out of 12.
std::pair<double, double> calendar_features(const std::string& name, int64_t t);

}  // namespace seqforge
