#include "stores/postgres/postgres_url.h"

#include <libpq-fe.h>

#include <string>

#include "idem/error.h"
#include "idem/stores/postgres_store.h"
#include "stores/kit/url_params.h"

namespace idem {

namespace postgres {

ConnParams parse_conninfo(const std::string& conninfo) {
  char* error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &error);
  if (parsed == nullptr) {
    std::string why = error ? error : "out of memory";
    PQfreemem(error);
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    throw InvalidArgument("PostgreSQL connection string", why);
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (PQconninfoOption* o = parsed; o->keyword != nullptr; ++o) {
    if (o->val != nullptr) out.emplace_back(o->keyword, o->val);
  }
  PQconninfoFree(parsed);
  return out;
}

std::string param_value(const ConnParams& params, std::string_view name) {
  for (const auto& [k, v] : params) {
    if (k == name) return v;
  }
  return {};
}

void set_param(ConnParams& params, const std::string& name, const std::string& value) {
  for (auto& [k, v] : params) {
    if (k == name) {
      v = value;
      return;
    }
  }
  params.emplace_back(name, value);
}

std::string describe_of(const ConnParams& params, const TableNames& names, bool default_table) {
  const std::string user = param_value(params, "user");
  std::string host = param_value(params, "host");
  if (host.empty()) host = param_value(params, "hostaddr");
  const std::string port = param_value(params, "port");
  std::string out = "postgresql://";
  if (!user.empty()) out += user + "@";
  std::vector<std::string> query;
  if (!host.empty() && host.front() == '/') {
    query.push_back("host=" + host);
  } else {
    out += host.find(':') != std::string::npos ? "[" + host + "]" : host;
  }
  if (!port.empty()) out += ":" + port;
  out += "/" + param_value(params, "dbname");
  if (!default_table) query.push_back("table=" + names.display());
  for (std::size_t i = 0; i < query.size(); ++i) out += (i == 0 ? "?" : "&") + query[i];
  return out;
}

}  // namespace postgres

namespace detail {

namespace {

// Quotes a value for a libpq keyword/value connection string.
std::string conninfo_value(const std::string& v) {
  std::string out = "'";
  for (char c : v) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

}  // namespace

std::shared_ptr<Store> open_postgres_store(const Url& url, const OpenOptions& options) {
  if (!url.has_authority) {
    throw InvalidArgument("store URL", "'" + url.scheme +
                                           ":' needs '//': postgresql://user@host:port/db or "
                                           "postgresql:///db?host=/socket/dir");
  }
  PostgresStoreOptions o;
  std::string conninfo;
  auto add = [&](const std::string& k, const std::string& v) {
    conninfo += (conninfo.empty() ? "" : " ") + k + "=" + conninfo_value(v);
  };
  if (!url.host.empty()) add("host", url.host);
  if (url.port != 0) add("port", std::to_string(url.port));
  if (url.path.size() > 1) add("dbname", url.path.substr(1));
  if (!url.user.empty()) add("user", url.user);
  if (!url.password.empty()) add("password", url.password);
  for (const auto& [name, value] : url.query) {
    if (name == "table") {
      o.table = value;
    } else if (name == "pool_size") {
      o.pool_size = static_cast<std::size_t>(kit::whole_number(name, value, 1));
    } else if (name == "timeout") {
      o.timeout = kit::milliseconds(name, value, 1);
    } else if (name == "synchronous_commit") {
      o.asynchronous_commit = kit::choice<bool>(name, value, {{"default", false}, {"off", true}});
    } else if (name == "acquire") {
      o.acquire = kit::choice<PostgresAcquire>(name, value,
                                               {{"adaptive", PostgresAcquire::kAdaptive},
                                                {"read-first", PostgresAcquire::kReadFirst},
                                                {"write-first", PostgresAcquire::kWriteFirst}});
    } else if (name == "pooler") {
      o.pooler = kit::choice<PostgresPooler>(name, value,
                                             {{"auto", PostgresPooler::kAuto},
                                              {"none", PostgresPooler::kNone},
                                              {"session", PostgresPooler::kSession},
                                              {"transaction", PostgresPooler::kTransaction}});
    } else if (name == "statements") {
      o.statements = kit::choice<PostgresStatements>(
          name, value,
          {{"prepared", PostgresStatements::kPrepared}, {"unnamed", PostgresStatements::kUnnamed}});
    } else if (name == "notify") {
      o.notify = kit::choice<bool>(name, value, {{"on", true}, {"off", false}});
    } else if (name == "listen") {
      o.listen = value;
    } else if (name == "server") {
      o.check_server = kit::choice<bool>(name, value, {{"postgresql", true}, {"any", false}});
    } else {
      add(name, value);  // libpq's own: sslmode, connect_timeout, application_name, ...
    }
  }
  o.conninfo = conninfo;
  o.read_only = options.read_only;
  o.create_if_missing = options.create_if_missing;
  return std::make_shared<PostgresStore>(std::move(o));
}

}  // namespace detail

}  // namespace idem
