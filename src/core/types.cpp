#include "idem/types.h"

#include <chrono>
#include <cstdio>

namespace idem {

const char* to_string(RecordState state) {
  switch (state) {
    case RecordState::kInProgress:
      return "IN_PROGRESS";
    case RecordState::kComplete:
      return "COMPLETE";
  }
  return "UNKNOWN";
}

const char* to_string(WriteResult result) {
  switch (result) {
    case WriteResult::kDone:
      return "done";
    case WriteResult::kFenced:
      return "fenced";
  }
  return "unknown";
}

std::string to_iso8601(Timestamp t) {
  // Integer arithmetic only, rounded down without negating or multiplying back, so that
  // every Timestamp formats, the extremes included (chrono's floor<days> and the calendar
  // types overflow there). The date is the proleptic Gregorian calendar's (H. Hinnant's
  // civil_from_days).
  const std::int64_t ms = t.time_since_epoch().count();
  std::int64_t seconds = ms / 1000;
  std::int64_t millis = ms % 1000;
  if (millis < 0) {
    --seconds;
    millis += 1000;
  }
  std::int64_t days = seconds / 86400;
  std::int64_t in_day = seconds % 86400;
  if (in_day < 0) {
    --days;
    in_day += 86400;
  }
  const std::int64_t z = days + 719468;
  const std::int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const std::int64_t doe = z - era * 146097;                                       // [0, 146096]
  const std::int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;  // [0, 399]
  const std::int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);                // [0, 365]
  const std::int64_t mp = (5 * doy + 2) / 153;                                     // [0, 11]
  const std::int64_t day = doy - (153 * mp + 2) / 5 + 1;
  const std::int64_t month = mp < 10 ? mp + 3 : mp - 9;
  const std::int64_t year = yoe + era * 400 + (month <= 2 ? 1 : 0);
  char out[64];
  std::snprintf(out, sizeof out, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lld.%03lldZ",
                static_cast<long long>(year), static_cast<long long>(month),
                static_cast<long long>(day), static_cast<long long>(in_day / 3600),
                static_cast<long long>(in_day / 60 % 60), static_cast<long long>(in_day % 60),
                static_cast<long long>(millis));
  return out;
}

}  // namespace idem
