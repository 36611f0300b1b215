#include "idem/types.h"

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

}  // namespace idem
