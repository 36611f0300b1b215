// Which store a command opens, through open_store()/open_default_store() only: the tool
// knows no store scheme.

#include <fmt/core.h>

#include <cstdlib>

#include "common.h"
#include "idem/error.h"
#include "idem/open_store.h"

namespace idem::cli {

namespace {

// Returns the value of environment variable `name` when it is set and not empty.
std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

}  // namespace

std::string default_store_path() {
  try {
    return idem::default_store_path();
  } catch (const InvalidArgument&) {
    throw UsageError("--store",
                     "no store given and no home directory to keep the default store in "
                     "(set --store, IDEM_STORE, XDG_STATE_HOME or HOME)");
  }
}

std::string store_url(const std::string& flag) {
  if (!flag.empty()) return flag;
  try {
    return idem::default_store_url();
  } catch (const InvalidArgument&) {
    (void)default_store_path();  // no home directory: the tool's own message
    throw;
  }
}

NoStore::NoStore(const std::string& store, const std::string& hint)
    : std::runtime_error(fmt::format("{} does not exist (a mistyped --store or IDEM_STORE?){}",
                                     store, hint.empty() ? "" : "; " + hint)) {}

std::shared_ptr<Store> open_cli_store(const std::string& flag, StoreAccess access,
                                      const std::string& create_hint) {
  const std::string url = store_url(flag);
  OpenOptions options;
  if (access != StoreAccess::kCreate) {
    // A command that must not create the store says so when it is missing, so that a
    // mistyped path gets a message that says so (and an absent default store simply has no
    // records).
    options.read_only = access == StoreAccess::kReadOnly;
    options.create_if_missing = false;
  }
  try {
    // The default store: open_default_store() makes its directory when it may create it.
    return flag.empty() ? open_default_store(options) : open_store(url, options);
  } catch (const StoreNotFound&) {
    if (flag.empty() && !env("IDEM_STORE")) return nullptr;
    throw NoStore(parse_url(url).redacted(), create_hint);
  }
}

}  // namespace idem::cli
