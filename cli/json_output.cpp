#include "json_output.h"

#include <algorithm>

#include "common.h"
#include "payload.h"
#ifdef IDEM_WITH_PROXY
#include "proxy/record.h"
#endif

namespace idem::cli {
namespace {

// Times are given twice: ISO-8601 UTC for people and epoch milliseconds for programs.
void put_time(nlohmann::ordered_json& out, const std::string& name, Timestamp t) {
  out[name] = iso8601(t);
  out[name + "_ms"] = t.time_since_epoch().count();
}

nlohmann::ordered_json optional_string(const std::optional<std::string>& s) {
  return s ? nlohmann::ordered_json(*s) : nlohmann::ordered_json(nullptr);
}

}  // namespace

nlohmann::ordered_json record_json(std::string_view store, std::string_view scope,
                                   std::string_view key, const std::optional<Record>& record) {
  nlohmann::ordered_json out;
  out["state"] = !record                                     ? "ABSENT"
                 : record->state == RecordState::kInProgress ? "IN_PROGRESS"
                                                             : "COMPLETE";
  out["store"] = std::string(store);
  out["scope"] = std::string(scope);
  out["key"] = std::string(key);
  if (!record) return out;
  const Record& r = *record;
  put_time(out, "now", r.now);
  out["token"] = r.token;
  out["fingerprint"] = optional_string(r.fingerprint);
  put_time(out, "expires_at", r.expires_at);
  if (r.state == RecordState::kInProgress) {
    out["attempt"] = r.attempt;
    put_time(out, "acquired_at", r.acquired_at);
    put_time(out, "lease_expires_at", r.lease_expires_at);
    // SPEC §6: time left by the store's own clock, never by ours.
    out["lease_remaining_ms"] = std::max<Duration::rep>(0, (r.lease_expires_at - r.now).count());
    out["lease_expired"] = r.lease_expires_at <= r.now;
    return out;
  }
  put_time(out, "completed_at", r.completed_at);
  // SPEC §4, §8: an expired COMPLETE is treated as absent even before it is purged.
  out["expired"] = r.expires_at <= r.now;
  out["payload_bytes"] = r.payload.size();
  if (std::optional<CommandResult> result = decode_payload(r.payload)) {
    out["format"] = "idem-run/" + std::to_string(kPayloadVersion);
    out["exit_status"] = result->exit_status;
    out["status_only"] = result->status_only;
    out["output_bytes"] = result->output.size();
    return out;
  }
#ifdef IDEM_WITH_PROXY
  if (std::optional<proxy::RecordedResponse> answer = proxy::decode_record(r.payload)) {
    // An HTTP answer `idem proxy` recorded (docs/proxy.md, "Record format").
    out["format"] = "idem-proxy/" + std::to_string(proxy::kRecordVersion);
    nlohmann::ordered_json http;
    http["status"] = answer->status;
    http["reason"] = answer->reason;
    nlohmann::ordered_json headers = nlohmann::ordered_json::array();
    for (const auto& [name, value] : answer->headers) headers.push_back({name, value});
    http["headers"] = std::move(headers);
    http["body_bytes"] = answer->body_omitted ? answer->body_size : answer->body.size();
    http["body_recorded"] = !answer->body_omitted;
    out["http"] = std::move(http);
    return out;
  }
#endif
  // Written by a library caller (or a newer idem) under the same scope.
  out["format"] = nullptr;
  return out;
}

std::string dump_json(const nlohmann::ordered_json& value) {
  return value.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace idem::cli
