// open_store(): the URL schemes of every store this build includes. The table is generated
// by cmake/IdemStores.cmake, so adding a store never touches this file.

#include "idem/open_store.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "core/percent_encoding.h"
#include "idem/error.h"
#include "idem_store_factories.h"
#include "test_stores.h"

namespace idem {
namespace {

struct Scheme {
  const char* scheme;
  StoreFactory open;
};

constexpr Scheme kGenerated[] = {
#define IDEM_STORE(name, scheme) {scheme, &detail::open_##name##_store},
#include "idem_store_registry.inc"
#undef IDEM_STORE
};

// Every scheme: the generated table, then the test build's test-only stores
// (test_stores.h), which register before main() and are never in the installed library.
std::vector<Scheme>& schemes() {
  static std::vector<Scheme> all(std::begin(kGenerated), std::end(kGenerated));
  return all;
}

// A percent-escape may decode to any byte, but every store hands the parts of its URL to
// C interfaces (a file name, libpq's conninfo, hiredis) where a NUL byte would end the
// value early and name another file or server; and a host or user never holds a control
// character, which would only garble the messages that show them. Neither the URL nor the
// offending part is echoed: it may hold a password.
void refuse_hostile_bytes(const Url& url) {
  auto refuse = [](std::string_view part, std::string_view value, bool controls) {
    for (const char c : value) {
      const auto u = static_cast<unsigned char>(c);
      if (u == 0) {
        throw InvalidArgument("store URL", "the " + std::string(part) +
                                               " holds a NUL byte (%00), which no store can use");
      }
      if (controls && (u < 0x20 || u == 0x7f)) {
        std::string escape;
        detail::append_percent_escape(escape, u);
        throw InvalidArgument("store URL", "the " + std::string(part) +
                                               " holds a control character (" + escape + ")");
      }
    }
  };
  refuse("user", url.user, true);
  refuse("password", url.password, false);
  refuse("host", url.host, true);
  refuse("path", url.path, false);
  for (const auto& [name, value] : url.query) {
    refuse("name of a parameter", name, true);
    refuse("parameter '" + name + "'", value, false);
  }
}

}  // namespace

void detail::add_test_store(const char* scheme, StoreFactory open) {
  schemes().push_back(Scheme{scheme, open});
}

std::shared_ptr<Store> open_store(std::string_view text, const OpenOptions& options) {
  Url url = parse_url(text);
  refuse_hostile_bytes(url);
  for (const Scheme& s : schemes()) {
    if (url.scheme == s.scheme) return s.open(url, options);
  }
  std::string known;
  for (const Scheme& s : schemes()) known += (known.empty() ? "" : ", ") + std::string(s.scheme);
  throw InvalidArgument("store URL", "unknown or not built scheme '" + url.scheme +
                                         "' (this build opens: " + known + ")");
}

namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

bool has_scheme(std::string_view scheme) {
  for (const Scheme& s : schemes()) {
    if (scheme == s.scheme) return true;
  }
  return false;
}

}  // namespace

std::string default_store_path() {
  // A relative XDG_STATE_HOME is invalid and must be ignored.
  if (std::optional<std::string> state = env("XDG_STATE_HOME"); state && state->front() == '/') {
    return *state + "/idem/idem.db";
  }
  std::optional<std::string> home = env("HOME");
  if (!home) {
    if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr) {
      home = std::string(pw->pw_dir);
    }
  }
  if (!home || home->empty()) {
    throw InvalidArgument("store URL",
                          "none given, and no IDEM_STORE, XDG_STATE_HOME or home directory to "
                          "find the default store by");
  }
  return *home + "/.local/state/idem/idem.db";
}

std::string sqlite_store_url(std::string_view path) {
  std::string out = "sqlite://";
  detail::append_percent_encoded(out, path, [](unsigned char u) {
    return u > 0x20 && u < 0x7f && u != '%' && u != '?' && u != '#';
  });
  return out;
}

std::string default_store_url() {
  if (std::optional<std::string> url = env("IDEM_STORE")) return *url;
  if (!has_scheme("sqlite")) {
    throw InvalidArgument("store URL",
                          "IDEM_STORE is not set and this build has no SQLite store for the "
                          "default file");
  }
  return sqlite_store_url(default_store_path());
}

std::shared_ptr<Store> open_default_store(const OpenOptions& options) {
  if (!env("IDEM_STORE") && has_scheme("sqlite") && options.create_if_missing &&
      !options.read_only) {
    // The default file's directory, made like `mkdir -p -m 0700` (only when the store may
    // be created: opening without creating makes nothing).
    const std::string path = default_store_path();
    for (std::size_t slash = path.find('/', 1); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      const std::string dir = path.substr(0, slash);
      if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        throw StoreUnavailable(sqlite_store_url(path), "cannot create " + dir + ": " +
                                                           std::generic_category().message(errno));
      }
    }
  }
  return open_store(default_store_url(), options);
}

std::vector<std::string> available_schemes() {
  std::vector<std::string> out;
  for (const Scheme& s : schemes()) out.emplace_back(s.scheme);
  return out;
}

}  // namespace idem
