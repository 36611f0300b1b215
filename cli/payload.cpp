#include "payload.h"

#include <fmt/core.h>

namespace idem::cli {

std::string encode_payload(const CommandResult& result) {
  std::string out;
  std::string_view output = result.status_only ? std::string_view{} : result.output;
  out.reserve(kPayloadHeaderBytes + output.size());
  out += kPayloadMagic;
  out += static_cast<char>(kPayloadVersion);
  out += static_cast<char>(result.status_only ? kFlagStatusOnly : 0);
  out += static_cast<char>(result.exit_status);
  out += '\0';
  out += output;
  return out;
}

std::optional<CommandResult> decode_payload(std::string_view bytes, std::string* why) {
  auto fail = [why](std::string message) -> std::optional<CommandResult> {
    if (why != nullptr) *why = std::move(message);
    return std::nullopt;
  };
  if (bytes.size() < kPayloadHeaderBytes ||
      bytes.substr(0, kPayloadMagic.size()) != kPayloadMagic) {
    return fail("the stored result was not written by `idem run`");
  }
  auto version = static_cast<std::uint8_t>(bytes[4]);
  auto flags = static_cast<std::uint8_t>(bytes[5]);
  if (version != kPayloadVersion) {
    return fail(fmt::format(
        "the stored result has format version {}; this idem reads version {} (upgrade idem)",
        version, kPayloadVersion));
  }
  if ((flags & ~kFlagStatusOnly) != 0 || bytes[7] != '\0') {
    return fail(fmt::format("the stored result has unknown flags 0x{:02x}", flags));
  }
  CommandResult result;
  result.status_only = (flags & kFlagStatusOnly) != 0;
  result.exit_status = static_cast<std::uint8_t>(bytes[6]);
  if (result.status_only && bytes.size() != kPayloadHeaderBytes) {
    return fail("the stored result is marked status-only but carries output");
  }
  result.output = std::string(bytes.substr(kPayloadHeaderBytes));
  return result;
}

}  // namespace idem::cli
