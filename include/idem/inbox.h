#pragma once

// An inbox for queue consumers (SPEC §14's one-transaction form): a message is processed at
// most once, however often it is delivered, because the record of its id commits in the
// same transaction as the handler's writes. A redelivered message finds the record and is
// skipped; a consumer that dies mid-message leaves nothing behind (its transaction rolls
// back) and the message is delivered again.
//
//   idem::Inbox inbox(exec, "payments");
//   BEGIN on conn; take a message (PostgreSQL: SELECT ... FOR UPDATE SKIP LOCKED)
//   bool fresh = inbox.process(conn, message_id, [&] { ...writes through conn... });
//   delete or acknowledge the message through conn; COMMIT
//
// examples/inbox.cpp consumes a real queue table this way on SQLite and PostgreSQL.

#include <string>
#include <string_view>
#include <utility>

#include "idem/executor.h"
#include "idem/transaction.h"

namespace idem {

class Inbox {
 public:
  // Records go under the scope "inbox:" + name, so two inboxes never see each other's ids.
  // `options` as Executor::run_in_open_transaction's: with no waiting policy (the default),
  // a message whose id another consumer's open transaction is processing right now throws
  // InProgress (roll back; the queue delivers it again) instead of waiting for it.
  Inbox(Executor& executor, std::string_view name, CallOptions options = {})
      : executor_(executor), scope_("inbox:" + std::string(name)), options_(std::move(options)) {}

  // Runs `handler()` (its writes through `conn`) unless message `id` was processed before,
  // inside the caller's open transaction on `conn`; returns whether it ran. The caller
  // commits, or rolls back when this throws (the handler's own exception goes through
  // unchanged; see Executor::run_in_open_transaction for the others).
  template <typename F>
  bool process(const SqlConnection& conn, std::string_view id, F&& handler) {
    const Result<void> r = executor_.run_in_open_transaction<void>(
        conn, scope_, id, [&](const Attempt&) { handler(); }, options_);
    return !r.replayed;
  }

  const std::string& scope() const noexcept { return scope_; }

 private:
  Executor& executor_;
  std::string scope_;
  CallOptions options_;
};

}  // namespace idem
