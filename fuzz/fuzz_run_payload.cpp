// Fuzzes the format `idem run` stores a command's result in and decodes on a replay
// (cli/payload.h). Any bytes may be found under a scope (a library caller may write there),
// so decode_payload must refuse what it cannot read with a reason and never crash. Checks:
// a decoded payload encodes back to the same bytes (the format has one spelling per
// result), and every result encodes to bytes that decode to it.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "payload.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_run_payload: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using idem::cli::CommandResult;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::string why;
  if (const std::optional<CommandResult> r = idem::cli::decode_payload(bytes, &why)) {
    if (idem::cli::encode_payload(*r) != bytes) fail("decode then encode changed the bytes");
    if (r->status_only && !r->output.empty()) fail("status-only result with output");
  } else if (why.empty()) {
    fail("refused without a reason");
  }

  // The same bytes as a command's result: status, flag, output.
  if (size >= 1) {
    CommandResult in;
    in.exit_status = data[0];
    in.status_only = size >= 2 && (data[1] & 1) != 0;
    if (!in.status_only && size > 2) in.output.assign(bytes.substr(2));
    const std::string encoded = idem::cli::encode_payload(in);
    const std::optional<CommandResult> out = idem::cli::decode_payload(encoded);
    if (!out) fail("an encoded result does not decode");
    if (out->exit_status != in.exit_status || out->status_only != in.status_only ||
        out->output != in.output) {
      fail("encode then decode changed the result");
    }
  }
  return 0;
}
