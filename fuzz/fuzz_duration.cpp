// Fuzzes the `idem` tool's value parsers: durations (parse_duration, duration_option, as
// --ttl, --lease, --wait and --grace use them), byte counts (parse_size, --max-output), and
// the formatters that show durations, timestamps and arbitrary bytes to people. Checks: a
// duration is never negative; duration_option returns 1 ms..365 days (or 0 when zero is
// allowed) or throws UsageError naming the option; printable() output is printable ASCII or
// valid UTF-8 without control characters.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "common.h"
#include "idem/store.h"

namespace {

[[noreturn]] void fail(const char* what, std::string_view input) {
  std::fprintf(stderr, "fuzz_duration: %s: '%.*s'\n", what, static_cast<int>(input.size()),
               input.data());
  std::abort();
}

void check_option(std::string_view text, bool allow_zero) {
  try {
    const idem::Duration d = idem::cli::duration_option("--ttl", text, allow_zero);
    if (d.count() < (allow_zero ? 0 : 1) || d > idem::kMaxDuration) fail("out of range", text);
  } catch (const idem::cli::UsageError& e) {
    if (e.option() != "--ttl") fail("error names another option", text);
  }
}

// No C0 control character, DEL or lone backslash reaches a terminal unescaped.
void check_printable(std::string_view input) {
  const std::string shown = idem::cli::printable(input);
  for (std::size_t i = 0; i < shown.size(); ++i) {
    const auto c = static_cast<unsigned char>(shown[i]);
    if (c < 0x20 || c == 0x7f) fail("printable() let a control character through", input);
    if (c == 0xc2 && i + 1 < shown.size() && static_cast<unsigned char>(shown[i + 1]) < 0xa0) {
      fail("printable() let a C1 control character through", input);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string why;
  if (const std::optional<idem::Duration> d = idem::cli::parse_duration(text, &why)) {
    if (d->count() < 0) fail("negative duration", text);
    (void)idem::cli::human_duration(*d);
  } else if (why.empty()) {
    fail("refused without a reason", text);
  }
  check_option(text, false);
  check_option(text, true);
  (void)idem::cli::parse_size(text);
  check_printable(text);

  // The formatters take any 64-bit count a store could report.
  if (size >= sizeof(std::int64_t)) {
    std::int64_t n = 0;
    std::memcpy(&n, data, sizeof n);
    (void)idem::cli::human_duration(idem::Duration{n});
    (void)idem::cli::iso8601(idem::Timestamp{idem::Duration{n}});
  }
  return 0;
}
