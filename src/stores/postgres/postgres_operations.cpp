#include "stores/postgres/postgres_operations.h"

#include "core/record_id.h"

namespace idem::postgres {

Row row_of(const Result& r, int row, bool with_outcome) {
  Row out;
  out.state = r.int2(row, kColState);
  out.token = static_cast<Token>(r.int8(row, kColToken));
  out.attempt = static_cast<std::uint32_t>(r.int4(row, kColAttempt));
  out.expires_at = r.time(row, kColExpiresAt);
  if (out.state == kStateComplete) {
    out.completed_at = r.time(row, kColCompletedAt);
    out.payload = std::string(r.bytes(row, kColPayload));
  } else {
    out.acquired_at = r.time(row, kColAcquiredAt);
    out.lease_expires_at = r.time(row, kColLeaseExpiresAt);
  }
  if (!r.is_null(row, kColFingerprint)) {
    out.fingerprint = std::string(r.bytes(row, kColFingerprint));
  }
  out.now = r.time(row, kColNow);
  if (with_outcome) out.outcome = r.int2(row, kColOutcome);
  return out;
}

std::optional<AcquireResult> live_answer(Row& r) {
  if (r.state == kStateComplete) {
    if (r.expires_at <= r.now) return std::nullopt;
    return Replay{std::move(r.payload), r.completed_at, r.expires_at, std::move(r.fingerprint)};
  }
  if (r.lease_expires_at <= r.now) return std::nullopt;
  return Busy{r.lease_expires_at, r.lease_expires_at - r.now, std::move(r.fingerprint)};
}

std::string record_id(std::string_view scope, std::string_view key) {
  std::string id;
  detail::encode_record_id(id, scope, key);
  return id;
}

}  // namespace idem::postgres
