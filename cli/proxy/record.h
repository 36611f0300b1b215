#pragma once

// The bytes `idem proxy` stores for a recorded upstream answer (docs/proxy.md, "Record
// format"). Every integer is big-endian:
//
//   offset 0   4 bytes  magic "IDMH"
//   offset 4   1 byte   format version, 1
//   offset 5   1 byte   flags: 0, or kFlagBodyOmitted
//   offset 6   2 bytes  status code (100 to 999)
//   offset 8   2 bytes  reason phrase length R, then R bytes of reason phrase
//   then       4 bytes  header count N, then N times:
//                         4 bytes name length, the name, 4 bytes value length, the value
//   then       ...      the body, byte for byte, to the end of the payload; or, with
//                       kFlagBodyOmitted, 8 bytes: the size of the body that was not kept
//
// Headers keep the upstream's order and spelling; hop-by-hop headers and Transfer-Encoding
// are never recorded (messages.h). A later format gets a new version number; a reader
// refuses versions it does not know rather than guess.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::proxy {

inline constexpr std::string_view kRecordMagic = "IDMH";
inline constexpr std::uint8_t kRecordVersion = 1;
// The answer was larger than the record limit: the record is a marker of its status and
// headers, without the body (SPEC §13: a request that ran is never run again because its
// answer was large).
inline constexpr std::uint8_t kFlagBodyOmitted = 0x01;

struct RecordedResponse {
  unsigned status = 200;
  std::string reason;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // A marker (kFlagBodyOmitted): `body` is empty and `body_size` says how large it was.
  bool body_omitted = false;
  std::uint64_t body_size = 0;
};

// The size encode_record(r) would have, without building it.
std::size_t encoded_size(const RecordedResponse& r);

std::string encode_record(const RecordedResponse& r);

// Decodes a payload written by encode_record. Returns nullopt with `why` filled when the
// bytes are not a record of this format (another magic, an unknown version or flag, a
// length that runs past the end).
std::optional<RecordedResponse> decode_record(std::string_view bytes, std::string* why = nullptr);

}  // namespace idem::proxy
