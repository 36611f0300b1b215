// One connection of `idem proxy` (docs/proxy.md): reads its requests, turns each into a call
// of the executor on the store pool and forwards it upstream, then answers. The server's
// lifecycle (accept, drain, shutdown) is in server.cpp.

#include "session.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <system_error>
#include <thread>
#include <vector>

#include "admin.h"
#include "core.h"
#include "exchange.h"
#include "idem/error.h"
#include "idem/executor.h"
#include "identity.h"
#include "messages.h"
#include "net.h"
#include "notify.h"
#include "record.h"

namespace idem::proxy {

namespace {

// How a duplicate that waits (--wait) polls when nothing tells it the key changed
// (Executor::begin_async: it is woken at once by an owner in this proxy, and by the store's
// notification for one elsewhere).
constexpr Duration kFirstPoll{10};
constexpr Duration kMaxPoll{250};

bool idempotent_method(http::verb v) {
  return v == http::verb::get || v == http::verb::head || v == http::verb::put ||
         v == http::verb::delete_ || v == http::verb::options || v == http::verb::trace;
}

// What a store call on the pool produced, handed back to the session's strand.
struct BeginOutcome {
  std::optional<BeginResult<>> result;
  // Set instead of result when begin threw: the problem to answer, and what to log.
  unsigned status = 0;
  const char* code = nullptr;
  const char* text = nullptr;
  std::string detail;
  // How long the store call took.
  SteadyClock::duration took{};
};

// Runs `ask` (begin, or the answer of a wait) and turns what it throws into the problem to
// answer.
template <typename F>
void catch_begin(BeginOutcome& out, F&& ask) {
  try {
    ask();
  } catch (const KeyReuse&) {
    out = {std::nullopt,
           422,
           "key-reuse",
           "this idempotency key was used before with a different request (method, target "
           "or body); use a new key for a new request",
           {}};
  } catch (const StoreUnavailable& e) {
    out = {std::nullopt, 503, "store-unavailable",
           "the idempotency store cannot be reached; the request was not forwarded", e.what()};
  } catch (const ShutDown&) {
    out = {std::nullopt,
           503,
           "shutting-down",
           "the proxy is shutting down and could not finish this request in time",
           {}};
  } catch (const std::exception& e) {
    out = {std::nullopt, 500, "internal-error",
           "the proxy failed to handle this request; it was not forwarded", e.what()};
  }
}

}  // namespace

class Session : public Drainable, public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Core> core, tcp::socket socket)
      : core_(std::move(core)), stream_(std::move(socket)) {
    beast::error_code ec;
    tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
    if (!ec) {
      client_.address = peer.address().is_v4() || !peer.address().to_v6().is_v4_mapped()
                            ? peer.address().to_string()
                            : peer.address().to_v6().to_v4().to_string();
      client_.port = peer.port();
    }
  }

  ~Session() override {
    if (id_ != 0) core_->forget(id_, /*connection=*/true);
  }

  void start(std::uint64_t id) {
    id_ = id;
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // Graceful shutdown: a connection waiting for its next request closes now; one with a
  // request in flight closes after answering it.
  void drain() override {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->idle_) self->close();
    });
  }

  // The drain ran out of time: give up on the request in flight. A keyed request that may
  // have reached the upstream keeps its key held (SPEC §13); its client gets 503.
  void abort() override {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      self->aborted_ = true;
      if (self->idle_) return self->close();
      if (self->exchange_) self->exchange_->cancel();
      self->stop_waiting_.request_stop();
      if (self->writing_) self->close();
    });
  }

  void abandon_unfinished() noexcept override {
    if (exchange_) exchange_->abandon_unfinished();
    // A lease taken but never forwarded: nothing ran.
    handle_.release();
  }

 private:
  // The most of a request body read at once.
  static constexpr std::size_t kPieceBytes = 64 * 1024;

  // ---- reading a request ----

  void read_request() {
    if (core_->draining || aborted_) return close();
    idle_ = buffer_.size() == 0;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(core_->options.max_request_header));
    // A streamed body has no limit; a keyed one gets max_request_body below. (The largest
    // limit rather than none: Boost 1.74 compares a Content-Length with an unset limit as
    // larger than it.)
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    // --idle-timeout is for a kept-alive connection between requests; a new connection must
    // bring its first request within --client-timeout, as a slow client's would.
    stream_.expires_after(idle_ && served_ > 0 ? core_->options.idle_timeout
                                               : core_->options.client_timeout);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    idle_ = false;
    if (ec) return on_read_error(ec);
    started_ = SteadyClock::now();
    stream_.expires_after(core_->options.client_timeout);
    // The header as it is now is the request's: a chunked body's trailer, which the parser
    // would merge into it, never counts (a second Host, an Authorization, a key in it).
    head_ = parser_->get().base();
    auto id = head_.find(kRequestIdHeader);
    std::optional<std::string> given =
        id == head_.end() ? std::nullopt : usable_request_id(id->value());
    client_.request_id = given ? std::move(*given) : new_request_id();
    // RFC 9112 §3.2: an HTTP/1.1 request has exactly one Host line; two could send a virtual
    // host's record to another, or confuse the upstream about which host was asked.
    const std::size_t hosts = head_.count(http::field::host);
    if (hosts > 1 || (hosts == 0 && head_.version() >= 11)) {
      outcome_ = "refused";
      return answer_and_close(refusal(400, "bad-request",
                                      hosts > 1 ? "the request has more than one Host header"
                                                : "the request has no Host header"));
    }

    const std::string_view target = head_.target();
    policy_ = &policy_for(core_->options, target.substr(0, target.find('?')));
    const auto& methods = policy_->methods;
    const bool keyed_method = policy_->protect && std::find(methods.begin(), methods.end(),
                                                            head_.method_string()) != methods.end();
    if (!keyed_method) return stream_request();
    KeyHeader key = read_key(head_, core_->options.key_header, policy_->key_format);
    switch (key.kind) {
      case KeyHeader::Kind::kAbsent:
        if (!policy_->require_key) return stream_request();
        outcome_ = "refused";
        return refuse_before_body(refusal(400, "missing-key",
                                          "this endpoint requires an idempotency key header (" +
                                              core_->options.key_header + ")"));
      case KeyHeader::Kind::kMalformed:
        outcome_ = "refused";
        return refuse_before_body(refusal(400, "bad-key", key.why));
      case KeyHeader::Kind::kValid:
        break;
    }
    key_ = std::move(key.key);
    keyed_ = true;
    // A keyed request is read whole, within max_request_body: its body joins the fingerprint.
    if (auto length = parser_->content_length();
        length && *length > core_->options.max_request_body) {
      return refuse_body_too_large();
    }
    parser_->body_limit(core_->options.max_request_body);
    continue_then([self = shared_from_this()] { self->read_whole_body(); });
  }

  // Answers Expect: 100-continue (RFC 9110 §10.1.1), then goes on.
  template <typename F>
  void continue_then(F&& next) {
    if (!beast::iequals(head_[http::field::expect], "100-continue") || parser_->is_done()) {
      return next();
    }
    auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_,
                                                                   head_.version());
    http::async_write(stream_, *cont,
                      [self = shared_from_this(), cont, next = std::forward<F>(next)](
                          beast::error_code ec, std::size_t) mutable {
                        if (ec) return self->close();
                        next();
                      });
  }

  // Reads some of the request body into in_; `then(size, last)`.
  template <typename F>
  void read_body_piece(F&& then) {
    if (parser_->is_done()) return then(std::size_t{0}, true);
    if (!in_) in_.reset(new char[kPieceBytes]);
    auto& body = parser_->get().body();
    body.data = in_.get();
    body.size = kPieceBytes;
    stream_.expires_after(core_->options.client_timeout);
    http::async_read_some(stream_, buffer_, *parser_,
                          [self = shared_from_this(), then = std::forward<F>(then)](
                              beast::error_code ec, std::size_t) mutable {
                            if (ec == http::error::need_buffer) ec = {};
                            if (ec) return self->on_read_error(ec);
                            const std::size_t got = kPieceBytes - self->parser_->get().body().size;
                            const bool last = self->parser_->is_done();
                            if (got == 0 && !last) return self->read_body_piece(std::move(then));
                            then(got, last);
                          });
  }

  void read_whole_body() {
    read_body_piece([self = shared_from_this()](std::size_t got, bool last) {
      self->body_.append(self->in_.get(), got);
      if (!last) return self->read_whole_body();
      self->handle_keyed();
    });
  }

  // A refusal decided from the header alone: the body is read and dropped first so the
  // connection stays usable, unless it is too large (or the client waits for a 100).
  void refuse_before_body(Response res) {
    const auto length = parser_->content_length();
    if (beast::iequals(head_[http::field::expect], "100-continue") ||
        (length && *length > core_->options.max_request_body)) {
      return answer_and_close(std::move(res));
    }
    parser_->body_limit(core_->options.max_request_body);
    drop_body(std::make_shared<Response>(std::move(res)));
  }

  void drop_body(std::shared_ptr<Response> res) {
    read_body_piece([self = shared_from_this(), res](std::size_t, bool last) {
      if (!last) return self->drop_body(res);
      self->answer(std::move(*res));
    });
  }

  void on_read_error(beast::error_code ec) {
    if (exchange_) {
      // The client went away (or stalled) while its body streamed to the upstream.
      outcome_ = "client-gone";
      log_request(0);
      exchange_->cancel();
      exchange_.reset();
      return close();
    }
    if (ec == http::error::body_limit) return refuse_body_too_large();
    if (ec == http::error::header_limit) {
      outcome_ = "refused";
      return answer_and_close(refusal(431, "header-too-large",
                                      "the request's header is larger than this proxy accepts"));
    }
    // A client that went away, an idle connection timing out or shutting down, or a read
    // cut short: nothing to answer.
    if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted ||
        ec == beast::error::timeout || ec == asio::error::connection_reset ||
        ec == http::error::partial_message || ec == asio::error::eof) {
      return close();
    }
    outcome_ = "refused";
    log_detail("bad request: " + ec.message());
    answer_and_close(refusal(400, "bad-request", "the request is not valid HTTP/1.1"));
  }

  void refuse_body_too_large() {
    outcome_ = "refused";
    answer_and_close(refusal(413, "body-too-large",
                             "the request body is larger than this proxy accepts for a request "
                             "with an idempotency key"));
  }

  // ---- a request without a key: streamed both ways ----

  void stream_request() {
    keyed_ = false;
    const bool has_body = !parser_->is_done();
    const bool repeatable = idempotent_method(head_.method()) && !has_body;
    exchange_ = std::make_shared<Exchange>(core_, stream_.get_executor(),
                                           upstream_header(head_, client_), repeatable);
    exchange_->set_label(client_.request_id);
    forwarded_at_ = SteadyClock::now();
    if (!has_body) {
      return exchange_->send(std::string(),
                             [self = shared_from_this()](Exchange::Status s) { self->on_head(s); });
    }
    continue_then([self = shared_from_this()] {
      const auto length = self->parser_->content_length();
      self->exchange_->open(length ? std::optional<std::uint64_t>(*length) : std::nullopt,
                            [self](Exchange::Status s) {
                              if (!s.ok()) return self->on_upstream_failed(s);
                              self->pump();
                            });
    });
  }

  // Passes the next piece of the request body to the upstream.
  void pump() {
    read_body_piece([self = shared_from_this()](std::size_t got, bool last) {
      self->exchange_->send_piece(self->in_.get(), got, last, [self, last](Exchange::Status s) {
        if (!last || !s.ok()) {
          if (!s.ok()) return self->on_upstream_failed(s);
          return self->pump();
        }
        self->on_head(s);
      });
    });
  }

  // ---- a request with a key: the executor, on the store pool ----

  void handle_keyed() {
    scope_ = scope_of(head_, core_->options, *policy_);
    fingerprint_ = fingerprint_of(head_, body_, core_->options);
    waited_ = false;
    begin();
  }

  // Comes back to the connection's strand after a store call.
  template <typename F>
  void back(F&& f) {
    if (core_->options.store_threads == 0) return f();
    asio::post(stream_.get_executor(), std::forward<F>(f));
  }

  // --wait: a busy key is waited for by the executor (begin_async), which answers on its
  // own thread once the owner finishes or the wait runs out; abort() cancels the wait.
  void begin() {
    CallOptions call{.ttl = policy_->ttl, .fingerprint = fingerprint_};
    if (core_->options.wait > Duration::zero()) {
      call.wait = WaitPolicy{
          .max_wait = core_->options.wait, .initial_backoff = kFirstPoll, .max_backoff = kMaxPoll};
      call.stop_token = stop_waiting_.get_token();
    }
    core_->on_store([self = shared_from_this(), call = std::move(call)] {
      BeginOutcome out;
      const auto start = SteadyClock::now();
      bool waiting = false;
      catch_begin(out, [&] {
        std::optional<BeginResult<>> now = self->core_->executor.begin_async(
            self->scope_, self->key_, call, [self](BeginAnswer answer) {
              BeginOutcome later;
              catch_begin(later, [&] { later.result.emplace(std::move(answer).get()); });
              asio::post(self->stream_.get_executor(), [self, later = std::move(later)]() mutable {
                self->waited_ = true;
                self->on_begun(std::move(later));
              });
            });
        if (now) {
          out.result.emplace(std::move(*now));
        } else {
          waiting = true;
        }
      });
      if (waiting) return;
      out.took = SteadyClock::now() - start;
      self->back([self, out = std::move(out)]() mutable { self->on_begun(std::move(out)); });
    });
  }

  void on_begun(BeginOutcome out) {
    store_time_ += out.took;
    if (!out.result) {
      outcome_ = out.code;
      if (!out.detail.empty()) log_detail(out.detail);
      Response res = refusal(out.status, out.code, out.text);
      if (out.status == 503) res.set(http::field::retry_after, "1");
      return answer(std::move(res));
    }
    BeginResult<>& begun = *out.result;
    if (Result<std::string>* replay = begun.replay()) return on_replay(replay->value);
    if (const Busy* busy = begun.busy()) return on_busy(*busy);
    handle_ = std::move(*begun.handle());
    if (aborted_) {
      // Nothing was forwarded: the key goes free.
      return core_->on_store([self = shared_from_this()] {
        self->handle_.release();
        self->back([self] {
          self->outcome_ = "cancelled";
          self->answer(self->shutting_down());
        });
      });
    }
    forward_keyed();
  }

  void on_replay(const std::string& bytes) {
    std::string why;
    std::optional<RecordedResponse> recorded = decode_record(bytes, &why);
    if (!recorded) {
      outcome_ = "foreign-record";
      log_detail("the record under this key cannot be replayed: " + why);
      return answer(refusal(500, "foreign-record",
                            "the record under this idempotency key was not written by this "
                            "proxy; it cannot be replayed"));
    }
    if (sets_cookie(*recorded) && !has_credentials(head_, core_->options)) {
      // SPEC §13: an answer that sets a cookie goes only to a request whose scope holds
      // credentials; otherwise anyone who sends the key would get the session it sets.
      outcome_ = "cookie-not-replayed";
      return answer(refusal(410, "cookie-not-replayed",
                            "the recorded answer to this idempotency key sets a cookie, and this "
                            "request carries no credentials the proxy can check, so it is not "
                            "replayed; do not send the request again"));
    }
    if (recorded->body_omitted) {
      // SPEC §13: the request ran; its answer was too large to keep. Never run it again.
      outcome_ = "too-large-to-replay";
      return answer(
          refusal(410, "too-large-to-replay",
                  "the request with this idempotency key ran, but its answer was too "
                  "large to record, so it cannot be replayed; do not send it again",
                  {{"recorded_status", recorded->status}, {"recorded_size", recorded->body_size}}));
    }
    outcome_ = "replayed";
    answer(from_record(*recorded, /*replayed=*/true));
  }

  void on_busy(const Busy& busy) {
    if (waited_ && aborted_) {
      // The drain ran out of time while this duplicate waited.
      outcome_ = "cancelled";
      return answer(shutting_down());
    }
    outcome_ = "in-progress";
    Response res = refusal(409, "in-progress",
                           "a request with this idempotency key is in progress; retry after the "
                           "time in Retry-After");
    // What the proxy observes, not the lease's time left: a lease outlasts a short request
    // by far. A key whose lease was abandoned frees up only when the lease runs out.
    res.set(http::field::retry_after,
            retry_after(core_->retry_after_for(scope_, key_, busy.lease_remaining)));
    answer(std::move(res));
  }

  void forward_keyed() {
    if (handle_.stolen()) core_->forget_held(scope_, key_);
    RequestHeader head = upstream_header(head_, client_);
    add_fencing(head, handle_.token(), handle_.number(), handle_.stolen());
    exchange_ = std::make_shared<Exchange>(core_, stream_.get_executor(), std::move(head),
                                           /*repeatable=*/false);
    exchange_->set_label(client_.request_id);
    exchange_->hold(std::move(handle_), *policy_);
    forwarded_at_ = SteadyClock::now();
    exchange_->send(std::move(body_),
                    [self = shared_from_this()](Exchange::Status s) { self->on_head(s); });
  }

  // ---- the answer, streamed ----

  void on_head(const Exchange::Status& s) {
    if (!s.ok()) return on_upstream_failed(s);
    upstream_time_ = SteadyClock::now() - forwarded_at_;
    out_ = {};
    out_.base() = exchange_->head();
    prepare_streamed(out_, head_, core_->draining || aborted_);
    if (keyed_ && exchange_->too_large()) out_.set(kNotRecordedHeader, "too-large");
    writer_.reset();
    header_sent_ = false;
    relay();
  }

  void relay() {
    exchange_->read_piece([self = shared_from_this()](Exchange::Status s, std::string_view piece,
                                                      bool last) {
      if (!s.ok()) return self->on_upstream_failed(s);
      if (!last) {
        return self->write_piece(piece, /*more=*/true, [self] { self->relay(); });
      }
      if (!self->keyed_ || !self->exchange_->keyed()) {
        self->outcome_ = "passed";
        return self->finish_answer(piece);
      }
      // SPEC §13: the end of the answer goes out once it is recorded, so a client that saw it
      // whole finds the record when it sends the key again.
      self->exchange_->settle([self, piece](std::string outcome) {
        self->core_->observe(SteadyClock::now() - self->forwarded_at_);
        if (!self->header_sent_ && outcome != "recorded" && outcome != "released") {
          self->out_.set(kNotRecordedHeader, outcome == "store-too-large" ? "too-large" : outcome);
        }
        if (outcome != "recorded" && outcome != "released" && outcome != "too-large") {
          self->log_detail("the answer was not recorded: " + outcome);
        }
        self->outcome_ = std::move(outcome);
        self->finish_answer(piece);
      });
    });
  }

  void finish_answer(std::string_view piece) {
    if (out_.result_int() != 0 && !warned_cookie_checked_ && keyed_) warn_about_cookies();
    if (exchange_) store_time_ += exchange_->store_time();
    bytes_out_ += piece.size();
    log_request(out_.result_int());
    write_piece(piece, /*more=*/false, [self = shared_from_this()] {
      self->exchange_.reset();
      self->next_request(self->out_.keep_alive());
    });
  }

  void warn_about_cookies() {
    warned_cookie_checked_ = true;
    if (out_.count(http::field::set_cookie) != 0 && !has_credentials(head_, core_->options) &&
        !core_->warned_cookie.exchange(true)) {
      core_->logger.warn(
          "the answer sets a cookie, and the request carries no credentials in its scope (no "
          "Authorization header, no --credential-cookie); its duplicates get 410 "
          "cookie-not-replayed. Name the session cookie with --credential-cookie",
          {{"request_id", client_.request_id}});
    }
  }

  // Writes a piece of the answer (its header first, the first time); `next` runs once it is
  // out. A client that went away ends the connection; a keyed answer is then read to its end
  // alone, so the record is there for the client's retry.
  template <typename F>
  void write_piece(std::string_view piece, bool more, F&& next) {
    auto& body = out_.body();
    body.data = piece.empty() ? nullptr : const_cast<char*>(piece.data());
    body.size = piece.size();
    body.more = more;
    if (!writer_) writer_.emplace(out_);
    if (more) bytes_out_ += piece.size();
    writing_ = true;
    stream_.expires_after(core_->options.client_timeout);
    http::async_write(stream_, *writer_,
                      [self = shared_from_this(), next = std::forward<F>(next)](
                          beast::error_code ec, std::size_t) mutable {
                        self->writing_ = false;
                        self->header_sent_ = true;
                        if (ec == http::error::need_buffer) ec = {};
                        if (ec) return self->client_gone();
                        next();
                      });
  }

  void client_gone() {
    if (!logged_) {
      outcome_ = "client-gone";
      log_request(out_.result_int());
    }
    if (exchange_) {
      if (exchange_->keyed() && !exchange_->done()) {
        exchange_->finish_alone();
      } else if (!exchange_->done()) {
        exchange_->cancel();
      }
      exchange_.reset();
    }
    close();
  }

  // The problem answer for an upstream exchange that failed (docs/proxy.md, "Every answer").
  struct Failed {
    unsigned status;
    const char* code;
    const char* text;
  };

  static Failed failed_answer(Exchange::Failure failure) {
    using Failure = Exchange::Failure;
    switch (failure) {
      case Failure::kTimeout:
        return {504, "upstream-timeout", "the upstream did not answer in time"};
      case Failure::kCancelled:
        return {503, "shutting-down",
                "the proxy is shutting down and could not finish this request in time"};
      case Failure::kConnect:
        return {502, "upstream-unreachable", "the proxy cannot connect to the upstream"};
      case Failure::kTooLarge:
        return {502, "upstream-too-large",
                "the upstream's answer is larger than this proxy passes"};
      case Failure::kBadResponse:
        return {502, "upstream-bad-response", "the upstream's answer is not valid HTTP/1.1"};
      case Failure::kBroken:
      case Failure::kNone:
        break;
    }
    return {502, "upstream-broken",
            "the connection to the upstream broke before the whole answer arrived"};
  }

  void on_upstream_failed(const Exchange::Status& s) {
    log_detail(s.detail);
    const bool keyed = keyed_ && exchange_ && exchange_->keyed() && !s.detached;
    // The record of a keyed request: an answer too large to pass ran, and is recorded as a
    // marker; any other failure releases only if nothing can have run (Exchange::give_up).
    auto settle_then = [&](auto next) {
      if (s.failure == Exchange::Failure::kTooLarge) return exchange_->settle_as_marker(next);
      exchange_->give_up(s, next);
    };
    if (header_sent_) {
      // Part of the answer is out: all the client can be told is that it was cut off.
      outcome_ = "cut-off";
      log_request(out_.result_int());
      if (!keyed) {
        exchange_.reset();
        return close();
      }
      return settle_then([self = shared_from_this()](std::string) {
        self->exchange_.reset();
        self->close();
      });
    }
    const Failed f = failed_answer(s.failure);
    Response res = refusal(f.status, f.code, f.text);
    if (!keyed) {
      // Nothing to settle: the request has no key, or (detached) the exchange reads the late
      // answer in the background and decides the record alone.
      outcome_ = s.detached ? "held" : f.code;
      exchange_.reset();
      // An upload cut short leaves the client's body half read: the connection closes.
      const bool mid_body = parser_ && !parser_->is_done();
      return mid_body ? answer_and_close(std::move(res)) : answer(std::move(res));
    }
    settle_then([self = shared_from_this(), res = std::move(res)](std::string outcome) mutable {
      self->outcome_ = outcome.empty() ? "error" : std::move(outcome);
      self->answer(std::move(res));
      self->exchange_.reset();
    });
  }

  Response shutting_down() {
    const Failed f = failed_answer(Exchange::Failure::kCancelled);
    return refusal(f.status, f.code, f.text);
  }

  // ---- the proxy's own answers ----

  // A problem answer naming this request (messages.h: fixed texts only).
  Response refusal(unsigned status, std::string_view code, std::string_view text,
                   std::vector<std::pair<std::string_view, std::uint64_t>> extra = {}) {
    return problem(
        status, code, text,
        ProblemContext{client_.request_id, core_->options.problem_type_base, std::move(extra)});
  }

  void log_detail(const std::string& detail) {
    if (detail.empty()) return;
    core_->logger.error(detail, {{"request_id", client_.request_id}});
  }

  void answer(Response res) {
    res_ = std::move(res);
    prepare_for_client(res_, head_, core_->draining || aborted_);
    bytes_out_ = res_.body().size();
    if (exchange_) store_time_ += exchange_->store_time();
    log_request(res_.result_int());
    write_own();
  }

  // For errors found before a whole request was read: the connection cannot be trusted to
  // be at a message boundary, so it closes after the answer.
  void answer_and_close(Response res) {
    if (parser_ && parser_->is_header_done()) {
      head_ = parser_->get().base();
    } else {
      head_ = {};
      head_.version(11);
    }
    res_ = std::move(res);
    prepare_for_client(res_, head_, true);
    bytes_out_ = res_.body().size();
    log_request(res_.result_int());
    write_own();
  }

  void write_own() {
    writing_ = true;
    stream_.expires_after(core_->options.client_timeout);
    http::async_write(stream_, res_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        self->writing_ = false;
                        if (ec) return self->close();
                        self->next_request(self->res_.keep_alive());
                      });
  }

  void next_request(bool keep_alive) {
    if (!keep_alive) return close();
    ++served_;
    res_ = {};
    out_ = {};
    writer_.reset();
    body_.clear();
    keyed_ = false;
    key_.clear();
    outcome_.clear();
    header_sent_ = false;
    warned_cookie_checked_ = false;
    logged_ = false;
    store_time_ = {};
    upstream_time_.reset();
    bytes_out_ = 0;
    read_request();
  }

  // The request is answered (or ended): counted, and one line in the access log.
  void log_request(unsigned status) {
    if (logged_) return;
    logged_ = true;
    const std::string outcome = outcome_.empty() ? "answered" : outcome_;
    core_->metrics.count(outcome);
    if (!core_->options.access_log) return;
    auto ms = [](SteadyClock::duration d) {
      return millis(std::chrono::duration<double, std::milli>(d).count());
    };
    std::vector<Field> fields = {{"request_id", client_.request_id},
                                 {"client", client_.address + ":" + std::to_string(client_.port)},
                                 {"method", std::string(head_.method_string())},
                                 {"target", std::string(head_.target())},
                                 {"status", std::to_string(status), true},
                                 {"outcome", outcome}};
    if (keyed_ && !key_.empty()) fields.push_back({"key", key_});
    if (upstream_time_) fields.push_back({"upstream_ms", ms(*upstream_time_), true});
    if (keyed_) fields.push_back({"store_ms", ms(store_time_), true});
    fields.push_back({"total_ms", ms(SteadyClock::now() - started_), true});
    fields.push_back({"bytes", std::to_string(bytes_out_), true});
    core_->logger.info("request", fields);
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.socket().close(ignored);
  }

  std::shared_ptr<Core> core_;
  std::uint64_t id_ = 0;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::buffer_body>> parser_;
  RequestHeader head_;
  std::string body_;
  std::unique_ptr<char[]> in_;
  Response res_;
  StreamedResponse out_;
  std::optional<http::response_serializer<http::buffer_body>> writer_;
  ClientInfo client_;

  // The request in flight.
  SteadyClock::time_point started_{};
  const Policy* policy_ = nullptr;
  std::string key_;
  std::string scope_;
  std::string fingerprint_;
  bool keyed_ = false;
  AttemptHandle<> handle_;
  std::shared_ptr<Exchange> exchange_;
  SteadyClock::time_point forwarded_at_{};
  // Whether the answer came after a wait (--wait), which abort() cancels through
  // stop_waiting_.
  bool waited_ = false;
  std::stop_source stop_waiting_;
  std::string outcome_;
  bool header_sent_ = false;
  bool warned_cookie_checked_ = false;
  bool logged_ = false;
  SteadyClock::duration store_time_{};
  std::optional<SteadyClock::duration> upstream_time_;
  std::uint64_t bytes_out_ = 0;

  // Requests answered on this connection.
  std::uint64_t served_ = 0;
  // Waiting for the next request with nothing read yet (a drain may close it).
  bool idle_ = false;
  bool writing_ = false;
  bool aborted_ = false;
};

void start_session(std::shared_ptr<Server::Core> core, tcp::socket socket) {
  // The session's owner is this very Core (shared), kept alive by every session.
  auto session = std::make_shared<Session>(core, std::move(socket));
  session->start(core->remember(session, /*connection=*/true));
}

}  // namespace idem::proxy
