#pragma once

// One request's exchange with the upstream: a connection from the pool, the request
// written, the answer read header first and then piece by piece, on the strand of the
// client connection that asked for it. For a keyed request it also owns the lease
// (AttemptHandle) and decides what becomes of the record (SPEC §13):
//
//  - an answer read whole is recorded (complete), or released when its status says the
//    request did not run; an answer larger than the policy's max_record is recorded as a
//    marker;
//  - a failure that proves nothing ran (no connection, not a byte of the request written)
//    releases;
//  - an outcome the proxy cannot know (a timeout, a connection broken after the request was
//    written, a shutdown) never releases. After a timeout the exchange goes on reading the
//    answer in the background for up to --late-answer and records it if it comes; otherwise
//    the lease is abandoned (AttemptHandle::abandon), so the key stays held until the lease
//    runs out and the next attempt is a takeover (attempt 2, stolen). With the policy's
//    release_uncertain, such outcomes release instead (the old behaviour).
//
// Every method runs on the strand given to the constructor; each operation's handler is
// called there, once.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/serializer.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core.h"
#include "messages.h"
#include "record.h"

namespace idem::proxy {

class Exchange : public Drainable, public std::enable_shared_from_this<Exchange> {
 public:
  enum class Failure {
    kNone,
    kConnect,      // could not connect (refused, unreachable, connect timeout)
    kTimeout,      // no connection in time, or the answer did not come in time
    kBroken,       // the connection broke or closed before the whole answer arrived
    kTooLarge,     // the answer is larger than max_response_body
    kBadResponse,  // the upstream did not speak HTTP/1.1
    kCancelled,    // cancel(): the proxy is shutting down, or the client went away
  };
  struct Status {
    Failure failure = Failure::kNone;
    // Whether the upstream may have run the request: a byte of it was written.
    bool maybe_ran = false;
    // The exchange goes on in the background (a keyed request whose answer is late); its
    // client gets its answer now and the exchange decides the record alone.
    bool detached = false;
    // What went wrong, for the log (never for the client).
    std::string detail;
    bool ok() const { return failure == Failure::kNone; }
  };
  using Done = std::function<void(Status)>;
  using PieceDone = std::function<void(Status, std::string_view piece, bool last)>;
  // What became of a keyed request's record: "recorded", "released", "too-large" (recorded
  // as a marker), "held" (abandoned: the lease runs out), or why it was not recorded
  // ("lease-lost", "store-unavailable", "error").
  using Settled = std::function<void(std::string outcome)>;

  // `head`: the header to send upstream (upstream_header()). `repeatable`: the request may
  // be sent again on a fresh connection when a kept-alive one turns out closed before
  // answering a byte (an unkeyed request of an idempotent method with no body).
  Exchange(std::shared_ptr<Core> core, asio::any_io_executor strand, RequestHeader head,
           bool repeatable);
  ~Exchange() override;

  // A keyed request: the exchange owns its lease from now on.
  void hold(AttemptHandle<> handle, const Policy& policy);
  bool keyed() const { return handle_.active(); }

  // Names the exchange in the log (the request id).
  void set_label(std::string label) { label_ = std::move(label); }

  // Gets a connection (connecting a new one, or reusing a kept-alive one), writes the header
  // and the whole `body`, and reads the answer's header (interim 1xx answers skipped):
  // head() then holds it. The answer's header must come within upstream_timeout of send().
  void send(std::string body, Done done);
  // The same for a body that streams in from the client: open() gets a connection and writes
  // the header (`length`: the client's Content-Length; none: chunked); then send_piece() writes
  // each piece, the last one with `last`, after which the answer's header is read as for
  // send(). Each piece must be taken within upstream_timeout, and the answer's header come
  // within upstream_timeout of the last piece. `data` stays the caller's until `done`.
  void open(std::optional<std::uint64_t> length, Done done);
  void send_piece(const char* data, std::size_t size, bool last, Done done);
  const ResponseHeader& head() const { return parser_->get().base(); }
  // Whether the answer's body has been read to its end (or it has none).
  bool done() const { return parser_ && parser_->is_done(); }
  // Reads some of the body; `piece` stays valid until the next call. `last`: the body ended.
  void read_piece(PieceDone done);

  // Keyed: whether the answer will be recorded as a marker (its Content-Length says it is
  // too large already, or its body grew past the policy's max_record).
  bool too_large() const { return too_large_; }
  // How long this exchange's store calls took (settle, give_up).
  SteadyClock::duration store_time() const { return store_time_; }

  // Keyed, after the last piece: records the answer (or a marker), or releases the record
  // when its status says the request did not run.
  void settle(Settled done);
  // Keyed, the client went away while the answer streamed: the exchange reads the rest alone
  // (bounded by upstream_timeout between pieces) and decides the record, so the client's
  // retry finds it.
  void finish_alone();
  // Keyed, after a failure the session answered itself: releases when nothing can have run
  // (or the policy releases uncertain outcomes), else abandons the lease.
  void give_up(const Status& status, Settled done);
  // Keyed, the answer was refused before it was read whole (too large to pass): records a
  // marker of its status and headers.
  void settle_as_marker(Settled done);

  // Ends the exchange early: the connection is closed; an operation in flight ends with
  // kCancelled.
  void cancel();

  // Drainable: a background exchange finishes alone, or is cancelled when the drain runs out.
  void drain() override {}
  void abort() override;
  void abandon_unfinished() noexcept override;

 private:
  enum class Phase { kIdle, kQueued, kConnecting, kWriting, kHeader, kBody, kDone };

  void queue();
  void retry_on_a_fresh_connection();
  // An operation on the connection failed: cancelled, late, or why (`broken` then says
  // what was going on).
  void fail_io(const beast::error_code& ec, const char* late, const char* broken);
  void on_connection(std::unique_ptr<Connection> conn);
  void connect();
  void write();
  void start_read_head();
  void start_read_piece();
  void fail(Failure failure, std::string detail);
  void deliver(Status status, std::string_view piece = {}, bool last = false);
  void arm(SteadyClock::time_point deadline);
  void disarm();
  void on_timer();
  bool can_detach() const;
  void detach();
  void release_connection(bool reusable);
  // Keyed: the answer's status and headers are known; decide whether to record it.
  void begin_recording();
  void keep(std::string_view piece);
  void background_piece(const Status& status, bool last);
  void end_background(std::string outcome, const std::string& why);

  std::shared_ptr<Core> core_;
  asio::any_io_executor strand_;
  std::string label_;
  asio::steady_timer timer_;
  std::uint64_t timer_generation_ = 0;
  RequestHeader head_;
  std::string body_;
  // Streamed: the client's Content-Length, or none for chunked; unset for a whole body.
  std::optional<std::optional<std::uint64_t>> streamed_;
  const bool repeatable_;
  SteadyClock::time_point started_{};

  std::unique_ptr<Connection> conn_;
  std::shared_ptr<UpstreamPool::Waiter> waiter_;
  std::optional<boost::beast::http::request<boost::beast::http::buffer_body>> request_;
  std::optional<boost::beast::http::request_serializer<boost::beast::http::buffer_body>> writer_;
  std::optional<boost::beast::http::response_parser<boost::beast::http::buffer_body>> parser_;
  std::unique_ptr<char[]> piece_;

  Phase phase_ = Phase::kIdle;
  bool wrote_ = false;
  bool reused_ = false;
  bool retried_ = false;
  bool timed_out_ = false;
  bool cancelled_ = false;
  bool detached_ = false;
  std::uint64_t background_id_ = 0;
  Done on_done_;
  PieceDone on_piece_;

  // Keyed.
  AttemptHandle<> handle_;
  const Policy* policy_ = nullptr;
  bool recording_ = false;
  RecordedResponse record_;
  bool too_large_ = false;
  std::uint64_t body_size_ = 0;
  SteadyClock::duration store_time_{};
};

}  // namespace idem::proxy
