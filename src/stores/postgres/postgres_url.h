#pragma once

// The PostgreSQL store's URL (postgresql://user@host:port/db?..., open_store.h) and the
// libpq connection string it becomes.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/store.h"
#include "idem/store_url.h"
#include "stores/postgres/postgres_schema.h"

namespace idem::detail {

// The PostgreSQL store's factory (IdemStores.cmake lists it for open_store()).
std::shared_ptr<Store> open_postgres_store(const Url& url, const OpenOptions& options);

}  // namespace idem::detail

namespace idem::postgres {

using ConnParams = std::vector<std::pair<std::string, std::string>>;

// The libpq parameters parsed from a connection string; only those given.
ConnParams parse_conninfo(const std::string& conninfo);

// The value of parameter `name`, or empty.
std::string param_value(const ConnParams& params, std::string_view name);

// Sets parameter `name`, replacing its value when given.
void set_param(ConnParams& params, const std::string& name, const std::string& value);

// "postgresql://user@host:port/db?table=...", never with a password.
std::string describe_of(const ConnParams& params, const TableNames& names, bool default_table);

}  // namespace idem::postgres
