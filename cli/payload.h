#pragma once

// The bytes `idem run` stores for a completed command (docs/cli.md, "Payload format"):
//
//   offset 0  4 bytes  magic "IDEM"
//   offset 4  1 byte   format version, 1
//   offset 5  1 byte   flags: bit 0 set = status only (no output was recorded)
//   offset 6  1 byte   the command's exit status (0: only successful runs are recorded)
//   offset 7  1 byte   reserved, 0
//   offset 8  ...      the command's standard output, byte for byte (empty if status only)
//
// The header lets a later version add fields (a new version number) and lets `idem show`
// tell a record written by the tool from one a library caller wrote under the same scope.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idem::cli {

inline constexpr std::string_view kPayloadMagic = "IDEM";
inline constexpr std::uint8_t kPayloadVersion = 1;
inline constexpr std::size_t kPayloadHeaderBytes = 8;
inline constexpr std::uint8_t kFlagStatusOnly = 0x01;

struct CommandResult {
  std::uint8_t exit_status = 0;
  // True when only the exit status was recorded (`idem run --status-only`).
  bool status_only = false;
  // The command's standard output; empty when status_only.
  std::string output;
};

std::string encode_payload(const CommandResult& result);

// Decodes a payload written by encode_payload. Returns nullopt with `why` filled when the
// bytes are not an idem run record (too short, another magic, a newer version, unknown
// flags).
std::optional<CommandResult> decode_payload(std::string_view bytes, std::string* why = nullptr);

}  // namespace idem::cli
