// open_store(): the URL schemes of every store this build includes. The table is generated
// by cmake/IdemStores.cmake, so adding a store never touches this file.

#include <memory>
#include <string>

#include "idem/error.h"
#include "idem/open_store.h"

namespace idem::detail {
#define IDEM_STORE(name, scheme) \
  std::shared_ptr<Store> open_##name##_store(const Url& url, const OpenOptions& options);
#include "idem_store_registry.inc"
#undef IDEM_STORE
}  // namespace idem::detail

namespace idem {
namespace {

struct Scheme {
  const char* scheme;
  std::shared_ptr<Store> (*open)(const Url&, const OpenOptions&);
};

constexpr Scheme kSchemes[] = {
#define IDEM_STORE(name, scheme) {scheme, &detail::open_##name##_store},
#include "idem_store_registry.inc"
#undef IDEM_STORE
};

}  // namespace

std::shared_ptr<Store> open_store(std::string_view text, const OpenOptions& options) {
  Url url = parse_url(text);
  for (const Scheme& s : kSchemes) {
    if (url.scheme == s.scheme) return s.open(url, options);
  }
  std::string known;
  for (const Scheme& s : kSchemes) known += (known.empty() ? "" : ", ") + std::string(s.scheme);
  throw InvalidArgument("store URL", "unknown or not built scheme '" + url.scheme +
                                         "' (this build opens: " + known + ")");
}

std::vector<std::string> available_schemes() {
  std::vector<std::string> out;
  for (const Scheme& s : kSchemes) out.emplace_back(s.scheme);
  return out;
}

}  // namespace idem
