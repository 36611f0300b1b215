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
  using namespace std::chrono;
  const auto day = floor<days>(t);
  const year_month_day ymd{day};
  const hh_mm_ss<milliseconds> time{t - day};
  char out[40];
  std::snprintf(out, sizeof out, "%04d-%02u-%02uT%02d:%02d:%02d.%03dZ", static_cast<int>(ymd.year()),
                static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                static_cast<int>(time.hours().count()), static_cast<int>(time.minutes().count()),
                static_cast<int>(time.seconds().count()),
                static_cast<int>(time.subseconds().count()));
  return out;
}

}  // namespace idem
