#include "idem/purger.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "idem/error.h"

namespace idem {
namespace {

void validate(const std::shared_ptr<Store>& store, const PurgerOptions& o) {
  if (!store) throw InvalidArgument("store", "must not be null");
  validate_duration("interval", o.interval);
  if (o.batch == 0) throw InvalidArgument("batch", "must be at least 1");
  if (o.max_batches_per_pass == 0) {
    throw InvalidArgument("max_batches_per_pass", "must be at least 1");
  }
}

}  // namespace

Purger::Purger(std::shared_ptr<Store> store, PurgerOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  validate(store_, options_);
  // Started last, once every member the thread touches exists.
  thread_ = std::jthread([this](std::stop_token stop) { loop(std::move(stop)); });
}

Purger::~Purger() {
  // The thread is stopped explicitly here (rather than by the jthread member's destructor)
  // so that it is gone before any other member is destroyed.
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

std::size_t Purger::run_once() {
  std::size_t total = 0;
  // SPEC §8: bounded batches, so one store call never holds acquisitions up for long.
  for (std::size_t i = 0; i < options_.max_batches_per_pass; ++i) {
    const std::size_t n = store_->purge(options_.batch);
    total += n;
    if (n < options_.batch) break;
  }
  return total;
}

std::size_t Purger::purged() const {
  std::lock_guard lock(mu_);
  return purged_;
}

void Purger::trigger() {
  {
    std::lock_guard lock(mu_);
    triggered_ = true;
  }
  cv_.notify_all();
}

void Purger::loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    // One pass, batch by batch, checking for a stop between store calls.
    for (std::size_t i = 0; i < options_.max_batches_per_pass && !stop.stop_requested(); ++i) {
      std::size_t n = 0;
      try {
        n = store_->purge(options_.batch);
      } catch (const std::exception& e) {
        // Errors go to the callback and the purger keeps going at the next interval.
        if (options_.on_error) {
          try {
            options_.on_error(e);
          } catch (...) {
          }
        }
        break;
      } catch (...) {
        if (options_.on_error) {
          try {
            options_.on_error(std::runtime_error("purge threw a non-standard exception"));
          } catch (...) {
          }
        }
        break;
      }
      {
        std::lock_guard lock(mu_);
        purged_ += n;
      }
      if (n < options_.batch) break;
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, stop, options_.interval, [this] { return triggered_; });
    triggered_ = false;
  }
}

}  // namespace idem
