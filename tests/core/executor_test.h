#pragma once

// What the executor's tests share (executor_test.cpp and the executor_*_test.cpp beside it):
// the fixtures, and the two forms every call runs in.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "idem/clock.h"
#include "idem/executor.h"
#include "idem/store_wrapper.h"
#include "idem/stores/memory_store.h"
#include "idem/testing/fault_store.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_fixtures.h"
#include "support/eventually.h"
#include "support/gate.h"

namespace executor_test {

using namespace std::chrono_literals;
using idem::Attempt;
using idem::CallOptions;
using idem::Duration;
using idem::ErrorCode;
using idem::Executor;
using idem::ExecutorOptions;
using idem::WaitPolicy;
using idem::testing::eventually;
using idem::testing::FaultStore;
using idem::testing::Gate;
using idem::testing::IsAcquired;
using idem::testing::IsBusy;
using idem::testing::IsCompleteWith;
using idem::testing::IsInProgressWith;
using idem::testing::kEventually;
using idem::testing::Op;
using idem::testing::ThrowsIdem;

// Waits (boundedly) for the lease to be lost, as a cooperative action would.
inline bool wait_for_lost(const Attempt& attempt) {
  return eventually([&] { return attempt.lease_lost(); });
}

// Threads of this process. The first call starts and joins a thread, so that helper
// threads some runtimes start with the first thread (ThreadSanitizer's) are already counted.
inline std::size_t thread_count() {
  static const bool warmed_up = [] {
    std::thread([] {}).join();
    return true;
  }();
  (void)warmed_up;
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

class ExecutorTest : public idem::testing::ManualClockStoreTest {};
class ExecutorRealTimeTest : public idem::testing::SystemClockStoreTest {};

// Every test that applies runs in both forms of a call (issue 11): run(), and begin() with
// the action run on a thread of its own that takes the handle over and ends it there, as a
// queue consumer would. Both forms must behave the same in every test.
enum class Form { kRun, kBegin };

inline std::string form_name(const ::testing::TestParamInfo<Form>& info) {
  return info.param == Form::kRun ? "Run" : "BeginComplete";
}

template <typename T, typename F>
idem::Result<T> call_in(Form form, Executor& exec, std::string_view scope, std::string_view key,
                        F&& action, const CallOptions& options) {
  if (form == Form::kRun) return exec.run<T>(scope, key, std::forward<F>(action), options);
  auto begun = exec.begin<T>(scope, key, options);
  if (auto* replay = begun.replay()) return std::move(*replay);
  if (const auto* busy = begun.busy()) {
    // What run() throws for the same answer, so the tests read the same in both forms.
    throw idem::InProgress(busy->lease_expires_at, busy->lease_remaining);
  }
  // If the action throws, the handle's destructor releases on the other thread and the
  // future hands the same exception object back.
  return std::async(std::launch::async,
                    [&action, handle = std::move(*begun.handle())]() mutable {
                      T value(action(handle.attempt()));
                      return handle.complete(std::move(value));
                    })
      .get();
}

template <typename Base>
class FormTest : public Base, public ::testing::WithParamInterface<Form> {
 protected:
  template <typename T = std::string, typename F>
  idem::Result<T> call(Executor& exec, std::string_view scope, std::string_view key, F&& action,
                       const CallOptions& options = {}) {
    return call_in<T>(this->GetParam(), exec, scope, key, std::forward<F>(action), options);
  }
};

class ExecutorFormTest : public FormTest<ExecutorTest> {};
class ExecutorRealTimeFormTest : public FormTest<ExecutorRealTimeTest> {};

// The error the tests' actions throw.
struct PaymentDeclined : std::runtime_error {
  explicit PaymentDeclined(int c) : std::runtime_error("declined"), code(c) {}
  int code;
};

}  // namespace executor_test
