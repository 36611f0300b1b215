#include "stores/sqlite/sqlite_url.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <string>

#include "idem/error.h"
#include "idem/stores/sqlite_store.h"
#include "stores/kit/url_params.h"

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
      o.synchronous =
          kit::choice<std::string>(name, value, {{"normal", "normal"}, {"full", "full"}}, true);
    } else if (name == "busy_timeout") {
      o.busy_timeout = kit::milliseconds(name, value, 0, std::numeric_limits<int>::max());
    } else if (name == "shared") {
      o.shared = kit::choice<bool>(name, value, {{"0", false}, {"1", true}});
    } else if (name == "notify") {
      o.notify = kit::choice<bool>(name, value, {{"on", true}, {"off", false}}, true);
    } else {
      kit::refuse_unknown(name, "sqlite", "busy_timeout, notify, shared, synchronous");
    }
  }
  return std::make_shared<SqliteStore>(std::move(o));
}

}  // namespace detail

}  // namespace idem
