// The executor, attempts, results and the default codec, for Python.
//
// run() itself is in Python (idem/_executor.py): begin(), the action, then complete() (or
// release() when the action raises), the same steps as the C++ Executor::run. The action
// thus runs with no C++ frame beneath it: a daemon thread that CPython ends during
// finalization while it runs the action unwinds through Python's frames only (gil.h), and
// an executor shut down at exit releases the lease of an action still running instead of
// waiting for it. Every store call and every wait runs with the GIL released; the codecs
// run with it held.

#include "idem/executor.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "gil.h"

namespace idem::python {
namespace {

// Durations arrive as seconds (int or float) or datetime.timedelta; None means unset.
using Seconds = py::object;
using OptSeconds = py::object;

// Which durations an option takes (SPEC §10: at most 365 days, whole milliseconds).
enum class Bound {
  kPositive,    // lease, ttl, heartbeat, the backoffs: at least 1 ms
  kZeroOrMore,  // wait, shutdown_timeout, close(timeout): 0 is "not at all"
};

// A duration as Python users write it: "30 s", "0.25 s".
std::string seconds_text(Duration d) {
  const long long ms = d.count();
  std::string s = std::to_string(ms / 1000);
  if (const long long frac = ms % 1000; frac != 0) {
    char buf[8];
    std::snprintf(buf, sizeof buf, ".%03lld", frac < 0 ? -frac : frac);
    std::string f(buf);
    while (f.back() == '0') f.pop_back();
    s += f;
  }
  return s + " s";
}

// A duration option, as seconds (int or float) or a datetime.timedelta, in the library's
// milliseconds (rounded to the nearest one). Every refusal names the Python option (`name`:
// "wait", not the library's "max_wait") and shows the value as it was given: NaN is "not a
// number", never a clamped count of milliseconds. `unset` says what to do instead of 0 when
// the option has a default that None asks for (heartbeat).
Duration duration_arg(const py::handle& v, const char* name, Bound bound,
                      const char* unset = nullptr) {
  // Leaked: a module-lifetime cache that must not be destroyed after the interpreter.
  static const py::object* timedelta =
      new py::object(py::module_::import("datetime").attr("timedelta"));
  double seconds = 0;
  std::string given;  // the value as the messages show it
  if (py::isinstance(v, *timedelta)) {
    seconds = py::cast<double>(v.attr("total_seconds")());
    given = "timedelta(" + std::string(py::str(v)) + ")";
  } else if (PyFloat_Check(v.ptr())) {
    seconds = PyFloat_AS_DOUBLE(v.ptr());
    given = std::string(py::repr(v)) + (std::isfinite(seconds) ? " s" : "");
  } else if (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) {
    seconds = PyLong_AsDouble(v.ptr());
    if (seconds == -1.0 && PyErr_Occurred()) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw py::error_already_set();
      PyErr_Clear();  // more than a double holds: refused below as too large or negative
      seconds =
          PyObject_RichCompareBool(v.ptr(), py::int_(0).ptr(), Py_LT) == 1 ? -HUGE_VAL : HUGE_VAL;
    }
    given = py::repr(v);
    if (given.size() > 24) {
      const bool negative = given.front() == '-';
      given = std::string(negative ? "-" : "") + "an int of " +
              std::to_string(given.size() - (negative ? 1 : 0)) + " digits";
    } else {
      given += " s";
    }
  } else {
    throw py::type_error(std::string(name) +
                         " must be seconds (int or float) or a datetime.timedelta, not " +
                         type_name(v));
  }
  if (std::isnan(seconds)) {
    throw InvalidArgument(name, "not a number (" + std::string(py::repr(v)) +
                                    "); give seconds (an int or float) or a datetime.timedelta");
  }
  const std::string range = bound == Bound::kPositive
                                ? "more than 0 and at most 365 days (31536000 s)"
                                : "0 to 365 days (31536000 s)";
  const double ms = std::round(seconds * 1000.0);  // inf stays inf
  const bool refused_zero = bound == Bound::kPositive && seconds == 0;
  if (seconds < 0 || ms > static_cast<double>(kMaxDuration.count()) || refused_zero) {
    std::string why = "must be " + range + ", got " + given;
    if (refused_zero && unset != nullptr) why += std::string("; ") + unset;
    throw InvalidArgument(name, why);
  }
  if (bound == Bound::kPositive && ms < 1) {
    throw InvalidArgument(
        name, "must be at least 0.001 s (idem counts whole milliseconds), got " + given);
  }
  return Duration(static_cast<Duration::rep>(ms));
}

std::optional<Duration> opt_duration(const py::handle& v, const char* name, Bound bound,
                                     const char* unset = nullptr) {
  if (v.is_none()) return std::nullopt;
  return duration_arg(v, name, bound, unset);
}

// heartbeat=0 meant "the default" in the library; in Python the default is None.
constexpr const char* kHeartbeatUnset = "leave it unset (None) for lease / 3";

// SPEC §6: the heartbeat must come round within the lease. Checked here so that the message
// is in seconds, as the options were given.
void check_heartbeat(Duration heartbeat, Duration lease, const char* whose) {
  if (heartbeat >= lease) {
    throw InvalidArgument("heartbeat", std::string("must be shorter than ") + whose + " (" +
                                           seconds_text(lease) + "), got " +
                                           seconds_text(heartbeat));
  }
}

// --- the default codec ---

// JSON for whatever json.dumps takes; bytes as one 0x00 byte followed by the bytes
// themselves (no JSON text starts with 0x00). An empty record (a C++ action returning
// nothing) reads as None. docs/python.md, "Codecs".
struct Json {
  py::object dumps;
  py::object loads;
  static const Json& get() {
    // Leaked: a module-lifetime cache that must not be destroyed after the interpreter.
    static const Json* json = [] {
      py::module_ m = py::module_::import("json");
      py::object encoder =
          m.attr("JSONEncoder")(py::arg("ensure_ascii") = false, py::arg("allow_nan") = false,
                                py::arg("separators") = py::make_tuple(",", ":"));
      return new Json{encoder.attr("encode"), m.attr("loads")};
    }();
    return *json;
  }
};

// bytes(value) for a bytearray or a memoryview.
py::bytes as_bytes(py::handle value) {
  PyObject* b = PyBytes_FromObject(value.ptr());
  if (b == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::bytes>(b);
}

std::string default_encode(py::handle value) {
  if (PyBytes_Check(value.ptr())) {
    char* data = nullptr;
    Py_ssize_t size = 0;
    PyBytes_AsStringAndSize(value.ptr(), &data, &size);
    std::string out;
    out.reserve(static_cast<std::size_t>(size) + 1);
    out.push_back('\0');
    out.append(data, static_cast<std::size_t>(size));
    return out;
  }
  if (PyByteArray_Check(value.ptr()) || PyMemoryView_Check(value.ptr())) {
    return default_encode(as_bytes(value));
  }
  py::str text = Json::get().dumps(value);
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (utf8 == nullptr) throw py::error_already_set();
  return std::string(utf8, static_cast<std::size_t>(size));
}

py::object default_decode(std::string_view bytes) {
  if (bytes.empty()) return py::none();
  if (bytes.front() == '\0') return py::bytes(bytes.data() + 1, bytes.size() - 1);
  return Json::get().loads(py::bytes(bytes.data(), bytes.size()));
}

struct DefaultCodec {};

// A codec as the executor uses it: the default one without a Python call, any other through
// its encode() and decode() methods.
class Codec {
 public:
  Codec() = default;
  explicit Codec(py::object codec)
      : codec_(std::move(codec)), default_(py::isinstance<DefaultCodec>(codec_)) {}

  py::object object() const { return codec_; }

  std::string encode(py::handle value) const {
    if (default_) return default_encode(value);
    py::object out = codec_.attr("encode")(value);
    if (!PyBytes_Check(out.ptr())) {
      if (PyByteArray_Check(out.ptr()) || PyMemoryView_Check(out.ptr())) {
        return std::string(as_bytes(out));
      }
      throw py::type_error("the codec's encode() must return bytes, not " +
                           std::string(py::str(py::type::handle_of(out).attr("__name__"))));
    }
    return std::string(py::reinterpret_borrow<py::bytes>(out));
  }

  // DecodeFailed (with the codec's exception as its cause) when decode() raises.
  py::object decode(std::string_view bytes, RecordRef record) const {
    try {
      if (default_) return default_decode(bytes);
      return codec_.attr("decode")(py::bytes(bytes.data(), bytes.size()));
    } catch (py::error_already_set& e) {
      raise_decode_failed(e, bytes, record);
    }
  }

 private:
  py::object codec_;
  bool default_ = true;
};

// --- results ---

struct PyResult {
  py::object value;
  bool replayed = false;
  std::optional<Token> token;
  std::uint32_t attempt = 0;
  bool stolen = false;
  std::optional<Timestamp> completed_at;
  std::optional<Timestamp> expires_at;

  static PyResult of(py::object value, const ResultInfo& info) {
    return PyResult{std::move(value), info.replayed,     info.token,     info.attempt,
                    info.stolen,      info.completed_at, info.expires_at};
  }
};

py::object optional_datetime(const std::optional<Timestamp>& t) {
  return t ? to_datetime(*t) : py::object(py::none());
}

// --- the executor's Python-facing state ---

// Deletes an executor with the GIL released: its destructor shuts it down and joins the
// heartbeat thread, which may be waiting for the GIL to call on_event.
void delete_executor(Executor* e) {
  if (PyGILState_Check()) {
    without_gil([e] { delete e; });
  } else {
    delete e;
  }
}

// What run() and begin() hand to the action: a replay, or the lease on a key.
class PyAttempt {
 public:
  // A replay.
  PyAttempt(std::shared_ptr<Executor> executor, py::object scope, py::object key, PyResult result)
      : executor_(std::move(executor)),
        scope_(std::move(scope)),
        key_(std::move(key)),
        replayed_(true),
        result_(py::cast(std::move(result))) {}
  // An acquired lease.
  PyAttempt(std::shared_ptr<Executor> executor, py::object scope, py::object key, Codec codec,
            AttemptHandle<std::string>&& handle)
      : executor_(std::move(executor)),
        scope_(std::move(scope)),
        key_(std::move(key)),
        codec_(std::move(codec)),
        result_(py::none()),
        handle_(std::make_unique<AttemptHandle<std::string>>(std::move(handle))),
        attempt_(&handle_->attempt()),
        active_(true),
        token_(handle_->token()),
        number_(handle_->number()),
        stolen_(handle_->stolen()),
        stop_(handle_->stop_token()) {}

  PyAttempt(const PyAttempt&) = delete;
  PyAttempt& operator=(const PyAttempt&) = delete;

  // Releases the lease when nothing ended it. The GIL is released for the store call and
  // while the stop callbacks are taken down (a callback running on the heartbeat thread
  // waits for the GIL, and taking it down waits for the callback).
  ~PyAttempt() {
    without_gil([&] {
      stop_callbacks_.clear();
      if (handle_) {
        std::lock_guard lock(mu_);
        handle_->release();
        handle_.reset();
      }
    });
  }

  bool replayed() const { return replayed_; }
  py::object result() const { return result_; }
  py::object value() const {
    if (result_.is_none()) {
      throw std::logic_error(
          "this attempt has no value yet: it holds the lease; complete() records one");
    }
    return result_.attr("value");
  }
  py::object scope() const { return scope_; }
  py::object key() const { return key_; }
  std::optional<Token> token() const {
    return replayed_ ? std::nullopt : std::optional<Token>(token_);
  }
  std::uint32_t number() const { return number_; }
  bool stolen() const { return stolen_; }
  // These read atomics only: they never wait for mu_ with the GIL held (a thread holding
  // mu_ in complete() may be waiting for the GIL to call on_event).
  bool active() const { return active_.load(std::memory_order_acquire); }
  bool lease_lost() const { return attempt_ != nullptr && attempt_->lease_lost(); }
  bool stop_requested() const { return stop_.stop_requested(); }
  void raise_if_lost() const {
    if (attempt_ != nullptr) attempt_->throw_if_lost();
  }

  // Records `value` (through the codec) and ends the lease.
  py::object complete(py::handle value) {
    require_lease("complete");
    std::string bytes = codec_.encode(value);
    Result<std::string> stored = without_gil([&] {
      std::lock_guard lock(mu_);
      // The handle has ended whatever complete() does (recorded, refused or failed).
      struct Ended {
        std::atomic<bool>& active;
        ~Ended() { active.store(false, std::memory_order_release); }
      } ended{active_};
      return handle_->complete(std::move(bytes));
    });
    result_ = py::cast(PyResult::of(py::reinterpret_borrow<py::object>(value), stored));
    return result_;
  }

  // SPEC §14: writes `value` as COMPLETE on the caller's open transaction on the libpq
  // connection at `pgconn` (a psycopg connection's pgconn_ptr). The lease stays held until
  // committed(), rolled_back() or resolve() reports the caller's commit.
  void complete_in(std::uintptr_t pgconn, py::handle value) {
    require_lease("complete_in");
    std::string bytes = codec_.encode(value);
    const auto conn = SqlConnection::postgres(reinterpret_cast<PGconn*>(pgconn));
    bool ended = false;
    try {
      without_gil([&] {
        std::lock_guard lock(mu_);
        try {
          handle_->complete_in(conn, std::move(bytes));
          completing_.store(true, std::memory_order_release);
        } catch (...) {
          ended = !handle_->active();
          throw;
        }
      });
    } catch (...) {
      if (ended) active_.store(false, std::memory_order_release);
      throw;
    }
    pending_ = py::reinterpret_borrow<py::object>(value);
  }

  // The caller's COMMIT succeeded: the attempt ends as completed.
  py::object committed() {
    require_lease("report a commit on");
    Result<std::string> stored = without_gil([&] {
      std::lock_guard lock(mu_);
      Result<std::string> r = handle_->committed();
      completing_.store(false, std::memory_order_release);
      active_.store(false, std::memory_order_release);
      return r;
    });
    result_ = py::cast(PyResult::of(pending_, stored));
    pending_ = py::none();
    return result_;
  }

  // The caller's transaction rolled back: the lease is held again.
  void rolled_back() {
    require_lease("report a rollback on");
    without_gil([&] {
      std::lock_guard lock(mu_);
      handle_->rolled_back();
      completing_.store(false, std::memory_order_release);
      if (!handle_->active()) active_.store(false, std::memory_order_release);
    });
    pending_ = py::none();
  }

  // The COMMIT's answer was lost: the record says whether it happened. The Result, or None
  // when it did not (the lease is held again).
  py::object resolve() {
    require_lease("resolve");
    std::optional<Result<std::string>> stored = without_gil([&] {
      std::lock_guard lock(mu_);
      try {
        auto r = handle_->resolve();
        completing_.store(false, std::memory_order_release);
        if (!handle_->active()) active_.store(false, std::memory_order_release);
        return r;
      } catch (...) {
        completing_.store(handle_->completing(), std::memory_order_release);
        if (!handle_->active()) active_.store(false, std::memory_order_release);
        throw;
      }
    });
    if (!stored) {
      pending_ = py::none();
      return py::none();
    }
    result_ = py::cast(PyResult::of(pending_, *stored));
    pending_ = py::none();
    return result_;
  }

  // An atomic, like active(): never waits for mu_ with the GIL held.
  bool completing() const { return completing_.load(std::memory_order_acquire); }

  // Gives the key up: the next caller runs as attempt 1. Does nothing once ended.
  void release() {
    if (!handle_) return;
    without_gil([&] {
      std::lock_guard lock(mu_);
      handle_->release();
      active_.store(false, std::memory_order_release);
      completing_.store(false, std::memory_order_release);
    });
  }

  // Calls fn() once when the attempt should stop: its lease was lost, or the executor shut
  // down and released it. From the thread that noticed (usually the heartbeat's), holding
  // the GIL; at once, on this thread, when that already happened.
  void add_stop_callback(py::object fn) {
    if (!handle_) throw std::logic_error("a replayed attempt holds no lease to lose");
    SharedObject callable(std::move(fn));
    auto cb = std::make_unique<std::stop_callback<StopFn>>(stop_, StopFn{callable});
    stop_callbacks_.push_back(std::move(cb));
  }

 private:
  struct StopFn {
    SharedObject fn;
    void operator()() const noexcept {
      try {
        call_back(fn, "idem: a stop callback");
      } catch (...) {
        // Nothing may leave a stop callback.
      }
    }
  };

  void require_lease(const char* what) const {
    if (replayed_) {
      throw std::logic_error(std::string("this attempt is a replay: there is no lease to ") + what +
                             " (its result is in .result)");
    }
  }

  std::shared_ptr<Executor> executor_;  // keeps the executor alive while the attempt is
  // The value of a complete_in() that waits for its commit.
  py::object pending_ = py::none();
  py::object scope_;
  py::object key_;
  Codec codec_;
  bool replayed_ = false;
  py::object result_;
  // One handle must not be used by two threads at once; Python threads may call complete()
  // and release() concurrently while the GIL is released.
  mutable std::mutex mu_;
  std::unique_ptr<AttemptHandle<std::string>> handle_;
  // What the handle shows of its lease (valid while handle_ lives; an ended handle keeps
  // it), read without mu_.
  const Attempt* attempt_ = nullptr;
  std::atomic<bool> active_{false};
  // Mirrors handle_->completing(), set under mu_ by the calls that change it.
  std::atomic<bool> completing_{false};
  Token token_ = 0;
  std::uint32_t number_ = 0;
  bool stolen_ = false;
  std::stop_token stop_;
  std::vector<std::unique_ptr<std::stop_callback<StopFn>>> stop_callbacks_;
};

// --- begin()'s answers ---

// An acquisition that completes while the interpreter exits gives its key back (see
// Gate::begin_exit). A store call: without the GIL.
void give_back_if_exiting(BeginResult<std::string>& begun) {
  if (begun.handle() != nullptr && Gate::instance().exiting()) {
    begun.handle()->release();
    throw ShutDown("the interpreter is exiting; the key was given back");
  }
}

// begin()'s answer as Python sees it: an Attempt (a replay, decoded with `c`, or the lease),
// or for a busy key the tuple (lease_remaining, lease_expires_at).
py::object answer_object(const std::shared_ptr<Executor>& executor, const py::object& scope_obj,
                         const py::object& key_obj, const Codec& c,
                         BeginResult<std::string>&& begun) {
  if (Result<std::string>* replay = begun.replay()) {
    const std::string scope = bytes_arg(scope_obj, "scope");
    const std::string key = bytes_arg(key_obj, "key");
    py::object value = c.decode(replay->value, RecordRef{scope, key});
    return py::cast(std::make_unique<PyAttempt>(executor, scope_obj, key_obj,
                                                PyResult::of(std::move(value), *replay)));
  }
  if (const Busy* busy = begun.busy()) {
    return py::make_tuple(static_cast<double>(busy->lease_remaining.count()) / 1000.0,
                          to_datetime(busy->lease_expires_at));
  }
  return py::cast(
      std::make_unique<PyAttempt>(executor, scope_obj, key_obj, c, std::move(*begun.handle())));
}

// --- begin_async's wait (SPEC §7: non-blocking, woken when the owner finishes) ---

// Where Executor::begin_async's callback leaves its answer for Python. The callback runs on
// the executor's waiting thread (or on the thread that shuts the executor down), without the
// GIL; the answer is taken on the event loop's thread, through PendingBegin. mu is never
// held while waiting for the GIL, on either side.
struct AsyncAnswer {
  explicit AsyncAnswer(SharedObject n) : notify(std::move(n)) {}

  // The callback: keeps the answer and calls notify(), or drops it when Python gave the
  // wait up (an AttemptHandle then releases its lease as it goes, here, without the GIL).
  // Never throws into the executor; skips Python once the gate has closed (gil.h).
  void deliver(BeginAnswer a) noexcept {
    try {
      std::optional<BeginAnswer> dropped;
      {
        std::lock_guard lock(mu);
        if (abandoned) {
          dropped.emplace(std::move(a));
        } else {
          answer.emplace(std::move(a));
        }
      }
      if (dropped) return;
      call_back(notify, "idem: begin_async's notify callback");
    } catch (...) {
      // Nothing may leave the callback; the answer (if kept) is still there to take.
    }
  }

  std::mutex mu;
  std::optional<BeginAnswer> answer;  // guarded by mu
  bool abandoned = false;             // guarded by mu: nobody will take the answer
  SharedObject notify;                // called with no arguments once the answer is in
};

// A begin_async that waits, as Python holds it (idem._idem._PendingBegin). Its notify is
// called once, holding the GIL, from another thread, when answer() has something to give.
// Dropping it, or cancel(), ends the C++ wait at once (its stop token) and gives back a lease
// that the wait acquired for nobody.
class PendingBegin {
 public:
  PendingBegin(std::shared_ptr<Executor> executor, py::object scope, py::object key, Codec codec,
               SharedObject notify)
      : executor_(std::move(executor)),
        scope_(std::move(scope)),
        key_(std::move(key)),
        codec_(std::move(codec)),
        state_(std::make_shared<AsyncAnswer>(std::move(notify))) {}
  PendingBegin(const PendingBegin&) = delete;
  PendingBegin& operator=(const PendingBegin&) = delete;
  ~PendingBegin() {
    if (answered_) return;
    std::optional<BeginAnswer> left = abandon();
    if (left) without_gil([&] { left.reset(); });  // a lease's handle releases it: a store call
  }

  // The call's stop token: requested only to give the wait up, never once the call was
  // answered (an acquired lease's Attempt::stop_token() would show it).
  std::stop_token stop_token() const { return stop_.get_token(); }
  // The first ask settled the call: nothing to wait for, nothing to stop.
  void settled() { answered_ = true; }
  Executor::BeginCallback callback() const {
    return [state = state_](BeginAnswer a) { state->deliver(std::move(a)); };
  }

  // The answer, once: an Attempt, a busy tuple (the bound ran out, or cancelled), or raises
  // what begin() would have raised (ShutDown when the executor shut down first).
  py::object answer() {
    std::optional<BeginAnswer> a;
    {
      std::lock_guard lock(state_->mu);
      a.swap(state_->answer);
    }
    if (!a) throw std::logic_error("begin_async has no answer yet (or it was taken)");
    answered_ = true;
    BeginResult<std::string> begun = without_gil([&] {
      BeginResult<std::string> b = std::move(*a).get();
      give_back_if_exiting(b);
      return b;
    });
    return answer_object(executor_, scope_, key_, codec_, std::move(begun));
  }

  // Gives the wait up: requests its stop (the C++ wait ends at once; its answer, when it
  // comes, is dropped). Returns the lease as an Attempt when the answer already in holds one,
  // for the caller to release off the event loop; else None.
  py::object cancel() {
    if (answered_) return py::none();
    std::optional<BeginAnswer> a = abandon();
    if (!a || a->failed()) return py::none();
    BeginResult<std::string> begun = std::move(*a).get();
    if (begun.handle() == nullptr) return py::none();
    return py::cast(
        std::make_unique<PyAttempt>(executor_, scope_, key_, codec_, std::move(*begun.handle())));
  }

 private:
  // Requests the stop (with the GIL released: the executor's stop callback runs here) and
  // takes the answer if it is in; from now on the callback drops it.
  std::optional<BeginAnswer> abandon() {
    without_gil([&] { stop_.request_stop(); });
    std::optional<BeginAnswer> a;
    std::lock_guard lock(state_->mu);
    state_->abandoned = true;
    a.swap(state_->answer);
    return a;
  }

  std::shared_ptr<Executor> executor_;  // keeps the executor alive while the wait is
  py::object scope_;
  py::object key_;
  Codec codec_;
  std::stop_source stop_;
  std::shared_ptr<AsyncAnswer> state_;
  bool answered_ = false;  // answer() took the answer (or the first ask settled the call)
};

// idem::Event for on_event: built only when a hook is set.
struct PyEvent {
  std::string kind;
  py::object scope;
  py::object key;
  Token token = 0;
  std::uint32_t attempt = 0;
  double elapsed = 0;
  std::optional<std::string> error;
};

struct PyExecutor {
  std::shared_ptr<Executor> executor;
  std::shared_ptr<PyStore> store;
  Codec codec;
  ExecutorOptions options;

  PyExecutor(std::shared_ptr<PyStore> store_in, Seconds lease, OptSeconds heartbeat, Seconds ttl,
             Seconds wait, Seconds initial_backoff, Seconds max_backoff, py::object max_payload,
             Seconds shutdown_timeout, py::object on_event, py::object codec_in)
      : store(std::move(store_in)) {
    if (!store) throw py::type_error("Executor needs a store (idem.open_store(url))");
    options.lease = duration_arg(lease, "lease", Bound::kPositive);
    if (auto h = opt_duration(heartbeat, "heartbeat", Bound::kPositive, kHeartbeatUnset)) {
      check_heartbeat(*h, options.lease, "the lease");
      options.heartbeat = *h;
    }
    options.ttl = duration_arg(ttl, "ttl", Bound::kPositive);
    options.wait.max_wait = duration_arg(wait, "wait", Bound::kZeroOrMore);
    options.wait.initial_backoff =
        duration_arg(initial_backoff, "initial_backoff", Bound::kPositive);
    options.wait.max_backoff = duration_arg(max_backoff, "max_backoff", Bound::kPositive);
    if (options.wait.max_backoff < options.wait.initial_backoff) {
      throw InvalidArgument("max_backoff", "must be at least initial_backoff (" +
                                               seconds_text(options.wait.initial_backoff) +
                                               "), got " + seconds_text(options.wait.max_backoff));
    }
    options.max_payload = count_arg(max_payload, "max_payload");
    options.shutdown_timeout =
        duration_arg(shutdown_timeout, "shutdown_timeout", Bound::kZeroOrMore);
    if (!on_event.is_none()) options.on_event = event_hook(SharedObject(std::move(on_event)));
    codec = Codec(codec_in.is_none() ? py::cast(DefaultCodec{}) : std::move(codec_in));
    ExecutorOptions copy = options;
    executor =
        std::shared_ptr<Executor>(new Executor(store->store, std::move(copy)), &delete_executor);
    register_executor(executor);
  }

  static EventHook event_hook(SharedObject fn) {
    return [fn](const Event& e) {
      // Copies, since the event's views are valid during this call only.
      const std::string scope(e.scope), key(e.key);
      const std::string error = e.error != nullptr ? e.error->what() : std::string();
      const bool has_error = e.error != nullptr;
      with_gil([&] {
        PyEvent ev{to_string(e.kind),
                   text_or_bytes(scope),
                   text_or_bytes(key),
                   e.token,
                   e.attempt,
                   static_cast<double>(e.elapsed.count()) / 1e6,
                   has_error ? std::optional<std::string>(error) : std::nullopt};
        try {
          fn.object()(py::cast(std::move(ev)));
        } catch (py::error_already_set& err) {
          err.discard_as_unraisable("idem: the on_event callback");
        }
      });
    };
  }

  CallOptions call_options(const OptSeconds& lease, const OptSeconds& heartbeat,
                           const OptSeconds& ttl, const OptSeconds& wait,
                           const py::object& fingerprint) const {
    CallOptions call;
    call.lease = opt_duration(lease, "lease", Bound::kPositive);
    call.heartbeat = opt_duration(heartbeat, "heartbeat", Bound::kPositive, kHeartbeatUnset);
    if (call.heartbeat) {
      check_heartbeat(*call.heartbeat, call.lease.value_or(options.lease),
                      call.lease ? "this call's lease" : "the executor's lease");
    }
    call.ttl = opt_duration(ttl, "ttl", Bound::kPositive);
    if (auto w = opt_duration(wait, "wait", Bound::kZeroOrMore)) {
      WaitPolicy policy = options.wait;
      policy.max_wait = *w;
      call.wait = policy;
    }
    call.fingerprint = opt_bytes_arg(fingerprint, "fingerprint");
    return call;
  }

  Codec codec_for(const py::object& c) const { return c.is_none() ? codec : Codec(c); }

  // begin()'s answer for Python (see answer_object).
  py::object begin_answer(const py::object& scope_obj, const py::object& key_obj,
                          const CallOptions& call, const Codec& c) {
    const std::string scope = bytes_arg(scope_obj, "scope");
    const std::string key = bytes_arg(key_obj, "key");
    BeginResult<std::string> begun = without_gil([&] {
      BeginResult<std::string> b = executor->begin<std::string>(scope, key, call);
      give_back_if_exiting(b);
      return b;
    });
    return answer_object(executor, scope_obj, key_obj, c, std::move(begun));
  }

  // begin_async(): the first ask, with the GIL released. Its answer when it settles the call
  // (see answer_object); otherwise a PendingBegin whose notify is called once the wait ends.
  py::object begin_or_wait(const py::object& scope_obj, const py::object& key_obj, CallOptions call,
                           const Codec& c, py::object notify) {
    if (!PyCallable_Check(notify.ptr())) throw py::type_error("notify must be callable");
    const std::string scope = bytes_arg(scope_obj, "scope");
    const std::string key = bytes_arg(key_obj, "key");
    auto pending = std::make_unique<PendingBegin>(executor, scope_obj, key_obj, c,
                                                  SharedObject(std::move(notify)));
    call.stop_token = pending->stop_token();
    std::optional<BeginResult<std::string>> first = without_gil([&] {
      std::optional<BeginResult<std::string>> b =
          executor->begin_async(scope, key, call, pending->callback());
      if (b) give_back_if_exiting(*b);
      return b;
    });
    if (!first) return py::cast(std::move(pending));
    pending->settled();
    return answer_object(executor, scope_obj, key_obj, c, std::move(*first));
  }
};

}  // namespace

void bind_executor(py::module_& m) {
  py::class_<DefaultCodec>(m, "DefaultCodec", R"doc(The default codec.

JSON (UTF-8, compact, no NaN) for every value json.dumps takes: str, int, float, bool,
None, lists and dicts of them. bytes (and bytearray, memoryview) are stored as one 0x00
byte followed by the bytes themselves, and come back as bytes. An empty record (written
by a C++ action that returned nothing) reads as None. Tuples come back as lists and dict
keys as strings, as with any JSON: a fresh run returns the action's own value, only
replays go through decode().)doc")
      .def(py::init<>())
      .def(
          "encode",
          [](const DefaultCodec&, py::handle value) { return py::bytes(default_encode(value)); },
          py::arg("value"))
      .def(
          "decode",
          [](const DefaultCodec&, const py::bytes& data) {
            return default_decode(std::string_view(data));
          },
          py::arg("data"))
      .def("__repr__", [](const DefaultCodec&) { return "idem.DefaultCodec()"; });

  py::class_<PyResult>(m, "Result", "What run() returns: the value and where it came from.")
      .def_readonly("value", &PyResult::value, "The action's value, or the stored one (replayed).")
      .def_readonly(
          "replayed", &PyResult::replayed,
          "True when the value is an earlier run's stored result; the action did not run.")
      .def_readonly("token", &PyResult::token,
                    "The fencing token of the lease that produced a fresh result; None for a "
                    "replay from the store.")
      .def_readonly("attempt", &PyResult::attempt,
                    "The attempt number of that lease (1, or more after takeovers); 0 for a "
                    "replay from the store.")
      .def_readonly("stolen", &PyResult::stolen, "Whether that lease took over an abandoned one.")
      .def_property_readonly(
          "completed_at", [](const PyResult& r) { return optional_datetime(r.completed_at); },
          "When the result was recorded (UTC, the store's clock): replays only.")
      .def_property_readonly(
          "expires_at", [](const PyResult& r) { return optional_datetime(r.expires_at); },
          "When the result stops being replayed (UTC, the store's clock): replays only.")
      .def("__repr__", [](const PyResult& r) {
        std::string s = "idem.Result(value=" + std::string(py::repr(r.value)) +
                        ", replayed=" + (r.replayed ? "True" : "False");
        if (r.token) {
          s += ", token=" + std::to_string(*r.token) + ", attempt=" + std::to_string(r.attempt) +
               ", stolen=" + (r.stolen ? "True" : "False");
        }
        return s + ")";
      });

  py::class_<PyEvent>(m, "Event", "What on_event receives (see docs/python.md, Events).")
      .def_readonly("kind", &PyEvent::kind,
                    "ran, replayed, followed, in_progress, released, stolen, lease_lost or "
                    "heartbeat_error.")
      .def_readonly("scope", &PyEvent::scope)
      .def_readonly("key", &PyEvent::key)
      .def_readonly("token", &PyEvent::token, "The lease concerned; 0 when none of this process.")
      .def_readonly("attempt", &PyEvent::attempt)
      .def_readonly("elapsed", &PyEvent::elapsed,
                    "Seconds since the call began (or the lease "
                    "was acquired, for lease_lost and heartbeat_error).")
      .def_readonly("error", &PyEvent::error, "The store's error, for heartbeat_error.")
      .def("__repr__", [](const PyEvent& e) {
        return "idem.Event(kind=" + std::string(py::repr(py::str(e.kind))) +
               ", scope=" + std::string(py::repr(e.scope)) +
               ", key=" + std::string(py::repr(e.key)) + ", token=" + std::to_string(e.token) + ")";
      });

  py::class_<PyAttempt>(m, "Attempt", R"doc(A call's hold on a key, or the replay it found.

From Executor.begin() (usually in a with block) and as the argument of run()'s action.
replayed: the key completed earlier; .value and .result hold the stored result and there
is nothing to do. Otherwise the attempt holds the lease until complete(value) records a
result or release() gives the key up; leaving a with block by an exception, or dropping
an attempt that was not ended, releases.)doc")
      .def_property_readonly("replayed", &PyAttempt::replayed,
                             "True when begin() found a stored result (no lease is held).")
      .def_property_readonly("result", &PyAttempt::result,
                             "The Result: a replay's, or complete()'s once it returned; else None.")
      .def_property_readonly("value", &PyAttempt::value,
                             "result.value (a replay's stored value, or what complete() recorded).")
      .def_property_readonly("scope", &PyAttempt::scope)
      .def_property_readonly("key", &PyAttempt::key)
      .def_property_readonly("token", &PyAttempt::token,
                             "The lease's fencing token: greater than every earlier token for "
                             "this key in this store. None for a replay.")
      .def_property_readonly("number", &PyAttempt::number,
                             "1 on the first acquisition of the key, +1 after each takeover of "
                             "an abandoned lease; 0 for a replay.")
      .def_property_readonly("stolen", &PyAttempt::stolen,
                             "Whether this attempt took over an abandoned lease (the earlier "
                             "owner may have done part of the work).")
      .def_property_readonly("active", &PyAttempt::active,
                             "Whether the attempt still holds its lease (not completed, released "
                             "or replayed).")
      .def_property_readonly("lease_lost", &PyAttempt::lease_lost,
                             "Whether the lease was lost: another caller took the key over, the "
                             "record was deleted, or the heartbeat could not extend it in time. "
                             "A result completed after that is refused (LeaseLost), unless "
                             "nobody took the key over.")
      .def_property_readonly("stop_requested", &PyAttempt::stop_requested,
                             "Whether the action should stop: the lease was lost or the "
                             "executor shut down and released it.")
      .def("raise_if_lost", &PyAttempt::raise_if_lost,
           "Raises idem.LeaseLost when lease_lost; call it between the steps of a long action.")
      .def("complete", &PyAttempt::complete, py::arg("value"),
           "Records value (through the codec) as the key's result and ends the lease; returns "
           "the Result (not replayed). Raises LeaseLost (not recorded: another caller owns the "
           "key), PayloadTooLarge (the record was released) or StoreUnavailable.")
      .def("_complete_in", &PyAttempt::complete_in, py::arg("pgconn"), py::arg("value"))
      .def("committed", &PyAttempt::committed,
           "After complete_in_transaction(): the caller's COMMIT succeeded. Returns the Result.")
      .def("rolled_back", &PyAttempt::rolled_back,
           "After complete_in_transaction(): the caller's transaction rolled back; the lease "
           "is held again.")
      .def("resolve", &PyAttempt::resolve,
           "After complete_in_transaction(), when the COMMIT's answer was lost: the Result if "
           "the commit happened, None if it did not (the lease is held again).")
      .def_property_readonly("completing", &PyAttempt::completing,
                             "Whether a complete_in_transaction() waits for its commit.")
      .def("release", &PyAttempt::release,
           "Gives the key up (the next caller runs as attempt 1). Best effort; never raises.")
      .def("add_stop_callback", &PyAttempt::add_stop_callback, py::arg("fn"),
           "Calls fn() once when stop_requested becomes true, from the thread that noticed "
           "(the heartbeat's), holding the GIL; at once if it already is. Keep it quick; "
           "what it raises is printed, not raised.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](PyAttempt& a, const py::object& type, const py::object&, const py::object&) {
            // An exception, or a block that neither completed nor released: give the key up.
            // The exception goes on unchanged.
            (void)type;
            a.release();
            return false;
          },
          py::arg("type"), py::arg("value"), py::arg("traceback"))
      .def("__repr__", [](const PyAttempt& a) {
        if (a.replayed()) {
          return "idem.Attempt(replayed=True, scope=" + std::string(py::repr(a.scope())) +
                 ", key=" + std::string(py::repr(a.key())) + ")";
        }
        return "idem.Attempt(scope=" + std::string(py::repr(a.scope())) +
               ", key=" + std::string(py::repr(a.key())) + ", token=" + std::to_string(*a.token()) +
               ", number=" + std::to_string(a.number()) +
               ", stolen=" + (a.stolen() ? "True" : "False") +
               ", active=" + (a.active() ? "True" : "False") + ")";
      });

  py::class_<PendingBegin>(m, "_PendingBegin",
                           "A begin_async that waits (Executor._begin_or_wait); not for callers.")
      .def("answer", &PendingBegin::answer,
           "The answer, once notify() was called: an Attempt, (lease_remaining, "
           "lease_expires_at) for a key still busy, or raises what begin() raises.")
      .def("cancel", &PendingBegin::cancel,
           "Ends the wait at once; its answer is dropped. Returns the Attempt holding a lease "
           "that the wait had already acquired (release it), else None.");

  py::class_<PyExecutor>(m, "Executor", "The C++ executor; use idem.Executor.")
      .def(py::init<std::shared_ptr<PyStore>, Seconds, OptSeconds, Seconds, Seconds, Seconds,
                    Seconds, py::object, Seconds, py::object, py::object>(),
           py::arg("store"), py::kw_only(), py::arg("lease") = 30,
           py::arg("heartbeat") = py::none(), py::arg("ttl") = 86400, py::arg("wait") = 0,
           py::arg("initial_backoff") = 0.01, py::arg("max_backoff") = 1.0,
           py::arg("max_payload") = kDefaultMaxPayloadBytes, py::arg("shutdown_timeout") = 10,
           py::arg("on_event") = py::none(), py::arg("codec") = py::none())
      .def(
          "_begin",
          [](PyExecutor& self, const py::object& scope, const py::object& key,
             const OptSeconds& lease, const OptSeconds& heartbeat, const OptSeconds& ttl,
             const OptSeconds& wait, const py::object& fingerprint,
             const py::object& codec) -> py::object {
            return self.begin_answer(scope, key,
                                     self.call_options(lease, heartbeat, ttl, wait, fingerprint),
                                     self.codec_for(codec));
          },
          py::arg("scope"), py::arg("key"), py::arg("lease") = py::none(),
          py::arg("heartbeat") = py::none(), py::arg("ttl") = py::none(),
          py::arg("wait") = py::none(), py::arg("fingerprint") = py::none(),
          py::arg("codec") = py::none(),
          "begin() (idem/_executor.py), answering a busy key with (lease_remaining, "
          "lease_expires_at) instead of raising InProgress.")
      .def(
          "_begin_or_wait",
          [](PyExecutor& self, const py::object& scope, const py::object& key, py::object notify,
             const OptSeconds& lease, const OptSeconds& heartbeat, const OptSeconds& ttl,
             const OptSeconds& wait, const py::object& fingerprint,
             const py::object& codec) -> py::object {
            return self.begin_or_wait(scope, key,
                                      self.call_options(lease, heartbeat, ttl, wait, fingerprint),
                                      self.codec_for(codec), std::move(notify));
          },
          py::arg("scope"), py::arg("key"), py::arg("notify"), py::kw_only(),
          py::arg("lease") = py::none(), py::arg("heartbeat") = py::none(),
          py::arg("ttl") = py::none(), py::arg("wait") = py::none(),
          py::arg("fingerprint") = py::none(), py::arg("codec") = py::none(),
          "begin_async()'s first ask (idem/_executor.py; a store call, with the GIL released): "
          "_begin's answer when it settles the call, else a _PendingBegin that waits under the "
          "waiting policy without a thread of the caller's, woken when the owner completes or "
          "releases, and calls notify() once (on another thread, holding the GIL) when its "
          "answer() is ready.")
      .def(
          "_check_call_options",
          [](const PyExecutor& self, const OptSeconds& lease, const OptSeconds& heartbeat,
             const OptSeconds& ttl, const OptSeconds& wait) {
            (void)self.call_options(lease, heartbeat, ttl, wait, py::none());
          },
          py::kw_only(), py::arg("lease") = py::none(), py::arg("heartbeat") = py::none(),
          py::arg("ttl") = py::none(), py::arg("wait") = py::none(),
          "Raises what run() would raise for these per-call durations (TypeError, "
          "InvalidArgument), without a call: for the decorator and the ASGI middleware, "
          "which take them once and use them on every call.")
      .def(
          "_in_progress",
          [](PyExecutor&, const py::object& scope, const py::object& key, double remaining,
             const py::object& expires_at) {
            const std::string s = bytes_arg(scope, "scope"), k = bytes_arg(key, "key");
            const double at = py::cast<double>(expires_at.attr("timestamp")());
            raise_idem_error(InProgress(
                Timestamp(Duration(static_cast<Duration::rep>(at * 1000.0 + 0.5))),
                Duration(static_cast<Duration::rep>(remaining * 1000.0 + 0.5)), RecordRef{s, k}));
          },
          "Raises idem.InProgress for a busy answer of _begin.")
      .def(
          "shutdown",
          [](PyExecutor& self, const OptSeconds& timeout) {
            const std::optional<Duration> t = opt_duration(timeout, "timeout", Bound::kZeroOrMore);
            without_gil([&] { self.executor->shutdown(t); });
          },
          py::arg("timeout") = py::none())
      .def_property_readonly("is_shut_down",
                             [](const PyExecutor& self) { return self.executor->is_shut_down(); })
      .def_property_readonly("active_leases",
                             [](const PyExecutor& self) { return self.executor->active_leases(); })
      .def_property_readonly(
          "waiting_duplicates",
          [](const PyExecutor& self) { return self.executor->waiting_duplicates(); })
      .def_property_readonly(
          "waiting_async", [](const PyExecutor& self) { return self.executor->waiting_async(); },
          "How many begin_async calls are waiting for a busy key (for tests and metrics).")
      .def_property_readonly("store", [](const PyExecutor& self) { return self.store; })
      .def_property_readonly("codec", [](const PyExecutor& self) { return self.codec.object(); });
}

}  // namespace idem::python
