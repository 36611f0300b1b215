#include "stores/sqlite/sqlite_url.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>

#include "idem/error.h"
#include "idem/stores/sqlite_store.h"

namespace idem {

namespace sqlite {

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace sqlite

namespace detail {

std::shared_ptr<Store> open_sqlite_store(const Url& url, const OpenOptions& options) {
  if (!url.host.empty() || !url.user.empty() || !url.password.empty() || url.port != 0) {
    throw InvalidArgument("store URL", "'sqlite:' takes a file, not a host ('" + url.host +
                                           "'); use sqlite:///absolute/path.db or "
                                           "sqlite:relative/path.db");
  }
  if (url.path.empty()) {
    throw InvalidArgument("store URL",
                          "'sqlite:' needs a database file: sqlite:///absolute/path.db or "
                          "sqlite:relative/path.db");
  }
  SqliteStoreOptions o{.path = url.path,
                       .clock = options.clock,
                       .read_only = options.read_only,
                       .create_if_missing = options.create_if_missing};
  for (const auto& [name, value] : url.query) {
    if (name == "synchronous") {
      o.synchronous = sqlite::lowercase(value);
      if (o.synchronous != "normal" && o.synchronous != "full") {
        throw InvalidArgument("store URL",
                              "parameter 'synchronous' must be 'normal' or "
                              "'full', got '" +
                                  value + "'");
      }
    } else if (name == "busy_timeout") {
      int ms = -1;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
      if (ec != std::errc{} || end != value.data() + value.size() || ms < 0) {
        throw InvalidArgument("store URL",
                              "parameter 'busy_timeout' must be a whole number "
                              "of milliseconds, got '" +
                                  value + "'");
      }
      o.busy_timeout = Duration{ms};
    } else if (name == "shared") {
      if (value != "0" && value != "1") {
        throw InvalidArgument("store URL",
                              "parameter 'shared' must be 0 or 1, got '" + value + "'");
      }
      o.shared = value == "1";
    } else {
      throw InvalidArgument("store URL", "unknown parameter '" + name +
                                             "' for sqlite: (known: busy_timeout, shared, "
                                             "synchronous)");
    }
  }
  return std::make_shared<SqliteStore>(std::move(o));
}

}  // namespace detail

}  // namespace idem
