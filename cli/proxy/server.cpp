#include "server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "identity.h"
#include "messages.h"
#include "record.h"
#include "net.h"
#include "upstream.h"

namespace idem::proxy {

namespace {

// How a duplicate that waits (--wait) polls: the executor answers an in-process owner from
// memory, so a poll of a key held in this process costs no store round trip.
constexpr Duration kFirstPoll{10};
constexpr Duration kMaxPoll{250};
// After drain_timeout, how long cancelled requests get to release and answer.
constexpr Duration kAbortGrace{5000};

bool idempotent_method(http::verb v) {
  return v == http::verb::get || v == http::verb::head || v == http::verb::put ||
         v == http::verb::delete_ || v == http::verb::options || v == http::verb::trace;
}

// Shows bytes a client sent safely in a log line.
std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\' && c != '"') {
      out += c;
    } else {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0x0f];
    }
  }
  return out;
}

Duration jittered(Duration d) {
  thread_local std::minstd_rand rng{std::random_device{}()};
  std::uniform_int_distribution<std::int64_t> dist(d.count() / 2, d.count());
  return Duration{dist(rng)};
}

// The problem answer for an upstream exchange that failed (docs/proxy.md, "Every answer").
struct FailureAnswer {
  unsigned status;
  const char* code;
};

FailureAnswer answer_for(UpstreamResult::Failure failure) {
  using Failure = UpstreamResult::Failure;
  switch (failure) {
    case Failure::kTimeout:
      return {504, "upstream-timeout"};
    case Failure::kCancelled:
      return {503, "shutting-down"};
    case Failure::kConnect:
      return {502, "upstream-unreachable"};
    case Failure::kTooLarge:
      return {502, "upstream-too-large"};
    case Failure::kBadResponse:
      return {502, "upstream-bad-response"};
    case Failure::kBroken:
    case Failure::kNone:
      break;
  }
  return {502, "upstream-broken"};
}

// What a store call on the pool produced, handed back to the session's strand.
struct BeginOutcome {
  std::optional<BeginResult<>> result;
  // Set instead of result when begin threw: the answer to give.
  std::optional<Response> error;
  std::string outcome;
};

}  // namespace

class Session;

struct Server::Core : std::enable_shared_from_this<Server::Core> {
  Core(ProxyOptions opts, std::shared_ptr<Store> store, std::function<void(const std::string&)> log)
      : options(std::move(opts)),
        log(std::move(log)),
        ioc(static_cast<int>(std::max(1u, options.io_threads))),
        work(asio::make_work_guard(ioc)),
        store_pool(std::max(1u, options.store_threads)),
        executor(std::move(store), executor_options(options)),
        acceptor(ioc),
        signals(ioc),
        drain_timer(ioc) {}

  static ExecutorOptions executor_options(const ProxyOptions& o) {
    ExecutorOptions e;
    e.lease = o.lease;
    e.ttl = o.ttl;
    e.max_payload = o.max_record;
    return e;
  }

  const ProxyOptions options;
  const std::function<void(const std::string&)> log;
  asio::io_context ioc;
  // Keeps the I/O threads running while store calls are out on the pool; dropped when the
  // drain ends.
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  asio::thread_pool store_pool;
  Executor executor;
  std::optional<UpstreamPool> upstream;
  tcp::acceptor acceptor;
  asio::signal_set signals;
  asio::steady_timer drain_timer;

  std::mutex sessions_mu;
  std::unordered_map<std::uint64_t, std::weak_ptr<Session>> sessions;
  std::uint64_t next_session = 0;
  std::atomic<bool> draining{false};
  bool drained = false;  // guarded by sessions_mu

  std::uint64_t add_session(const std::shared_ptr<Session>& s);
  void remove_session(std::uint64_t id);
  std::vector<std::shared_ptr<Session>> live_sessions();

  void accept();
  void start_drain(const std::string& why);
  void abort_all();
  // Ends run(): no session is left, or the grace after aborting ran out.
  void finish();
  std::shared_ptr<Core> shared_self() { return shared_from_this(); }
};

// One client connection. Its steps run one at a time on the connection's strand; store
// calls go to the store pool and come back to the strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Server::Core> core, tcp::socket socket)
      : core_(std::move(core)), stream_(std::move(socket)), wait_timer_(stream_.get_executor()) {}

  ~Session() {
    if (id_ != 0) core_->remove_session(id_);
  }

  void start(std::uint64_t id) {
    id_ = id;
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // Graceful shutdown: a connection waiting for its next request closes now; one with a
  // request in flight closes after answering it.
  void drain() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->idle_) self->close();
    });
  }

  // The drain ran out of time: give up on the request in flight (its record is released
  // and its client answered 503).
  void abort() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      self->aborted_ = true;
      if (self->idle_) return self->close();
      if (self->upstream_call_) UpstreamPool::cancel(self->upstream_call_);
      self->wait_timer_.cancel();
      if (self->writing_) self->close();
    });
  }

  // After the I/O threads stopped with this request still open (the grace after abort()
  // ran out): releases its record now, so the key is free at once rather than when the
  // lease runs out. Only called when no other thread runs.
  void release_unfinished() { handle_.release(); }

 private:
  // ---- reading a request ----

  void read_request() {
    if (core_->draining || aborted_) return close();
    idle_ = buffer_.size() == 0;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(core_->options.max_request_header));
    parser_->body_limit(core_->options.max_request_body);
    stream_.expires_after(idle_ ? core_->options.idle_timeout : core_->options.client_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, std::size_t) {
                              self->on_header(ec);
                            });
  }

  void on_header(beast::error_code ec) {
    idle_ = false;
    if (ec) return on_read_error(ec);
    started_ = SteadyClock::now();
    stream_.expires_after(core_->options.client_timeout);
    const auto& header = parser_->get();
    if (beast::iequals(header[http::field::expect], "100-continue") && !parser_->is_done()) {
      if (auto length = parser_->content_length();
          length && *length > core_->options.max_request_body) {
        return refuse_body_too_large();
      }
      // The client waits for this before sending the body (RFC 9110 §10.1.1).
      auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_,
                                                                     header.version());
      return http::async_write(stream_, *cont,
                               [self = shared_from_this(), cont](beast::error_code ec, std::size_t) {
                                 if (ec) return self->close();
                                 self->read_body();
                               });
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       if (ec) return self->on_read_error(ec);
                       self->req_ = self->parser_->release();
                       self->handle_request();
                     });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::body_limit) return refuse_body_too_large();
    if (ec == http::error::header_limit) {
      outcome_ = "refused";
      return answer_and_close(problem(431, "header-too-large",
                                      "the request's header is larger than the limit of " +
                                          std::to_string(core_->options.max_request_header) +
                                          " bytes"));
    }
    // A client that went away, an idle connection timing out or shutting down, or a read
    // cut short: nothing to answer.
    if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted ||
        ec == beast::error::timeout || ec == asio::error::connection_reset ||
        ec == http::error::partial_message || ec == asio::error::eof) {
      return close();
    }
    outcome_ = "refused";
    answer_and_close(problem(400, "bad-request", "the request is not valid HTTP/1.1: " + ec.message()));
  }

  void refuse_body_too_large() {
    outcome_ = "refused";
    answer_and_close(problem(413, "body-too-large",
                             "the request body is larger than the limit of " +
                                 std::to_string(core_->options.max_request_body) + " bytes"));
  }

  // ---- deciding what to do with it ----

  void handle_request() {
    const auto& methods = core_->options.methods;
    const bool keyed_method =
        std::find(methods.begin(), methods.end(), req_.method_string()) != methods.end();
    if (!keyed_method) return forward(false);
    KeyHeader key = read_key(req_);
    switch (key.kind) {
      case KeyHeader::Kind::kAbsent:
        if (!core_->options.require_key) return forward(false);
        outcome_ = "refused";
        return answer(problem(400, "missing-key",
                              "this proxy requires an Idempotency-Key header on " +
                                  std::string(req_.method_string()) + " requests"));
      case KeyHeader::Kind::kMalformed:
        outcome_ = "refused";
        return answer(problem(400, "bad-key", key.why));
      case KeyHeader::Kind::kValid:
        break;
    }
    key_ = std::move(key.key);
    keyed_ = true;
    scope_ = scope_of(req_, core_->options);
    fingerprint_ = fingerprint_of(req_, core_->options);
    wait_deadline_.reset();
    poll_ = kFirstPoll;
    begin();
  }

  // ---- the executor, on the store pool ----

  // Runs a store call: on the store pool, or inline on this I/O thread when the proxy runs
  // with --store-threads 0.
  template <typename F>
  void on_store(F&& f) {
    if (core_->options.store_threads == 0) return f();
    asio::post(core_->store_pool, std::forward<F>(f));
  }
  // Comes back to the connection's strand after a store call.
  template <typename F>
  void back(F&& f) {
    if (core_->options.store_threads == 0) return f();
    asio::post(stream_.get_executor(), std::forward<F>(f));
  }

  void begin() {
    on_store([self = shared_from_this()] {
      BeginOutcome out;
      try {
        out.result.emplace(self->core_->executor.begin(self->scope_, self->key_,
                                                       CallOptions{.fingerprint = self->fingerprint_}));
      } catch (const KeyReuse&) {
        out.outcome = "key-reuse";
        out.error = problem(422, "key-reuse",
                            "this Idempotency-Key was used before with a different request "
                            "(method, target or body); use a new key for a new request");
      } catch (const StoreUnavailable& e) {
        out.outcome = "store-unavailable";
        out.error = problem(503, "store-unavailable",
                            std::string("the idempotency store cannot be reached; the request "
                                        "was not forwarded: ") +
                                e.what());
        out.error->set(http::field::retry_after, "1");
      } catch (const InvalidArgument& e) {
        out.outcome = "refused";
        out.error = problem(400, "bad-key", e.what());
      } catch (const std::exception& e) {
        out.outcome = "error";
        out.error = problem(500, "internal-error", e.what());
      }
      self->back([self, out = std::move(out)]() mutable { self->on_begun(std::move(out)); });
    });
  }

  void on_begun(BeginOutcome out) {
    if (out.error) {
      outcome_ = out.outcome;
      return answer(std::move(*out.error));
    }
    BeginResult<>& begun = *out.result;
    if (Result<std::string>* replay = begun.replay()) {
      std::string why;
      std::optional<RecordedResponse> recorded = decode_record(replay->value, &why);
      if (!recorded) {
        outcome_ = "foreign-record";
        return answer(problem(500, "foreign-record", why));
      }
      outcome_ = "replayed";
      return answer(from_record(*recorded, /*replayed=*/true));
    }
    if (const Busy* busy = begun.busy()) return on_busy(*busy);
    handle_ = std::move(*begun.handle());
    if (aborted_) return release_and_answer(shutting_down(), "cancelled");
    forward(true);
  }

  void on_busy(const Busy& busy) {
    const auto now = SteadyClock::now();
    if (!wait_deadline_) wait_deadline_ = now + core_->options.wait;
    if (now < *wait_deadline_ && !aborted_) {
      // --wait: poll again, never past the owner's lease deadline nor the waiting bound.
      auto pause = std::min({SteadyClock::duration(jittered(poll_)),
                             SteadyClock::duration(busy.lease_remaining), *wait_deadline_ - now});
      poll_ = std::min(poll_ * 2, kMaxPoll);
      wait_timer_.expires_after(pause);
      return wait_timer_.async_wait([self = shared_from_this()](beast::error_code) {
        if (self->aborted_) {
          self->outcome_ = "cancelled";
          return self->answer(self->shutting_down());
        }
        self->begin();
      });
    }
    outcome_ = "in-progress";
    Response res = problem(409, "in-progress",
                           "a request with this Idempotency-Key is in progress; retry after "
                           "the time in Retry-After");
    res.set(http::field::retry_after, retry_after(busy.lease_remaining));
    answer(std::move(res));
  }

  // ---- the upstream ----

  void forward(bool keyed) {
    keyed_ = keyed;
    Request up = upstream_request(req_);
    if (keyed) add_fencing(up, handle_.token(), handle_.number(), handle_.stolen());
    const bool repeatable = !keyed && idempotent_method(req_.method());
    upstream_call_ = core_->upstream->send(
        std::move(up), repeatable, [self = shared_from_this()](UpstreamResult result) {
          asio::post(self->stream_.get_executor(), [self, result = std::move(result)]() mutable {
            self->on_upstream(std::move(result));
          });
        });
  }

  void on_upstream(UpstreamResult result) {
    upstream_call_.reset();
    if (result.failure != UpstreamResult::Failure::kNone) {
      const FailureAnswer failure = answer_for(result.failure);
      outcome_ = failure.code;
      Response res = result.failure == UpstreamResult::Failure::kCancelled
                         ? shutting_down()
                         : problem(failure.status, failure.code, result.detail);
      // SPEC §13: a timeout or a broken connection releases the record (no failed state).
      if (keyed_) return release_and_answer(std::move(res), outcome_);
      return answer(std::move(res));
    }
    Response res = std::move(result.response);
    if (!keyed_) {
      outcome_ = "passed";
      return answer(std::move(res));
    }
    if (releases(res.result_int(), core_->options)) {
      return release_and_answer(std::move(res), "released");
    }
    RecordedResponse record = to_record(res);
    if (encoded_size(record) > core_->options.max_record) {
      // docs/proxy.md: a larger answer is passed through once and the record released.
      res.set(kNotRecordedHeader, "too-large");
      return release_and_answer(std::move(res), "too-large");
    }
    complete_and_answer(std::move(res), encode_record(record));
  }

  void complete_and_answer(Response res, std::string bytes) {
    on_store([self = shared_from_this(), res = std::move(res), bytes = std::move(bytes)]() mutable {
      std::string not_recorded;
      try {
        (void)self->handle_.complete(std::move(bytes));
      } catch (const PayloadTooLarge&) {
        not_recorded = "too-large";
      } catch (const LeaseLost&) {
        not_recorded = "lease-lost";
      } catch (const StoreUnavailable&) {
        not_recorded = "store-unavailable";
      } catch (const std::exception&) {
        not_recorded = "error";
      }
      if (!not_recorded.empty()) res.set(kNotRecordedHeader, not_recorded);
      self->back([self, res = std::move(res), not_recorded = std::move(not_recorded)]() mutable {
        self->outcome_ = not_recorded.empty() ? "recorded" : not_recorded;
        self->answer(std::move(res));
      });
    });
  }

  void release_and_answer(Response res, std::string outcome) {
    on_store([self = shared_from_this(), res = std::move(res), outcome = std::move(outcome)]() mutable {
      self->handle_.release();
      self->back([self, res = std::move(res), outcome = std::move(outcome)]() mutable {
        self->outcome_ = std::move(outcome);
        self->answer(std::move(res));
      });
    });
  }

  Response shutting_down() {
    return problem(503, "shutting-down",
                   "the proxy is shutting down and could not finish this request in time; "
                   "nothing was recorded, so a retry runs it again");
  }

  // ---- answering ----

  void answer(Response res) {
    res_ = std::move(res);
    prepare_for_client(res_, req_, core_->draining || aborted_);
    log_request();
    write();
  }

  // For errors found before a whole request was read: the connection cannot be trusted to
  // be at a message boundary, so it closes after the answer.
  void answer_and_close(Response res) {
    if (parser_ && parser_->is_header_done()) {
      req_.base() = parser_->get().base();
    } else {
      req_.version(11);
    }
    res_ = std::move(res);
    prepare_for_client(res_, req_, true);
    log_request();
    write();
  }

  void write() {
    writing_ = true;
    stream_.expires_after(core_->options.client_timeout);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      self->writing_ = false;
      if (ec || !self->res_.keep_alive()) return self->close();
      self->req_ = {};
      self->res_ = {};
      self->keyed_ = false;
      self->outcome_.clear();
      self->read_request();
    });
  }

  void log_request() {
    if (!core_->options.access_log) return;
    auto ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - started_).count();
    std::string line = std::string(req_.method_string()) + " " + printable(req_.target()) + " " +
                       std::to_string(res_.result_int()) + " " +
                       (outcome_.empty() ? "answered" : outcome_);
    if (!key_.empty() && keyed_) line += " key=\"" + printable(key_) + "\"";
    char took[32];
    std::snprintf(took, sizeof took, " %.2f ms", ms);
    core_->log(line + took);
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.socket().close(ignored);
  }

  std::shared_ptr<Server::Core> core_;
  std::uint64_t id_ = 0;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Request req_;
  Response res_;
  asio::steady_timer wait_timer_;

  // The request in flight.
  SteadyClock::time_point started_{};
  std::string key_;
  std::string scope_;
  std::string fingerprint_;
  bool keyed_ = false;
  AttemptHandle<> handle_;
  std::shared_ptr<UpstreamCall> upstream_call_;
  std::optional<SteadyClock::time_point> wait_deadline_;
  Duration poll_ = kFirstPoll;
  std::string outcome_;

  // Waiting for the next request with nothing read yet (a drain may close it).
  bool idle_ = false;
  bool writing_ = false;
  bool aborted_ = false;
};

namespace {

// The answer to a client beyond max_connections, written without a session.
void refuse_connection(tcp::socket socket) {
  auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
  auto res = std::make_shared<Response>(problem(503, "too-many-connections",
                                                "the proxy has as many client connections open "
                                                "as it is allowed; retry later"));
  res->version(11);
  res->keep_alive(false);
  res->set(http::field::retry_after, "1");
  res->prepare_payload();
  stream->expires_after(std::chrono::seconds(5));
  http::async_write(*stream, *res, [stream, res](beast::error_code, std::size_t) {
    beast::error_code ignored;
    stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
  });
}

}  // namespace

std::uint64_t Server::Core::add_session(const std::shared_ptr<Session>& s) {
  std::lock_guard<std::mutex> lock(sessions_mu);
  std::uint64_t id = ++next_session;
  sessions.emplace(id, s);
  return id;
}

void Server::Core::remove_session(std::uint64_t id) {
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(sessions_mu);
    sessions.erase(id);
    last = sessions.empty() && draining && !drained;
    if (last) drained = true;
  }
  if (last) asio::post(ioc, [this] { finish(); });
}

std::vector<std::shared_ptr<Session>> Server::Core::live_sessions() {
  std::vector<std::shared_ptr<Session>> out;
  std::lock_guard<std::mutex> lock(sessions_mu);
  for (auto& [id, weak] : sessions) {
    if (auto s = weak.lock()) out.push_back(std::move(s));
  }
  return out;
}

void Server::Core::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (draining) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors or similar: say so, and try again shortly rather than spin.
      log("accept failed: " + ec.message());
      auto timer = std::make_shared<asio::steady_timer>(ioc, std::chrono::milliseconds(50));
      return timer->async_wait([this, timer](beast::error_code) { accept(); });
    }
    std::size_t open = 0;
    {
      std::lock_guard<std::mutex> lock(sessions_mu);
      open = sessions.size();
    }
    if (open >= options.max_connections) {
      refuse_connection(std::move(socket));
    } else {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      // The session's owner is this very Core (shared), kept alive by every session.
      auto session = std::make_shared<Session>(shared_self(), std::move(socket));
      session->start(add_session(session));
    }
    accept();
  });
}

void Server::Core::start_drain(const std::string& why) {
  if (draining.exchange(true)) return;
  beast::error_code ignored;
  acceptor.close(ignored);
  signals.cancel(ignored);
  std::vector<std::shared_ptr<Session>> live = live_sessions();
  log(why + ": stopped accepting; finishing " + std::to_string(live.size()) +
      " connection(s) (at most " + std::to_string(options.drain_timeout.count()) + " ms)");
  for (auto& s : live) s->drain();
  {
    std::lock_guard<std::mutex> lock(sessions_mu);
    if (sessions.empty() && !drained) {
      drained = true;
      asio::post(ioc, [this] { finish(); });
      return;
    }
  }
  drain_timer.expires_after(options.drain_timeout);
  drain_timer.async_wait([this](beast::error_code ec) {
    if (ec) return;  // finish() cancelled it: everything ended in time
    abort_all();
  });
}

void Server::Core::abort_all() {
  std::vector<std::shared_ptr<Session>> live = live_sessions();
  log("drain timeout: cancelling " + std::to_string(live.size()) +
      " request(s); their records are released");
  for (auto& s : live) s->abort();
  drain_timer.expires_after(kAbortGrace);
  drain_timer.async_wait([this](beast::error_code ec) {
    if (ec) return;
    log("requests still open after the grace period; stopping");
    ioc.stop();
  });
}

void Server::Core::finish() {
  drain_timer.cancel();
  if (upstream) upstream->close_idle();
  work.reset();
}

Server::Server(ProxyOptions options, std::shared_ptr<Store> store,
               std::function<void(const std::string&)> log)
    : core_(std::make_shared<Core>(std::move(options), std::move(store), std::move(log))) {}

Server::~Server() = default;

void Server::run() {
  Core& core = *core_;
  const ProxyOptions& o = core.options;

  tcp::resolver resolver(core.ioc);
  beast::error_code ec;
  auto endpoints = resolver.resolve(o.upstream_host, std::to_string(o.upstream_port), ec);
  if (ec) {
    throw std::invalid_argument("cannot resolve the upstream host \"" + o.upstream_host +
                                "\": " + ec.message());
  }
  core.upstream.emplace(core.ioc, std::move(endpoints), o);

  auto address = asio::ip::make_address(o.listen_address, ec);
  if (ec) throw std::invalid_argument("\"" + o.listen_address + "\" is not an IP address");
  tcp::endpoint endpoint(address, o.listen_port);
  auto fail = [&](const char* what) {
    if (ec) {
      throw std::system_error(ec, std::string("cannot listen on ") + o.listen_address + ":" +
                                      std::to_string(o.listen_port) + " (" + what + ")");
    }
  };
  core.acceptor.open(endpoint.protocol(), ec);
  fail("open");
  core.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  fail("SO_REUSEADDR");
  core.acceptor.bind(endpoint, ec);
  fail("bind");
  core.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  fail("listen");
  tcp::endpoint bound = core.acceptor.local_endpoint();
  std::string shown = bound.address().is_v6() ? "[" + bound.address().to_string() + "]"
                                              : bound.address().to_string();
  core.log("listening on " + shown + ":" + std::to_string(bound.port()) + ", forwarding to http://" +
           o.upstream_host + ":" + std::to_string(o.upstream_port) + ", store " +
           core.executor.store().describe());

  core.signals.add(SIGTERM);
  core.signals.add(SIGINT);
  core.signals.async_wait([&core](beast::error_code ec, int sig) {
    if (ec) return;
    core.start_drain(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  });
  core.accept();

  std::vector<std::thread> threads;
  for (unsigned i = 1; i < std::max(1u, o.io_threads); ++i) {
    threads.emplace_back([&core] { core.ioc.run(); });
  }
  core.ioc.run();
  for (auto& t : threads) t.join();
  // Store calls still out (bounded by the store's own timeouts) finish before the executor
  // goes; handles of requests that never finished release their records as they are
  // destroyed with the handlers that hold them.
  core.store_pool.join();
  for (auto& s : core.live_sessions()) s->release_unfinished();
  core.log("stopped");
}

}  // namespace idem::proxy
