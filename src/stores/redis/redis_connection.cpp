#include "stores/redis/redis_connection.h"

#include <arpa/inet.h>
#include <limits.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <string>
#include <system_error>
#include <utility>

#include "idem/error.h"
#include "stores/redis/redis_layout.h"

namespace idem::redis {
namespace {

using namespace std::chrono_literals;

// Reconnection: the first attempt at once, then after 20 ms, doubling up to 1 s.
constexpr Duration kFirstBackoff{20};
constexpr Duration kMaxBackoff{1000};

timeval to_timeval(Duration d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

std::string ms(Duration d) { return std::to_string(d.count()) + " ms"; }

std::string errno_text(int err) { return std::generic_category().message(err); }

// Writes every buffer, as few system calls as the kernel allows. MSG_NOSIGNAL: a server
// that went away must not raise SIGPIPE in the application (hiredis's own write would).
std::string send_all(int fd, std::vector<iovec>& iov, Duration timeout) {
  std::size_t i = 0;
  while (i < iov.size()) {
    msghdr msg{};
    msg.msg_iov = &iov[i];
    msg.msg_iovlen = std::min<std::size_t>(iov.size() - i, IOV_MAX);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return "timed out after " + ms(timeout) + " sending to the server";
      }
      return "cannot send to the server: " + errno_text(errno);
    }
    auto left = static_cast<std::size_t>(n);
    while (i < iov.size() && left >= iov[i].iov_len) {
      left -= iov[i].iov_len;
      ++i;
    }
    if (left > 0) {
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  return {};
}

std::string context_error(const redisContext* c, Duration timeout) {
  if (c->err == REDIS_ERR_EOF) return "the server closed the connection";
  const std::string text = c->errstr;
  // A blocking hiredis read that hits SO_RCVTIMEO reports EAGAIN's text.
  if (c->err == REDIS_ERR_IO && text == errno_text(EAGAIN)) {
    return "timed out after " + ms(timeout) + " waiting for the server's reply";
  }
  if (c->err == REDIS_ERR_PROTOCOL) return "protocol error: " + text;
  return text.empty() ? "connection error" : text;
}

std::string read_reply(redisContext* c, Reply& out, Duration timeout) {
  void* raw = nullptr;
  if (redisGetReply(c, &raw) != REDIS_OK) return context_error(c, timeout);
  out.reset(static_cast<redisReply*>(raw));
  if (!out) return "no reply";
  return {};
}

std::string_view reply_text(const redisReply& r) { return {r.str, r.len}; }

// --- TLS over the hiredis socket (see Link) ----------------------------------------------

std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

// Sends what OpenSSL has encrypted into the write BIO, with one send where the kernel
// takes it all, then empties the BIO.
std::string tls_flush(Link& l, Duration timeout) {
  BIO* wbio = SSL_get_wbio(l.tls.get());
  char* data = nullptr;
  const long n = BIO_get_mem_data(wbio, &data);
  if (n <= 0) return {};
  std::vector<iovec> iov{{data, static_cast<std::size_t>(n)}};
  std::string e = send_all(l.hiredis->fd, iov, timeout);
  (void)BIO_reset(wbio);
  return e;
}

// Reads what the socket has (waiting up to its timeout) into OpenSSL's read BIO.
std::string tls_fill(Link& l, Duration timeout) {
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(l.hiredis->fd, buf, sizeof buf, 0);
    if (n > 0) {
      BIO_write(SSL_get_rbio(l.tls.get()), buf, static_cast<int>(n));
      return {};
    }
    if (n == 0) return "the server closed the connection";
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return "timed out after " + ms(timeout) + " waiting for the server's reply";
    }
    return "cannot read from the server: " + errno_text(errno);
  }
}

// Why the server's certificate was refused, in words that say which check failed.
std::string verify_failure(long result, const std::string& name) {
  const std::string detail = X509_verify_cert_error_string(result);
  switch (result) {
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      return "TLS: the server's certificate is not for \"" + name +
             "\" (wrong host name: " + detail +
             "); connect by a name the certificate lists, or set tls_server_name";
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return "TLS: the server's certificate has expired (" + detail + ")";
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return "TLS: the server's certificate is not valid yet (" + detail + ")";
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return "TLS: the server's certificate is not signed by a trusted CA (" + detail +
             "); give its CA with tls_ca= or tls_ca_dir=";
    default:
      return "TLS: the server's certificate was refused (" + detail + ")";
  }
}

bool is_ip_address(const std::string& name) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, name.c_str(), buf) == 1 || inet_pton(AF_INET6, name.c_str(), buf) == 1;
}

// Starts TLS on the connected socket of `l`: SNI, the name check, the handshake.
std::string tls_start(Link& l, SSL_CTX* ctx, const TlsSettings& tls, const std::string& host,
                      Duration timeout) {
  ERR_clear_error();
  l.tls.reset(SSL_new(ctx));
  if (!l.tls) return "TLS: cannot create a session: " + openssl_errors();
  BIO* rbio = BIO_new(BIO_s_mem());
  BIO* wbio = BIO_new(BIO_s_mem());
  if (rbio == nullptr || wbio == nullptr) {
    BIO_free(rbio);
    BIO_free(wbio);
    return "TLS: out of memory";
  }
  SSL_set_bio(l.tls.get(), rbio, wbio);
  const std::string name = tls.server_name.empty() ? host : tls.server_name;
  const bool ip = is_ip_address(name);
  if (!ip) SSL_set_tlsext_host_name(l.tls.get(), name.c_str());
  if (tls.verify) {
    const int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(l.tls.get()), name.c_str())
                      : SSL_set1_host(l.tls.get(), name.c_str());
    if (ok != 1) return "TLS: cannot check the server name \"" + name + "\": " + openssl_errors();
  }
  SSL_set_connect_state(l.tls.get());
  for (;;) {
    const int r = SSL_do_handshake(l.tls.get());
    if (std::string e = tls_flush(l, timeout); !e.empty()) return "TLS handshake: " + e;
    if (r == 1) return {};
    const int err = SSL_get_error(l.tls.get(), r);
    if (err == SSL_ERROR_WANT_READ) {
      if (std::string e = tls_fill(l, timeout); !e.empty()) {
        return "TLS handshake: " + e + " (is the server speaking TLS on this port?)";
      }
      continue;
    }
    if (err == SSL_ERROR_WANT_WRITE) continue;
    const long verified = SSL_get_verify_result(l.tls.get());
    if (tls.verify && verified != X509_V_OK) return verify_failure(verified, name);
    const std::string why = openssl_errors();
    return "TLS handshake failed: " + (why.empty() ? std::string("no detail") : why) +
           " (is the server speaking TLS on this port?)";
  }
}

// Sends every buffer over the link.
std::string link_send(Link& l, std::vector<iovec>& iov, Duration timeout) {
  if (!l.tls) return send_all(l.hiredis->fd, iov, timeout);
  // One SSL_write for the whole batch: as few TLS records (and AEAD passes, on both sides)
  // as its size allows. Into the memory BIO, which grows: everything is taken at once.
  std::string batch;
  if (iov.size() == 1) {
    batch.assign(static_cast<const char*>(iov[0].iov_base), iov[0].iov_len);
  } else {
    std::size_t total = 0;
    for (const iovec& v : iov) total += v.iov_len;
    batch.reserve(total);
    for (const iovec& v : iov) batch.append(static_cast<const char*>(v.iov_base), v.iov_len);
  }
  if (!batch.empty() && SSL_write(l.tls.get(), batch.data(), static_cast<int>(batch.size())) <= 0) {
    return "TLS: cannot encrypt the request: " + openssl_errors();
  }
  return tls_flush(l, timeout);
}

// Reads one reply from the link.
std::string link_read(Link& l, Reply& out, Duration timeout) {
  if (!l.tls) return read_reply(l.hiredis.get(), out, timeout);
  redisReader* reader = l.hiredis->reader;
  for (;;) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader, &raw) != REDIS_OK) {
      return "protocol error: " + std::string(reader->errstr);
    }
    if (raw != nullptr) {
      out.reset(static_cast<redisReply*>(raw));
      return {};
    }
    char buf[16384];
    const int n = SSL_read(l.tls.get(), buf, sizeof buf);
    if (n > 0) {
      redisReaderFeed(reader, buf, static_cast<std::size_t>(n));
      continue;
    }
    const int err = SSL_get_error(l.tls.get(), n);
    if (err == SSL_ERROR_WANT_READ) {
      if (std::string e = tls_flush(l, timeout); !e.empty()) return e;
      if (std::string e = tls_fill(l, timeout); !e.empty()) return e;
      continue;
    }
    if (err == SSL_ERROR_ZERO_RETURN) return "the server closed the connection";
    return "TLS error: " + openssl_errors();
  }
}

// Sentinel: why a sentinel's answer names no primary when it does not know the service.
std::string unknown_service(const std::string& service) {
  return "monitors no service named \"" + service + "\"";
}

// Sentinel: reads a sentinel's answer to SENTINEL get-master-addr-by-name <service> into
// host and port; empty, or why it names none.
std::string primary_in_reply(const redisReply& r, const std::string& service, std::string& host,
                             int& port) {
  if (r.type == REDIS_REPLY_ARRAY && r.elements == 2 && r.element[0]->type == REDIS_REPLY_STRING &&
      r.element[1]->type == REDIS_REPLY_STRING) {
    const std::string_view port_text = reply_text(*r.element[1]);
    int value = 0;
    const auto [end, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
    if (ec == std::errc{} && end == port_text.data() + port_text.size() && value > 0) {
      host = std::string(reply_text(*r.element[0]));
      port = value;
      return {};
    }
  }
  if (r.type == REDIS_REPLY_NIL) return unknown_service(service);
  if (r.type == REDIS_REPLY_ERROR) return explain_server_error(reply_text(r));
  return "unexpected reply";
}

// Sentinel: asks each sentinel in turn for the address of the service's primary
// (SENTINEL get-master-addr-by-name); the first answer wins.
std::string ask_sentinels(const ConnectionSettings& s, std::string& host, int& port) {
  std::string failures;
  for (const auto& [h, p] : s.sentinels) {
    const std::string at = h + ":" + std::to_string(p);
    std::unique_ptr<redisContext, ContextDeleter> c(
        redisConnectWithTimeout(h.c_str(), p, to_timeval(s.connect_timeout)));
    if (!failures.empty()) failures += "; ";
    if (c == nullptr || c->err != 0) {
      failures += at + ": cannot connect: " + (c ? std::string(c->errstr) : "out of memory");
      continue;
    }
    redisSetTimeout(c.get(), to_timeval(s.connect_timeout));
    const Reply r(static_cast<redisReply*>(
        redisCommand(c.get(), "SENTINEL get-master-addr-by-name %b", s.sentinel_service.data(),
                     s.sentinel_service.size())));
    if (!r) {
      failures += at + ": " + context_error(c.get(), s.connect_timeout);
      continue;
    }
    const std::string why = primary_in_reply(*r, s.sentinel_service, host, port);
    if (why.empty()) return {};
    failures += at + ": " + why;
  }
  return "no sentinel named a primary for \"" + s.sentinel_service + "\" (" + failures + ")";
}

// A plain TCP connection whose first exchange failed with a reset, an end of file or bytes
// that are not RESP: what a server expecting TLS on that port does to a client that sends
// no TLS handshake (Redis resets it). The likely cause is named, as a likely cause only:
// a server that restarted at that moment looks the same.
std::string plain_to_tls_port(std::string error) {
  if (error.find(errno_text(ECONNRESET)) != std::string::npos ||
      error.find(errno_text(EPIPE)) != std::string::npos ||
      error == "the server closed the connection" || error.rfind("protocol error", 0) == 0) {
    error +=
        " (right after the connection opened: the server may expect TLS on this port; if "
        "so, use a rediss:// URL)";
  }
  return error;
}

// Connects to host:port (or the socket), then AUTH, SELECT, checks and SCRIPT LOAD; `where`
// names the server in errors.
Context open_at(const ConnectionSettings& settings, const std::string& host, int port,
                const std::string& where, std::string& error, ScriptShas* shas) {
  const timeval connect_tv = to_timeval(settings.connect_timeout);
  auto link = std::make_unique<Link>();
  link->address = settings.socket.empty() ? host + ":" + std::to_string(port) : settings.socket;
  link->hiredis.reset(settings.socket.empty()
                          ? redisConnectWithTimeout(host.c_str(), port, connect_tv)
                          : redisConnectUnixWithTimeout(settings.socket.c_str(), connect_tv));
  redisContext* c = link->hiredis.get();
  if (c == nullptr) {
    error = "cannot connect: out of memory";
    return {};
  }
  if (c->err != 0) {
    std::string why = c->errstr;
    if (why == errno_text(EINPROGRESS) || why == errno_text(ETIMEDOUT)) {
      why = "timed out after " + ms(settings.connect_timeout);
    }
    error = "cannot connect" + where + ": " + why;
    return {};
  }
  if (redisSetTimeout(c, to_timeval(settings.io_timeout)) != REDIS_OK ||
      (settings.socket.empty() && redisEnableKeepAlive(c) != REDIS_OK)) {
    error = "cannot set up the connection: " + std::string(c->errstr);
    return {};
  }
  if (settings.tls_context && settings.socket.empty()) {
    // The handshake is part of connecting: it gets the connect timeout.
    if (redisSetTimeout(c, connect_tv) != REDIS_OK) {
      error = "cannot set up the connection: " + std::string(c->errstr);
      return {};
    }
    error =
        tls_start(*link, settings.tls_context.get(), settings.tls, host, settings.connect_timeout);
    if (!error.empty()) return {};
    if (redisSetTimeout(c, to_timeval(settings.io_timeout)) != REDIS_OK) {
      error = "cannot set up the connection: " + std::string(c->errstr);
      return {};
    }
  }

  // One round trip: AUTH, SELECT, then every script, so EVALSHA finds them even after a
  // restart emptied the server's script cache.
  std::string request;
  CommandWriter w(request);
  std::vector<std::string> what;  // what each reply answers, for errors
  if (!settings.password.empty()) {
    if (settings.user.empty()) {
      w.begin(2).arg("AUTH").arg(settings.password);
    } else {
      w.begin(3).arg("AUTH").arg(settings.user).arg(settings.password);
    }
    what.emplace_back("AUTH");
  }
  if (settings.db != 0) {
    w.begin(2).arg("SELECT").arg(std::int64_t{settings.db});
    what.emplace_back("SELECT");
  }
  // On every (re)connection: a failover or a restart may bring another policy.
  if (settings.refuse_eviction) {
    w.begin(2).arg("INFO").arg("memory");
    what.emplace_back("INFO");
  }
  // Sentinel: the server it named must still be the primary (the sentinel may be behind).
  if (!settings.sentinels.empty()) {
    w.begin(1).arg("ROLE");
    what.emplace_back("ROLE");
  }
  if (!settings.client_name.empty()) {
    w.begin(3).arg("CLIENT").arg("SETNAME").arg(settings.client_name);
    what.emplace_back("CLIENT SETNAME");
  }
  for (const ScriptId id : settings.scripts) {
    w.begin(3).arg("SCRIPT").arg("LOAD").arg(kScripts[id]->body);
    what.emplace_back("SCRIPT LOAD");
  }
  if (what.empty()) return link;
  // Plain TCP: a failure of the first exchange may be a TLS port (plain_to_tls_port).
  const bool plain_tcp = !link->tls && settings.socket.empty();
  std::vector<iovec> iov{{request.data(), request.size()}};
  if (error = link_send(*link, iov, settings.io_timeout); !error.empty()) {
    if (plain_tcp) error = plain_to_tls_port(std::move(error));
    return {};
  }
  std::string failure;
  std::size_t script = 0;
  for (const std::string& step : what) {
    Reply r;
    if (error = link_read(*link, r, settings.io_timeout); !error.empty()) {
      if (plain_tcp && &step == &what.front()) error = plain_to_tls_port(std::move(error));
      return {};
    }
    if (r->type == REDIS_REPLY_ERROR && step == "CLIENT SETNAME") {
      // A name is for operators only: a server (an ACL) that refuses it fails nothing.
    } else if (r->type == REDIS_REPLY_ERROR) {
      if (failure.empty()) {
        if (step == "AUTH") {
          failure = explain_server_error(reply_text(*r));
        } else if (step == "SELECT") {
          failure = "cannot select database " + std::to_string(settings.db) + ": " +
                    explain_server_error(reply_text(*r));
        } else if (step == "INFO") {
          failure = "cannot read the server's maxmemory-policy (INFO memory): " +
                    explain_server_error(reply_text(*r)) +
                    "; grant the user +info, or open the store with eviction=allow "
                    "(docs/stores/redis.md, \"Eviction\")";
        } else {
          failure = "cannot load the store's scripts: " + explain_server_error(reply_text(*r));
        }
      }
    } else if (step == "ROLE") {
      const bool primary = r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
                           r->element[0]->type == REDIS_REPLY_STRING &&
                           reply_text(*r->element[0]) == "master";
      if (failure.empty() && !primary) {
        failure = "the server " + host + ":" + std::to_string(port) +
                  " that the sentinels named as the primary of \"" + settings.sentinel_service +
                  "\" is not a primary (a failover is under way)";
      }
    } else if (step == "INFO") {
      if (failure.empty()) {
        failure =
            eviction_refusal(r->type == REDIS_REPLY_STRING ? reply_text(*r) : std::string_view());
      }
    } else if (step == "SCRIPT LOAD") {
      if (shas != nullptr && r->type == REDIS_REPLY_STRING) {
        (*shas)[settings.scripts[script]] = std::string(reply_text(*r));
      }
      ++script;
    }
  }
  if (!failure.empty()) {
    error = failure;
    return {};
  }
  return link;
}

}  // namespace

Context open_link(const ConnectionSettings& settings, std::string& error, ScriptShas* shas,
                  std::uint64_t& generation) {
  generation = 0;
  if (settings.sentinels.empty())
    return open_at(settings, settings.host, settings.port, {}, error, shas);
  if (settings.switched) {
    // The primary the store follows: a sentinel asked first may still name the old one.
    const auto [host, port] = settings.switched->get(generation);
    if (!host.empty()) {
      Context c =
          open_at(settings, host, port,
                  " to the primary " + host + ":" + std::to_string(port) + " the store follows",
                  error, shas);
      if (c) return c;
      settings.switched->forget(generation);
    }
  }
  std::string host;
  int port = 0;
  if (error = ask_sentinels(settings, host, port); !error.empty()) return {};
  return open_at(settings, host, port,
                 " to the primary " + host + ":" + std::to_string(port) + " the sentinels named",
                 error, shas);
}

std::string link_write(Link& link, std::string_view data, Duration timeout) {
  std::vector<iovec> iov{{const_cast<char*>(data.data()), data.size()}};
  return link_send(link, iov, timeout);
}

std::string link_receive(Link& link) {
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(link.hiredis->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return "the server closed the connection";
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
      return "cannot read from the server: " + errno_text(errno);
    }
    if (!link.tls) {
      if (redisReaderFeed(link.hiredis->reader, buf, static_cast<std::size_t>(n)) != REDIS_OK) {
        return "protocol error: " + std::string(link.hiredis->reader->errstr);
      }
      if (static_cast<std::size_t>(n) < sizeof buf) return {};
      continue;
    }
    BIO_write(SSL_get_rbio(link.tls.get()), buf, static_cast<int>(n));
    // Everything OpenSSL can decrypt now goes to the reader; a record cut short waits for
    // the rest of its bytes (WANT_READ).
    for (;;) {
      char plain[16384];
      const int got = SSL_read(link.tls.get(), plain, sizeof plain);
      if (got > 0) {
        redisReaderFeed(link.hiredis->reader, plain, static_cast<std::size_t>(got));
        continue;
      }
      const int err = SSL_get_error(link.tls.get(), got);
      if (err == SSL_ERROR_WANT_READ) break;
      if (err == SSL_ERROR_ZERO_RETURN) return "the server closed the connection";
      return "TLS error: " + openssl_errors();
    }
    // What OpenSSL may have to answer (a key update), sent at once.
    if (std::string e = tls_flush(link, Duration{1000}); !e.empty()) return e;
    if (static_cast<std::size_t>(n) < sizeof buf) return {};
  }
}

std::string link_next_reply(Link& link, Reply& out) {
  void* raw = nullptr;
  if (redisReaderGetReply(link.hiredis->reader, &raw) != REDIS_OK) {
    return "protocol error: " + std::string(link.hiredis->reader->errstr);
  }
  out.reset(static_cast<redisReply*>(raw));
  return {};
}

std::shared_ptr<SSL_CTX> make_tls_context(const TlsSettings& tls) {
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (!ctx) throw InvalidArgument("Redis TLS", "cannot create a TLS context: " + openssl_errors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (tls.verify) {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    if (!tls.ca_file.empty() || !tls.ca_dir.empty()) {
      if (SSL_CTX_load_verify_locations(ctx.get(),
                                        tls.ca_file.empty() ? nullptr : tls.ca_file.c_str(),
                                        tls.ca_dir.empty() ? nullptr : tls.ca_dir.c_str()) != 1) {
        throw InvalidArgument("Redis tls_ca / tls_ca_dir", "cannot load CA certificates from '" +
                                                               tls.ca_file + tls.ca_dir +
                                                               "': " + openssl_errors());
      }
    } else if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
      throw InvalidArgument("Redis TLS",
                            "cannot load the system's CA certificates: " + openssl_errors());
    }
  } else {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    throw InvalidArgument("Redis tls_cert / tls_key",
                          "give both a client certificate and its key, or neither");
  }
  if (!tls.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx.get(), tls.cert_file.c_str()) != 1) {
      throw InvalidArgument("Redis tls_cert", "cannot load the client certificate '" +
                                                  tls.cert_file + "': " + openssl_errors());
    }
    if (SSL_CTX_use_PrivateKey_file(ctx.get(), tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx.get()) != 1) {
      throw InvalidArgument("Redis tls_key",
                            "cannot load the client key (or it does not match "
                            "the certificate): " +
                                openssl_errors());
    }
  }
  return ctx;
}

std::string explain_server_error(std::string_view message) {
  const std::string_view code = message.substr(0, message.find(' '));
  std::string cause;
  // Redis 7.0 reports a command the ACL denies inside a script as a plain ERR.
  if (code == "NOPERM" ||
      message.find("user executing the script can't run") != std::string_view::npos) {
    cause = "permission denied by the server's ACL";
  } else if (code == "WRONGPASS") {
    cause = "authentication failed (wrong user name or password)";
  } else if (code == "NOAUTH") {
    cause = "authentication required (the URL gives no password)";
  } else if (message.find("without any password configured") != std::string_view::npos) {
    cause = "authentication failed (the server has no password for this user)";
  } else if (code == "OOM") {
    cause = "the server is out of memory (maxmemory reached)";
  } else if (code == "READONLY" ||
             message.find("cannot be used with replica instances") != std::string_view::npos) {
    cause = "the server is a read-only replica";
  } else if (code == "UNBLOCKED" && message.find("state changed") != std::string_view::npos) {
    // Redis 7 ends a blocked WAIT this way when its server is made a replica.
    cause = "the server stopped being a primary (a failover) while the command waited";
  } else if (code == "NOREPLICAS") {
    cause =
        "the primary has fewer replicas in sync than its min-replicas-to-write (a replica is "
        "down or lagging, or a failover cut this server off from them)";
  } else if (code == "LOADING") {
    cause = "the server is loading its data set";
  } else if (code == "MASTERDOWN") {
    cause = "the replica has lost its primary";
  } else if (code == "BUSY") {
    cause = "the server is busy running a script";
  } else if (code == "CLUSTERDOWN") {
    cause = "the Redis Cluster is down (a slot has no primary that answers)";
  } else if (code == "MOVED" || code == "ASK" || code == "CROSSSLOT" || code == "TRYAGAIN") {
    cause =
        "Redis Cluster redirection (a redis:// URL talks to one node: open a cluster with "
        "redis+cluster://host:port,host:port)";
  } else {
    cause = "server error";
  }
  return cause + ": " + std::string(message);
}

std::string eviction_refusal(std::string_view info) {
  constexpr std::string_view kField = "maxmemory_policy:";
  const std::size_t at = info.find(kField);
  if (at == std::string_view::npos) {
    return "cannot tell the server's maxmemory-policy (INFO memory has no maxmemory_policy "
           "line); open the store with eviction=allow to skip the check "
           "(docs/stores/redis.md, \"Eviction\")";
  }
  std::string_view policy = info.substr(at + kField.size());
  policy = policy.substr(0, policy.find_first_of("\r\n"));
  if (policy == "noeviction") return {};
  return "the server's maxmemory-policy is " + std::string(policy) +
         ", which lets Redis evict idem's records when it reaches maxmemory: an evicted lease "
         "lets a second caller run the action beside the first, an evicted result lets it run "
         "again. Set maxmemory-policy to noeviction (redis.conf, CONFIG SET maxmemory-policy "
         "noeviction, or the provider's parameter group), or accept that risk with "
         "eviction=allow in the store URL (docs/stores/redis.md, \"Eviction\")";
}

// --- Connection -------------------------------------------------------------------------

Connection::Connection(const ConnectionSettings& settings) : settings_(settings) {}

Connection::~Connection() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  fail_queued("the store was closed");
}

std::string Connection::connect_now(ScriptShas* shas) {
  std::string error;
  std::uint64_t generation = 0;
  Context c = handshake(error, shas, generation);
  std::lock_guard lock(mu_);
  if (!c) {
    last_error_ = error;
    return error;
  }
  ctx_ = std::move(c);
  up_.store(true, std::memory_order_release);
  return {};
}

void Connection::start() {
  thread_ = std::thread([this] { loop(); });
}

std::string Connection::last_error() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

ConnectionStats Connection::stats() const {
  ConnectionStats s;
  s.round_trips = round_trips_.load(std::memory_order_relaxed);
  s.commands = commands_.load(std::memory_order_relaxed);
  s.reconnects = reconnects_.load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  s.queued = queue_.size();
  return s;
}

Context Connection::handshake(std::string& error, ScriptShas* shas,
                              std::uint64_t& generation) const {
  return open_link(settings_, error, shas, generation);
}

std::string Connection::round_trip(std::vector<std::shared_ptr<Call>>& batch) {
  const Duration timeout = settings_.io_timeout;
  std::vector<iovec> iov;
  iov.reserve(batch.size() + 1);
  bool wait = false;
  std::size_t commands = 0;
  for (const auto& call : batch) {
    iov.push_back({call->request.data(), call->request.size()});
    wait = wait || call->wait_replicas;
    commands += call->commands;
  }
  if (wait) {
    iov.push_back(
        {const_cast<char*>(settings_.wait_command.data()), settings_.wait_command.size()});
    ++commands;
  }
  round_trips_.fetch_add(1, std::memory_order_relaxed);
  commands_.fetch_add(commands, std::memory_order_relaxed);

  std::string error = link_send(*ctx_, iov, timeout);
  // Calls that asked for WAIT are answered after its reply, with their own replies.
  std::vector<std::pair<Call*, std::vector<Reply>>> waiting;
  std::size_t answered = 0;
  bool readonly = false;
  for (; error.empty() && answered < batch.size(); ++answered) {
    Call& call = *batch[answered];
    std::vector<Reply> replies;
    replies.reserve(call.commands);
    for (std::size_t i = 0; i < call.commands && error.empty(); ++i) {
      Reply r;
      error = link_read(*ctx_, r, timeout);
      if (error.empty()) {
        if (r->type == REDIS_REPLY_ERROR && reply_text(*r).substr(0, 8) == "READONLY") {
          readonly = true;
        }
        replies.push_back(std::move(r));
      }
    }
    if (!error.empty()) break;
    if (call.wait_replicas) {
      waiting.emplace_back(&call, std::move(replies));
    } else {
      finish(call, std::move(replies), -1, {});
    }
  }
  if (error.empty() && wait) {
    Reply r;
    error = link_read(*ctx_, r, timeout);
    if (error.empty()) {
      const bool counted = r->type == REDIS_REPLY_INTEGER;
      const std::string why =
          counted ? std::string()
                  : "WAIT for replicas failed: " + explain_server_error(reply_text(*r));
      // A failed WAIT does not fail the calls: each gets its own replies too, which the
      // store reads first (after a cluster failover, the demoted primary's MOVED: it
      // follows it rather than report that WAIT failed).
      for (auto& [call, replies] : waiting) {
        finish(*call, std::move(replies), counted ? r->integer : -1, {}, why);
      }
      waiting.clear();
    }
  }
  if (error.empty()) {
    // Sentinel: the primary became a replica (a failover). Its calls fail with READONLY
    // (nothing ran); the connection is dropped so the next one asks the sentinels again.
    if (readonly && !settings_.sentinels.empty()) {
      return "the server became a replica (READONLY): asking the sentinels for the new primary";
    }
    return {};
  }
  const std::string lost = "connection lost: " + error +
                           " (the request was sent, so it may or may not have taken effect)";
  for (auto& [call, replies] : waiting) finish(*call, {}, -1, lost);
  for (std::size_t i = answered; i < batch.size(); ++i) finish(*batch[i], {}, -1, lost);
  return error;
}

void Connection::finish(Call& call, std::vector<Reply>&& replies, long long acked,
                        std::string error, std::string wait_error) {
  {
    std::lock_guard lock(call.mu_);
    if (call.state_ == Call::State::kAbandoned) return;
    call.replies = std::move(replies);
    call.replicas_acked = acked;
    call.error = std::move(error);
    call.wait_error = std::move(wait_error);
    call.state_ = Call::State::kDone;
  }
  // After unlocking, so the caller does not wake only to wait for the lock. The batch still
  // holds a reference, so the call outlives this even if its caller has already returned.
  call.cv_.notify_one();
}

void Connection::fail_queued(const std::string& reason) {
  for (const auto& call : queue_) finish(*call, {}, -1, reason);
  queue_.clear();
}

void Connection::broke(const std::string& reason) {
  ctx_.reset();
  up_.store(false, std::memory_order_release);
  last_error_ = reason;
  // The first attempt at once: a server that restarted is usually back.
  backoff_ = Duration{0};
  next_attempt_ = SteadyClock::now();
}

void Connection::round_trip_ended(const std::string& error) {
  busy_ = false;
  if (!error.empty()) {
    broke(error);
  } else if (moving_ && ctx_) {
    broke("the sentinels announced a new primary (+switch-master)");
  }
}

bool Connection::up_elsewhere(const std::string& address) const {
  std::lock_guard lock(mu_);
  return ctx_ && !moving_ && ctx_->address != address;
}

void Connection::move_to(const std::string& address) {
  {
    std::lock_guard lock(mu_);
    if (stop_ || (ctx_ && !moving_ && ctx_->address == address)) return;
    moving_ = true;
    up_.store(false, std::memory_order_release);
    // A round trip in flight ends first: its owner drops the connection (round_trip_ended).
    if (ctx_ && !busy_) {
      broke("the sentinels announced a new primary (+switch-master)");
    } else if (!ctx_) {
      backoff_ = Duration{0};
      next_attempt_ = SteadyClock::now();
    }
  }
  cv_.notify_all();
}

void Connection::execute(const std::shared_ptr<Call>& call, SteadyClock::time_point deadline,
                         Duration timeout) {
  load_.fetch_add(1, std::memory_order_relaxed);
  struct Unload {
    std::atomic<int>& load;
    ~Unload() { load.fetch_sub(1, std::memory_order_relaxed); }
  } unload{load_};
  std::unique_lock lock(mu_);
  // Moving to a new primary: the call waits for that connection instead of failing.
  if (stop_ || (!ctx_ && !moving_)) {
    call->error = "not connected (reconnecting in the background): " + last_error_;
    return;
  }
  if (ctx_ && !moving_ && !busy_ && queue_.empty()) {
    // Idle: make the round trip on this thread, which saves two thread hand-offs per call.
    busy_ = true;
    call->state_ = Call::State::kSent;  // not shared with any other thread yet
    lock.unlock();
    std::vector<std::shared_ptr<Call>> batch{call};
    const std::string error = round_trip(batch);
    lock.lock();
    round_trip_ended(error);
    // Calls that queued meanwhile go out in the loop's next round trip.
    const bool wake = !queue_.empty() || !ctx_;
    lock.unlock();
    if (wake) cv_.notify_all();
    return;
  }
  queue_.push_back(call);
  const bool wake = !busy_;
  lock.unlock();
  // While a round trip is in flight its owner takes the queue afterwards: no wake-up needed.
  if (wake) cv_.notify_all();

  std::unique_lock call_lock(call->mu_);
  if (call->cv_.wait_until(call_lock, deadline,
                           [&] { return call->state_ == Call::State::kDone; })) {
    return;
  }
  const bool sent = call->state_ == Call::State::kSent;
  call->state_ = Call::State::kAbandoned;
  call->error = sent ? "timed out after " + ms(timeout) +
                           " waiting for the server's reply (the request was sent, so it may "
                           "or may not have taken effect)"
                     : "timed out after " + ms(timeout) + " before the request could be sent";
}

void Connection::loop() {
  std::vector<std::shared_ptr<Call>> batch;
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (!ctx_) {
      // next_attempt_ is read again on every wake-up: move_to() brings it forward.
      while (!stop_ && SteadyClock::now() < next_attempt_) cv_.wait_until(lock, next_attempt_);
      if (stop_) break;
      lock.unlock();
      std::string error;
      std::uint64_t generation = 0;
      Context c = handshake(error, nullptr, generation);
      lock.lock();
      if (settings_.switched && settings_.switched->generation() != generation) {
        // A +switch-master came meanwhile: connect again, to the primary it names.
        c.reset();
        next_attempt_ = SteadyClock::now();
        continue;
      }
      moving_ = false;
      if (c) {
        ctx_ = std::move(c);
        up_.store(true, std::memory_order_release);
        reconnects_.fetch_add(1, std::memory_order_relaxed);
      } else {
        last_error_ = error;
        backoff_ = backoff_ == Duration{0} ? kFirstBackoff : std::min(backoff_ * 2, kMaxBackoff);
        next_attempt_ = SteadyClock::now() + backoff_;
        fail_queued("not connected (reconnecting in the background): " + error);
      }
      continue;
    }
    cv_.wait(lock, [&] { return stop_ || !ctx_ || (!queue_.empty() && !busy_); });
    if (stop_ || !ctx_) continue;
    for (const auto& call : queue_) {
      std::lock_guard call_lock(call->mu_);
      // A call whose caller gave up before it was sent is not sent at all.
      if (call->state_ != Call::State::kQueued) continue;
      call->state_ = Call::State::kSent;
      batch.push_back(call);
    }
    queue_.clear();
    if (batch.empty()) continue;
    busy_ = true;
    lock.unlock();
    const std::string error = round_trip(batch);
    batch.clear();
    lock.lock();
    round_trip_ended(error);
  }
}

// --- Sentinel: +switch-master --------------------------------------------------------------

std::pair<std::string, int> SwitchedPrimary::get(std::uint64_t& generation) const {
  std::lock_guard lock(mu_);
  generation = generation_;
  return {host_, port_};
}

void SwitchedPrimary::set(std::string host, int port) {
  std::lock_guard lock(mu_);
  host_ = std::move(host);
  port_ = port;
  ++generation_;
}

void SwitchedPrimary::seed(const std::string& host, int port) {
  std::lock_guard lock(mu_);
  if (!host_.empty()) return;
  host_ = host;
  port_ = port;
}

void SwitchedPrimary::forget(std::uint64_t generation) {
  std::lock_guard lock(mu_);
  if (generation == generation_) host_.clear();
}

std::uint64_t SwitchedPrimary::generation() const {
  std::lock_guard lock(mu_);
  return generation_;
}

namespace {

// A sentinel that does not answer (the subscription, or a PING) for this long is taken for
// dead; the watch is PINGed once a second while quiet.
constexpr Duration kWatchPingEvery{1000};

struct ReaderDeleter {
  void operator()(redisReader* r) const noexcept { redisReaderFree(r); }
};
struct AddrinfoDeleter {
  void operator()(addrinfo* a) const noexcept { freeaddrinfo(a); }
};
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads the configuration epoch from a sentinel's answer to SENTINEL MASTER <service>
// (field names and values, one after the other); empty, or why there is none.
std::string epoch_in_master_reply(const redisReply& r, const std::string& service,
                                  std::int64_t& epoch) {
  if (r.type == REDIS_REPLY_ERROR) {
    const std::string_view text = reply_text(r);
    if (text.find("No such master") != std::string_view::npos) {
      return unknown_service(service);
    }
    return explain_server_error(text);
  }
  for (std::size_t i = 0; r.type == REDIS_REPLY_ARRAY && i + 1 < r.elements; i += 2) {
    if (r.element[i]->type != REDIS_REPLY_STRING || r.element[i + 1]->type != REDIS_REPLY_STRING ||
        reply_text(*r.element[i]) != "config-epoch") {
      continue;
    }
    const std::string_view text = reply_text(*r.element[i + 1]);
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), epoch);
    if (ec == std::errc{} && end == text.data() + text.size()) return {};
  }
  return "unexpected reply (no config-epoch)";
}

// Reads what a sentinel's socket has into the reader; empty, or why the connection ended.
std::string receive(int fd, redisReader& reader) {
  char buf[4096];
  for (;;) {
    const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
    if (got == 0) return "the sentinel closed the connection";
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
      return "cannot read from the sentinel: " + errno_text(errno);
    }
    if (redisReaderFeed(&reader, buf, static_cast<std::size_t>(got)) != REDIS_OK) {
      return "protocol error";
    }
    return {};
  }
}

}  // namespace

SentinelWatch::SentinelWatch(const ConnectionSettings& settings, OnPrimary on_primary)
    : settings_(settings), on_primary_(std::move(on_primary)) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  thread_ = std::thread([this] { loop(); });
}

SentinelWatch::~SentinelWatch() {
  stop_.store(true);
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(wake_fd_);
}

bool SentinelWatch::wait_for(int fd, short events, Duration timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  for (;;) {
    if (stop_.load()) return false;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{fd, events, 0}, {wake_fd_, POLLIN, 0}};  // a negative fd is ignored
    const int n = ::poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), INT_MAX)));
    if (n < 0 && errno != EINTR) return false;
    if (n > 0 && (fds[0].revents & (events | POLLERR | POLLHUP)) != 0) return true;
  }
}

void SentinelWatch::loop() {
  const std::size_t n = settings_.sentinels.size();
  std::size_t next = 0;
  std::size_t failures = 0;  // sentinels in a row that could not be watched
  Duration backoff{0};
  while (!stop_.load()) {
    const auto& [host, port] = settings_.sentinels[next];
    next = (next + 1) % n;
    bool subscribed_once = false;
    (void)watch(host, port, subscribed_once);
    subscribed_.store(false, std::memory_order_relaxed);
    if (subscribed_once) {
      // It worked until now: the next sentinel at once.
      failures = 0;
      backoff = Duration{0};
    } else if (++failures >= n) {
      // None answers: wait before each further try, 20 ms doubling to 1 s.
      backoff = backoff == Duration{0} ? kFirstBackoff : std::min(backoff * 2, kMaxBackoff);
      (void)wait_for(-1, POLLIN, backoff);
    }
  }
}

std::string SentinelWatch::dial(const std::string& host, int port, int& sock) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      rc != 0) {
    return std::string("cannot resolve the sentinel: ") + gai_strerror(rc);
  }
  const std::unique_ptr<addrinfo, AddrinfoDeleter> addresses(found);
  sock = ::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock < 0) return "cannot open a socket: " + errno_text(errno);
  if (::connect(sock, found->ai_addr, found->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return "cannot connect: " + errno_text(errno);
    if (!wait_for(sock, POLLOUT, settings_.connect_timeout)) return "cannot connect";
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(sock, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      return "cannot connect: " + errno_text(err);
    }
  }
  return {};
}

std::string SentinelWatch::ask(const std::string& host, int port, std::string& primary_host,
                               int& primary_port, std::int64_t& epoch) {
  FdCloser sock{-1};
  if (std::string e = dial(host, port, sock.fd); !e.empty()) return e;
  // Both questions in one write, answered in one pass of the sentinel's loop. The epoch
  // first: it is never newer than the address's. The address from get-master-addr-by-name,
  // which names the promoted replica as soon as it is one; SENTINEL MASTER names the old
  // primary until the switch.
  std::string commands;
  CommandWriter(commands).begin(3).arg("SENTINEL").arg("MASTER").arg(settings_.sentinel_service);
  CommandWriter(commands)
      .begin(3)
      .arg("SENTINEL")
      .arg("get-master-addr-by-name")
      .arg(settings_.sentinel_service);
  std::vector<iovec> iov{{commands.data(), commands.size()}};
  if (std::string e = send_all(sock.fd, iov, settings_.connect_timeout); !e.empty()) return e;
  const std::unique_ptr<redisReader, ReaderDeleter> reader(redisReaderCreate());
  if (!reader) return "out of memory";
  const auto answer_by = SteadyClock::now() + settings_.connect_timeout;
  std::vector<Reply> replies;
  while (replies.size() < 2) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader.get(), &raw) != REDIS_OK) return "protocol error";
    if (raw != nullptr) {
      replies.emplace_back(static_cast<redisReply*>(raw));
      continue;
    }
    if (!wait_for(sock.fd, POLLIN, std::chrono::ceil<Duration>(answer_by - SteadyClock::now()))) {
      return "the sentinel did not name the primary within " + ms(settings_.connect_timeout);
    }
    if (std::string e = receive(sock.fd, *reader); !e.empty()) return e;
  }
  if (std::string e = epoch_in_master_reply(*replies[0], settings_.sentinel_service, epoch);
      !e.empty()) {
    return e;
  }
  return primary_in_reply(*replies[1], settings_.sentinel_service, primary_host, primary_port);
}

std::string SentinelWatch::watch(const std::string& host, int port, bool& subscribed_once) {
  FdCloser sock{-1};
  if (std::string e = dial(host, port, sock.fd); !e.empty()) return e;
  std::string subscribe;
  CommandWriter(subscribe).begin(2).arg("SUBSCRIBE").arg("+switch-master");
  std::string ping;
  CommandWriter(ping).begin(1).arg("PING");
  auto send = [&](std::string& what) {
    std::vector<iovec> iov{{what.data(), what.size()}};
    return send_all(sock.fd, iov, settings_.connect_timeout);
  };
  if (std::string e = send(subscribe); !e.empty()) return e;
  const std::unique_ptr<redisReader, ReaderDeleter> reader(redisReaderCreate());
  if (!reader) return "out of memory";
  // Until the subscription, then each PING, is answered.
  auto answer_by = SteadyClock::now() + settings_.connect_timeout;
  bool waiting = true;
  auto next_ping = SteadyClock::now();
  while (!stop_.load()) {
    const auto now = SteadyClock::now();
    if (waiting && now >= answer_by) {
      return "the sentinel did not answer within " + ms(settings_.connect_timeout);
    }
    if (!waiting && now >= next_ping) {
      if (std::string e = send(ping); !e.empty()) return e;
      waiting = true;
      answer_by = now + settings_.connect_timeout;
    }
    const auto until = waiting ? answer_by : next_ping;
    if (!wait_for(sock.fd, POLLIN,
                  std::chrono::ceil<Duration>(until - SteadyClock::now()) + Duration{1})) {
      continue;
    }
    if (std::string e = receive(sock.fd, *reader); !e.empty()) return e;
    for (;;) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader.get(), &raw) != REDIS_OK) return "protocol error";
      if (raw == nullptr) break;
      const Reply r(static_cast<redisReply*>(raw));
      if (r->type == REDIS_REPLY_ERROR)
        return "the sentinel answered " + std::string(reply_text(*r));
      if (handle(*r)) {
        // Subscribed: a failover before now sent its event to nobody, so ask which server
        // is the primary. Events from here on wait in the socket and come after the answer.
        std::string primary_host;
        int primary_port = 0;
        std::int64_t epoch = 0;
        if (std::string e = ask(host, port, primary_host, primary_port, epoch); !e.empty()) {
          return "cannot ask for the primary: " + e;
        }
        // An older epoch than one followed: this sentinel has not caught up with a failover
        // the store already followed (it announces it once it has).
        if (epoch >= followed_epoch_) {
          followed_epoch_ = epoch;
          if (on_primary_(primary_host, primary_port, false)) {
            switches_.fetch_add(1, std::memory_order_relaxed);
          }
        }
        subscribed_once = true;
        subscribed_.store(true, std::memory_order_relaxed);
      }
      waiting = false;
      next_ping = SteadyClock::now() + kWatchPingEvery;
    }
  }
  return {};
}

bool SentinelWatch::handle(const redisReply& r) {
  // ["subscribe", channel, count], ["message", channel, text] or ["pong", ""].
  if (r.type != REDIS_REPLY_ARRAY || r.elements < 2 || r.element[0]->type != REDIS_REPLY_STRING) {
    return false;
  }
  const std::string_view kind = reply_text(*r.element[0]);
  if (kind == "subscribe") return true;
  if (kind != "message" || r.elements != 3 || r.element[2]->type != REDIS_REPLY_STRING) {
    return false;
  }
  // "<service> <old ip> <old port> <new ip> <new port>"
  std::vector<std::string_view> words;
  std::string_view text = reply_text(*r.element[2]);
  while (!text.empty()) {
    const std::size_t space = text.find(' ');
    words.push_back(text.substr(0, space));
    text = space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
  }
  if (words.size() != 5 || words[0] != settings_.sentinel_service) return false;
  int port = 0;
  const auto [end, ec] = std::from_chars(words[4].data(), words[4].data() + words[4].size(), port);
  if (ec != std::errc{} || end != words[4].data() + words[4].size() || port <= 0) return false;
  if (on_primary_(std::string(words[3]), port, true)) {
    switches_.fetch_add(1, std::memory_order_relaxed);
  }
  // A failover's configuration is of a newer epoch than every one before it.
  if (followed_epoch_ >= 0) ++followed_epoch_;
  return false;
}

// --- Pool ---------------------------------------------------------------------------------

Pool::Pool(ConnectionSettings settings, std::size_t connections, std::string store_name)
    : settings_(std::move(settings)), store_name_(std::move(store_name)) {
  if (!settings_.sentinels.empty()) settings_.switched = std::make_shared<SwitchedPrimary>();
  for (std::size_t i = 0; i < connections; ++i) {
    connections_.push_back(std::make_unique<Connection>(settings_));
  }
}

Pool::~Pool() = default;

void Pool::connect(ScriptShas* shas) {
  for (std::size_t i = 0; i < connections_.size(); ++i) {
    const std::string error = connections_[i]->connect_now(i == 0 ? shas : nullptr);
    if (!error.empty()) throw StoreUnavailable(store_name_, error);
  }
  for (auto& c : connections_) c->start();
  if (settings_.sentinels.empty()) return;
  try {
    watch_ = std::make_unique<SentinelWatch>(
        settings_, [this](const std::string& host, int port, bool announced) {
          return follow(host, port, announced);
        });
  } catch (const std::system_error& e) {
    throw StoreUnavailable(store_name_, std::string("cannot watch the sentinels: ") + e.what());
  }
}

bool Pool::follow(const std::string& host, int port, bool announced) {
  const std::string address = host + ":" + std::to_string(port);
  if (!announced) {
    // An answer: a move only when the last event named another server, or a connection
    // is up on one.
    std::uint64_t generation = 0;
    const auto [switched_host, switched_port] = settings_.switched->get(generation);
    bool elsewhere = !switched_host.empty() && (switched_host != host || switched_port != port);
    for (const auto& c : connections_) elsewhere = elsewhere || c->up_elsewhere(address);
    if (!elsewhere) {
      // Kept, so that a connection that breaks comes back here rather than to whatever
      // the first sentinel that answers names (it may be behind).
      settings_.switched->seed(host, port);
      return false;
    }
  }
  // First the address, so that a connection opened from now on goes there.
  settings_.switched->set(host, port);
  for (auto& c : connections_) c->move_to(address);
  std::lock_guard lock(switch_mu_);
  if (switch_listener_) switch_listener_(address);
  return true;
}

void Pool::on_switch(std::function<void(const std::string&)> listener) {
  std::lock_guard lock(switch_mu_);
  switch_listener_ = std::move(listener);
}

void Pool::execute(const std::shared_ptr<Call>& call, Duration timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  const std::size_t n = connections_.size();
  const std::size_t first = next_.fetch_add(1, std::memory_order_relaxed) % n;
  Connection* chosen = connections_[first].get();
  int least = -1;
  for (std::size_t i = 0; i < n && least != 0; ++i) {
    Connection* c = connections_[(first + i) % n].get();
    if (!c->up()) continue;
    const int load = c->load();
    if (least < 0 || load < least) {
      chosen = c;
      least = load;
    }
  }
  chosen->execute(call, deadline, timeout);
  if (!call->error.empty()) throw StoreUnavailable(store_name_, call->error);
}

ConnectionStats Pool::stats() const {
  ConnectionStats total;
  for (const auto& c : connections_) {
    const ConnectionStats s = c->stats();
    total.round_trips += s.round_trips;
    total.commands += s.commands;
    total.reconnects += s.reconnects;
    total.queued += s.queued;
  }
  if (watch_) {
    total.primary_switches = watch_->switches();
    total.switch_events = watch_->subscribed();
  }
  return total;
}

}  // namespace idem::redis
