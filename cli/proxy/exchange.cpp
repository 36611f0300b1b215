#include "exchange.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <limits>

#include "idem/error.h"

namespace idem::proxy {

namespace {

// Upstream answers may carry more header than clients usually send.
constexpr std::uint32_t kResponseHeaderLimit = 64 * 1024;
// The most of an answer's body read at once.
constexpr std::size_t kPieceBytes = 64 * 1024;

bool is_parse_error(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_version).category() &&
         ec != http::error::end_of_stream && ec != http::error::partial_message;
}

}  // namespace

Exchange::Exchange(std::shared_ptr<Core> core, asio::any_io_executor strand, RequestHeader head,
                   bool repeatable)
    : core_(std::move(core)),
      strand_(std::move(strand)),
      timer_(strand_),
      head_(std::move(head)),
      repeatable_(repeatable),
      piece_(new char[kPieceBytes]) {}

Exchange::~Exchange() {
  if (conn_) core_->upstream->give_back(std::move(conn_), false);
  // Whatever path dropped the exchange, the rule holds: only a request that never reached
  // the upstream releases its key (SPEC §13).
  if (handle_.active()) {
    if (wrote_) {
      handle_.abandon();
    } else {
      handle_.release();
    }
  }
}

void Exchange::hold(AttemptHandle<> handle, const Policy& policy) {
  handle_ = std::move(handle);
  policy_ = &policy;
}

// ---- sending ----

void Exchange::send(std::string body, Done done) {
  on_done_ = std::move(done);
  body_ = std::move(body);
  started_ = SteadyClock::now();
  arm(started_ + core_->options.upstream_timeout);
  queue();
}

void Exchange::queue() {
  phase_ = Phase::kQueued;
  waiter_ = core_->upstream->acquire(strand_,
                                     [self = shared_from_this()](std::unique_ptr<Connection> conn) {
                                       self->on_connection(std::move(conn));
                                     });
}

void Exchange::retry_on_a_fresh_connection() {
  retried_ = true;
  wrote_ = false;
  release_connection(false);
  queue();
}

void Exchange::fail_io(const beast::error_code& ec, const char* late, const char* broken) {
  if (cancelled_) return fail(Failure::kCancelled, "the exchange was cancelled");
  if (timed_out_) return fail(Failure::kTimeout, late);
  if (ec == http::error::body_limit) {
    return fail(Failure::kTooLarge, "the upstream's answer is larger than --max-response-body");
  }
  if (is_parse_error(ec)) {
    return fail(Failure::kBadResponse,
                "the upstream's answer is not valid HTTP/1.1: " + ec.message());
  }
  fail(Failure::kBroken, std::string(broken) + ": " + ec.message());
}

void Exchange::open(std::optional<std::uint64_t> length, Done done) {
  streamed_ = length;
  send(std::string(), std::move(done));
}

void Exchange::send_piece(const char* data, std::size_t size, bool last, Done done) {
  on_done_ = std::move(done);
  phase_ = Phase::kWriting;
  arm(SteadyClock::now() + core_->options.upstream_timeout);
  auto& body = request_->body();
  body.data = size == 0 ? nullptr : const_cast<char*>(data);
  body.size = size;
  body.more = !last;
  http::async_write(conn_->socket, *writer_,
                    asio::bind_executor(strand_, [self = shared_from_this(), last](
                                                     beast::error_code ec, std::size_t n) {
                      if (ec == http::error::need_buffer) ec = {};
                      if (n > 0) self->wrote_ = true;
                      if (ec) {
                        return self->fail_io(
                            ec, "the upstream did not take the request body in time",
                            "the upstream connection broke while the request body was written");
                      }
                      if (!last) {
                        self->disarm();
                        return self->deliver(Status{});
                      }
                      // The answer's header is due within upstream_timeout of the last piece.
                      self->arm(SteadyClock::now() + self->core_->options.upstream_timeout);
                      self->start_read_head();
                    }));
}

void Exchange::on_connection(std::unique_ptr<Connection> conn) {
  waiter_.reset();
  if (phase_ != Phase::kQueued || cancelled_ || timed_out_) {
    // A timeout or a cancel came first: the connection goes back unused.
    const bool connected = conn->connected;
    core_->upstream->give_back(std::move(conn), connected);
    if (phase_ != Phase::kQueued) return;
    if (cancelled_) return fail(Failure::kCancelled, "the exchange was cancelled");
    return fail(Failure::kTimeout, "no upstream connection was free in time");
  }
  conn_ = std::move(conn);
  reused_ = conn_->connected;
  if (reused_) return write();
  connect();
}

void Exchange::connect() {
  phase_ = Phase::kConnecting;
  arm(std::min(started_ + core_->options.upstream_timeout,
               SteadyClock::now() + core_->options.connect_timeout));
  asio::async_connect(
      conn_->socket, core_->upstream->endpoints(),
      asio::bind_executor(
          strand_, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
            if (ec) {
              if (self->cancelled_) {
                return self->fail(Failure::kCancelled, "the exchange was cancelled");
              }
              return self->fail(Failure::kConnect,
                                self->timed_out_
                                    ? "connecting to the upstream timed out"
                                    : "could not connect to the upstream: " + ec.message());
            }
            self->conn_->connected = true;
            beast::error_code ignored;
            self->conn_->socket.set_option(tcp::no_delay(true), ignored);
            self->arm(self->started_ + self->core_->options.upstream_timeout);
            self->write();
          }));
}

void Exchange::write() {
  phase_ = Phase::kWriting;
  request_.emplace(head_);
  if (streamed_) {
    // The header now; the body as it comes.
    if (*streamed_) {
      request_->content_length(**streamed_);
    } else {
      request_->chunked(true);
    }
    request_->body().data = nullptr;
    request_->body().size = 0;
    request_->body().more = true;
  } else {
    const bool has_body = !body_.empty() || head_.method() == http::verb::post ||
                          head_.method() == http::verb::put || head_.method() == http::verb::patch;
    if (has_body) request_->content_length(body_.size());
    request_->body().data = body_.empty() ? nullptr : body_.data();
    request_->body().size = body_.size();
    request_->body().more = false;
  }
  writer_.emplace(*request_);
  http::async_write(conn_->socket, *writer_,
                    asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec,
                                                                             std::size_t n) {
                      if (ec == http::error::need_buffer) ec = {};
                      if (n > 0) self->wrote_ = true;
                      if (!ec && self->streamed_) {
                        // The header went out; the session sends the body.
                        self->disarm();
                        return self->deliver(Status{});
                      }
                      if (!ec) return self->start_read_head();
                      // Not a byte went out on a kept-alive connection the upstream had
                      // closed: nothing can have run, so it goes again on a fresh one.
                      if (!self->cancelled_ && !self->timed_out_ && self->reused_ &&
                          !self->wrote_ && !self->retried_) {
                        return self->retry_on_a_fresh_connection();
                      }
                      self->fail_io(ec, "writing the request timed out",
                                    "the upstream connection broke while the request was written");
                    }));
}

// ---- reading ----

void Exchange::start_read_head() {
  phase_ = Phase::kHeader;
  parser_.emplace();
  parser_->header_limit(kResponseHeaderLimit);
  // No limit is the largest one: Boost 1.74 compares a Content-Length with an unset limit
  // as larger than it, so boost::none refuses every body.
  parser_->body_limit(core_->options.max_response_body != 0
                          ? std::uint64_t{core_->options.max_response_body}
                          : std::numeric_limits<std::uint64_t>::max());
  if (head_.method() == http::verb::head) parser_->skip(true);
  http::async_read_header(
      conn_->socket, conn_->buffer, *parser_,
      asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
        if (ec) {
          // A kept-alive connection the upstream closed just before our request arrived:
          // nothing was answered, so a request that may be repeated goes again on a fresh
          // connection. A keyed request never does (it may have run).
          if (!self->cancelled_ && !self->timed_out_ && self->reused_ &&
              !self->parser_->got_some() && self->repeatable_ && !self->retried_) {
            return self->retry_on_a_fresh_connection();
          }
          // Its Content-Length over --max-response-body: the header says what ran, and a
          // keyed request's record keeps it (settle_as_marker).
          if (ec == http::error::body_limit && self->parser_->is_header_done() &&
              self->handle_.active()) {
            self->begin_recording();
          }
          return self->fail_io(ec, "the upstream did not answer in time",
                               "the upstream connection broke before the answer arrived");
        }
        const unsigned status = self->parser_->get().result_int();
        // An interim answer (103 Early Hints, a stray 100): the real one follows.
        if (status >= 100 && status < 200 && status != 101) return self->start_read_head();
        self->disarm();
        self->core_->metrics.upstream.observe(SteadyClock::now() - self->started_);
        self->phase_ = Phase::kBody;
        if (self->handle_.active()) self->begin_recording();
        if (self->detached_) return self->start_read_piece();
        self->deliver(Status{});
      }));
}

void Exchange::read_piece(PieceDone done) {
  on_piece_ = std::move(done);
  start_read_piece();
}

void Exchange::start_read_piece() {
  if (parser_->is_done()) {
    // Nothing more to read (no body, or it ended with the last piece).
    return asio::post(strand_, [self = shared_from_this()] {
      self->phase_ = Phase::kDone;
      self->release_connection(self->parser_->keep_alive());
      if (self->detached_) return self->background_piece(Status{}, true);
      self->deliver(Status{}, {}, true);
    });
  }
  phase_ = Phase::kBody;
  arm(SteadyClock::now() + core_->options.upstream_timeout);
  auto& body = parser_->get().body();
  body.data = piece_.get();
  body.size = kPieceBytes;
  http::async_read_some(
      conn_->socket, conn_->buffer, *parser_,
      asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
        if (ec == http::error::need_buffer) ec = {};
        if (ec) {
          return self->fail_io(ec, "the upstream's answer stalled",
                               "the upstream connection broke before the whole answer arrived");
        }
        self->disarm();
        const std::size_t got = kPieceBytes - self->parser_->get().body().size;
        const bool last = self->parser_->is_done();
        if (got == 0 && !last) return self->start_read_piece();
        const std::string_view piece(self->piece_.get(), got);
        self->body_size_ += got;
        self->keep(piece);
        if (last) {
          self->phase_ = Phase::kDone;
          self->release_connection(self->parser_->keep_alive());
        }
        if (self->detached_) return self->background_piece(Status{}, last);
        self->deliver(Status{}, piece, last);
      }));
}

void Exchange::deliver(Status status, std::string_view piece, bool last) {
  if (on_done_) {
    Done done = std::move(on_done_);
    on_done_ = nullptr;
    return done(std::move(status));
  }
  if (on_piece_) {
    PieceDone done = std::move(on_piece_);
    on_piece_ = nullptr;
    done(std::move(status), piece, last);
  }
}

void Exchange::fail(Failure failure, std::string detail) {
  phase_ = Phase::kDone;
  disarm();
  release_connection(false);
  if (detached_) {
    // The late answer did not come whole: the outcome stays unknown.
    if (handle_.active()) {
      core_->note_held(handle_.scope(), handle_.key());
      handle_.abandon();
    }
    return end_background("held", "the late answer did not come whole: " + detail);
  }
  deliver(Status{failure, wrote_, false, std::move(detail)});
}

void Exchange::release_connection(bool reusable) {
  if (!conn_) return;
  core_->upstream->give_back(std::move(conn_), reusable);
}

// ---- timing ----

void Exchange::arm(SteadyClock::time_point deadline) {
  const std::uint64_t generation = ++timer_generation_;
  timer_.expires_at(deadline);
  timer_.async_wait([self = shared_from_this(), generation](beast::error_code ec) {
    if (ec || generation != self->timer_generation_) return;
    self->on_timer();
  });
}

void Exchange::disarm() {
  ++timer_generation_;
  timer_.cancel();
}

void Exchange::on_timer() {
  switch (phase_) {
    case Phase::kQueued:
      timed_out_ = true;
      if (core_->upstream->cancel(waiter_)) {
        waiter_.reset();
        fail(Failure::kTimeout, "no upstream connection was free in time");
      }
      // Otherwise the connection is on its way, and on_connection() sees the timeout.
      return;
    case Phase::kHeader:
    case Phase::kBody:
      if (!detached_ && can_detach()) return detach();
      [[fallthrough]];
    case Phase::kConnecting:
    case Phase::kWriting:
      // The pending operation ends with an error, and sees timed_out_.
      timed_out_ = true;
      if (conn_) conn_->close();
      return;
    case Phase::kIdle:
    case Phase::kDone:
      return;
  }
}

bool Exchange::can_detach() const {
  return handle_.active() && !policy_->release_uncertain &&
         core_->options.late_answer > Duration::zero() && wrote_;
}

void Exchange::detach() {
  detached_ = true;
  background_id_ = core_->remember(shared_from_this(), /*connection=*/false);
  arm(SteadyClock::now() + core_->options.late_answer);
  deliver(Status{Failure::kTimeout, true, true,
                 "the upstream did not answer within --upstream-timeout; reading its answer in "
                 "the background for up to --late-answer"});
}

// ---- the record ----

void Exchange::begin_recording() {
  record_ = to_record(head());
  recording_ = !releases(record_.status, *policy_);
  // An announced length already says whether the body fits in the record.
  if (auto length = parser_->content_length();
      recording_ && length && encoded_size(record_) + *length > policy_->max_record) {
    too_large_ = true;
  }
}

void Exchange::keep(std::string_view piece) {
  if (!recording_ || too_large_ || piece.empty()) return;
  if (encoded_size(record_) + piece.size() > policy_->max_record) {
    // SPEC §13: recorded as a marker; the body is not kept.
    too_large_ = true;
    record_.body.clear();
    record_.body.shrink_to_fit();
    return;
  }
  record_.body.append(piece);
}

namespace {

// Runs `f` on the exchange's strand after a store call (inline with --store-threads 0).
template <typename F>
void back_to(const Core& core, const asio::any_io_executor& strand, F&& f) {
  if (core.options.store_threads == 0) return f();
  asio::post(strand, std::forward<F>(f));
}

}  // namespace

void Exchange::settle(Settled done) {
  if (!handle_.active()) return done("error");
  if (!recording_) {
    // The status says the request did not run (SPEC §13): the retry runs it.
    return core_->on_store([self = shared_from_this(), done = std::move(done)]() mutable {
      const auto start = SteadyClock::now();
      self->handle_.release();
      self->store_time_ += SteadyClock::now() - start;
      back_to(*self->core_, self->strand_, [done = std::move(done)] { done("released"); });
    });
  }
  if (too_large_) {
    record_.body_omitted = true;
    record_.body_size = body_size_;
    record_.body.clear();
  }
  std::string bytes = encode_record(record_);
  core_->on_store(
      [self = shared_from_this(), bytes = std::move(bytes), done = std::move(done)]() mutable {
        std::string outcome = self->too_large_ ? "too-large" : "recorded";
        const auto start = SteadyClock::now();
        try {
          (void)self->handle_.complete(std::move(bytes));
        } catch (const PayloadTooLarge&) {
          outcome = "store-too-large";
        } catch (const LeaseLost&) {
          outcome = "lease-lost";
        } catch (const StoreUnavailable&) {
          outcome = "store-unavailable";
        } catch (const std::exception&) {
          outcome = "error";
        }
        self->store_time_ += SteadyClock::now() - start;
        back_to(*self->core_, self->strand_,
                [done = std::move(done), outcome = std::move(outcome)] { done(outcome); });
      });
}

void Exchange::finish_alone() {
  if (!handle_.active() || detached_) return;
  detached_ = true;
  on_done_ = nullptr;
  on_piece_ = nullptr;
  background_id_ = core_->remember(shared_from_this(), /*connection=*/false);
  // Between two pieces no read is pending: the next one starts here.
  if (phase_ == Phase::kBody) start_read_piece();
}

void Exchange::settle_as_marker(Settled done) {
  if (recording_) too_large_ = true;
  settle(std::move(done));
}

void Exchange::give_up(const Status& status, Settled done) {
  if (!handle_.active()) return done("");
  if (status.maybe_ran && !policy_->release_uncertain) {
    // SPEC §13: the upstream may have run it, or may be running it still. The key stays
    // held until the lease runs out; then the next attempt takes it over, marked stolen.
    core_->note_held(handle_.scope(), handle_.key());
    handle_.abandon();
    return done("held");
  }
  core_->on_store([self = shared_from_this(), done = std::move(done)]() mutable {
    const auto start = SteadyClock::now();
    self->handle_.release();
    self->store_time_ += SteadyClock::now() - start;
    back_to(*self->core_, self->strand_, [done = std::move(done)] { done("released"); });
  });
}

// ---- the background ----

void Exchange::background_piece(const Status&, bool last) {
  if (!last) return start_read_piece();
  disarm();
  settle([self = shared_from_this()](std::string outcome) {
    self->end_background(std::move(outcome), "the answer came whole");
  });
}

void Exchange::end_background(std::string outcome, const std::string& why) {
  disarm();
  if (background_id_ == 0) return;
  core_->logger.log(outcome == "held" ? Level::kWarn : Level::kInfo,
                    "read the answer on alone: " + why,
                    {{"request_id", label_}, {"record", outcome}});
  core_->forget(background_id_, /*connection=*/false);
  background_id_ = 0;
}

// ---- shutting down ----

void Exchange::cancel() {
  cancelled_ = true;
  switch (phase_) {
    case Phase::kQueued:
      if (core_->upstream->cancel(waiter_)) {
        waiter_.reset();
        fail(Failure::kCancelled, "the exchange was cancelled");
      }
      return;
    case Phase::kConnecting:
    case Phase::kWriting:
    case Phase::kHeader:
    case Phase::kBody:
      if (conn_) conn_->close();
      return;
    case Phase::kIdle:
    case Phase::kDone:
      return;
  }
}

void Exchange::abort() {
  asio::post(strand_, [self = shared_from_this()] { self->cancel(); });
}

void Exchange::abandon_unfinished() noexcept {
  if (!handle_.active()) return;
  if (wrote_) {
    handle_.abandon();
  } else {
    handle_.release();
  }
}

}  // namespace idem::proxy
