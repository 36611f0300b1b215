#include "record.h"

#include <limits>

namespace idem::proxy {
namespace {

constexpr std::size_t kFixedBytes = 4 + 1 + 1 + 2 + 2 + 4;

void put(std::string& out, std::uint64_t value, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out += static_cast<char>((value >> (8 * i)) & 0xff);
}

// Reads big-endian integers and byte runs, failing (rather than reading past the end) on a
// truncated payload.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}
  bool number(int bytes, std::uint64_t* out) {
    if (rest_.size() < static_cast<std::size_t>(bytes)) return false;
    std::uint64_t value = 0;
    for (int i = 0; i < bytes; ++i)
      value = (value << 8) | static_cast<unsigned char>(rest_[static_cast<std::size_t>(i)]);
    rest_.remove_prefix(static_cast<std::size_t>(bytes));
    *out = value;
    return true;
  }
  bool run(std::uint64_t size, std::string* out) {
    if (rest_.size() < size) return false;
    out->assign(rest_.data(), static_cast<std::size_t>(size));
    rest_.remove_prefix(static_cast<std::size_t>(size));
    return true;
  }
  std::string_view rest() const { return rest_; }

 private:
  std::string_view rest_;
};

}  // namespace

std::size_t encoded_size(const RecordedResponse& r) {
  std::size_t size = kFixedBytes + r.reason.size() + (r.body_omitted ? 8 : r.body.size());
  for (const auto& [name, value] : r.headers) size += 8 + name.size() + value.size();
  return size;
}

std::string encode_record(const RecordedResponse& r) {
  std::string out;
  out.reserve(encoded_size(r));
  out += kRecordMagic;
  out += static_cast<char>(kRecordVersion);
  out += static_cast<char>(r.body_omitted ? kFlagBodyOmitted : 0);
  put(out, r.status, 2);
  // A reason phrase longer than 64 KiB cannot come from a parser with a header limit; cut
  // it rather than write a length that lies.
  std::string_view reason(r.reason);
  reason = reason.substr(0, std::numeric_limits<std::uint16_t>::max());
  put(out, reason.size(), 2);
  out += reason;
  put(out, r.headers.size(), 4);
  for (const auto& [name, value] : r.headers) {
    put(out, name.size(), 4);
    out += name;
    put(out, value.size(), 4);
    out += value;
  }
  if (r.body_omitted) {
    put(out, r.body_size, 8);
  } else {
    out += r.body;
  }
  return out;
}

std::optional<RecordedResponse> decode_record(std::string_view bytes, std::string* why) {
  auto fail = [why](std::string message) -> std::optional<RecordedResponse> {
    if (why != nullptr) *why = std::move(message);
    return std::nullopt;
  };
  if (bytes.size() < kFixedBytes || bytes.substr(0, kRecordMagic.size()) != kRecordMagic) {
    return fail("the stored result is not an HTTP answer recorded by `idem proxy`");
  }
  Reader in(bytes.substr(kRecordMagic.size()));
  std::uint64_t version = 0, flags = 0, status = 0, reason_size = 0, count = 0;
  (void)in.number(1, &version);
  (void)in.number(1, &flags);
  if (version != kRecordVersion) {
    return fail("the recorded answer has format version " + std::to_string(version) +
                "; this idem reads version " + std::to_string(kRecordVersion));
  }
  if ((flags & ~std::uint64_t{kFlagBodyOmitted}) != 0) {
    return fail("the recorded answer has unknown flags " + std::to_string(flags));
  }
  RecordedResponse r;
  (void)in.number(2, &status);
  if (status < 100 || status > 999) {
    return fail("the recorded answer has status " + std::to_string(status));
  }
  r.status = static_cast<unsigned>(status);
  if (!in.number(2, &reason_size) || !in.run(reason_size, &r.reason) || !in.number(4, &count)) {
    return fail("the recorded answer is truncated");
  }
  // Each header takes at least 8 bytes, so a count larger than that is a lie, not a reason
  // to reserve memory.
  if (count > in.rest().size() / 8) return fail("the recorded answer is truncated");
  r.headers.reserve(static_cast<std::size_t>(count));
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint64_t size = 0;
    std::string name, value;
    if (!in.number(4, &size) || !in.run(size, &name) || !in.number(4, &size) ||
        !in.run(size, &value)) {
      return fail("the recorded answer is truncated");
    }
    r.headers.emplace_back(std::move(name), std::move(value));
  }
  if ((flags & kFlagBodyOmitted) != 0) {
    r.body_omitted = true;
    if (!in.number(8, &r.body_size) || !in.rest().empty()) {
      return fail("the recorded answer's marker is malformed");
    }
    return r;
  }
  r.body = std::string(in.rest());
  return r;
}

}  // namespace idem::proxy
