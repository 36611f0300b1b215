// The tool's output: its messages on stderr, writing stdout whole, and bytes shown
// printable.

#include <fmt/core.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common.h"

namespace idem::cli {

void print_error(std::string_view command, std::string_view message) {
  std::string line = command.empty() ? fmt::format("idem: {}\n", message)
                                     : fmt::format("idem {}: {}\n", command, message);
  (void)write_all(STDERR_FILENO, line);
}

OutputError::OutputError(int error)
    : std::runtime_error(fmt::format("cannot write to standard output: {}", std::strerror(error))),
      error_(error) {}

void write_stdout(std::string_view bytes) {
  if (!write_all(STDOUT_FILENO, bytes)) throw OutputError(errno);
}

bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

namespace {

// The length of the valid UTF-8 sequence at the start of `text` (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or 0.
std::size_t utf8_sequence_length(std::string_view text) {
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  std::size_t len = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    len = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    len = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    len = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (text.size() < len) return 0;
  if (byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < len; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  }
  return len;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (u == '\\') {
      out += "\\\\";
      ++i;
      continue;
    }
    if (u >= 0x20 && u < 0x7f) {
      out += text[i++];
      continue;
    }
    const std::size_t len = u >= 0x80 ? utf8_sequence_length(text.substr(i)) : 0;
    // C1 controls (U+0080 to U+009F, "\xc2\x80" to "\xc2\x9f") steer terminals too.
    const bool c1 = len == 2 && u == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;
    if (len == 0 || c1) {
      for (std::size_t j = 0; j < std::max<std::size_t>(len, 1); ++j) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[i + j]));
      }
      i += std::max<std::size_t>(len, 1);
      continue;
    }
    out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace idem::cli
