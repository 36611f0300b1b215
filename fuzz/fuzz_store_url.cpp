// Fuzzes the store URL parser (idem::parse_url, which open_store uses) and open_store for
// the schemes that open without side effects (memory:, and schemes this build does not
// have). Server and SQLite URLs are parsed but not opened: opening connects or creates a
// file. Checks: the only error is idem::InvalidArgument naming "store URL"; a parsed URL's
// redacted form does not depend on its password; a port is in 1..65535.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"

namespace {

[[noreturn]] void fail(const char* what, std::string_view detail) {
  std::fprintf(stderr, "fuzz_store_url: %s: %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

// The redacted URL does not depend on the password: it reads the same whatever the
// password is (only whether there is one shows, as "***").
// The same holds for a `password` query parameter.
void check_redacted(const idem::Url& url) {
  idem::Url other = url;
  if (!url.password.empty()) other.password = "x";
  for (auto& [name, value] : other.query) {
    if (name == "password") value = "x";
  }
  if (url.redacted() != other.redacted()) fail("redacted() shows the password", url.redacted());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  idem::Url url;
  try {
    url = idem::parse_url(text);
  } catch (const idem::InvalidArgument& e) {
    if (e.argument() != "store URL") fail("error names another input", e.what());
    return 0;
  }
  if (url.port < 0 || url.port > 65535) fail("port out of range", text);
  if (url.scheme.empty()) fail("empty scheme accepted", text);
  check_redacted(url);
  (void)url.param("password", "none");

  // memory: opens an empty in-process store; a scheme this build lacks is refused.
  static const std::vector<std::string> schemes = idem::available_schemes();
  const bool side_effects = url.scheme != "memory" &&
                            std::find(schemes.begin(), schemes.end(), url.scheme) != schemes.end();
  if (!side_effects) {
    try {
      (void)idem::open_store(text);
    } catch (const idem::InvalidArgument& e) {
      if (e.argument() != "store URL") fail("open_store: error names another input", e.what());
    }
  }
  return 0;
}
