// The _idem extension module: errors, stores, the interpreter-exit hook. The executor is in
// executor.cpp.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings.h"
#include "gil.h"
#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/store.h"
#include "idem/version.h"

namespace idem::python {

// --- the gate (gil.h) ---

Gate& Gate::instance() {
  // Leaked: threads may still ask it during static destruction.
  static Gate* gate = new Gate();
  return *gate;
}

bool Gate::enter() {
  std::lock_guard lock(mu_);
  if (!open_.load(std::memory_order_relaxed)) return false;
  ++inside_;
  return true;
}

void Gate::leave() {
  std::lock_guard lock(mu_);
  if (--inside_ == 0) cv_.notify_all();
}

bool Gate::is_open() const { return open_.load(std::memory_order_acquire); }

void Gate::close() {
  {
    std::lock_guard lock(mu_);
    open_.store(false, std::memory_order_release);
  }
  // A thread inside may be waiting for the GIL this thread holds.
  without_gil([&] {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return inside_ == 0; });
  });
}

bool Gate::on_main_thread() const { return PyThread_get_thread_ident() == main_thread_; }

namespace {

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

}  // namespace

void restore_thread(PyThreadState* saved) {
  Gate& gate = Gate::instance();
  if (!gate.on_main_thread() && (!gate.is_open() || interpreter_finalizing())) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  PyEval_RestoreThread(saved);
}

SharedObject::SharedObject(py::object object)
    : ref_(object.release().ptr(), [](PyObject* p) {
        if (PyGILState_Check()) {
          Py_DECREF(p);
        } else {
          with_gil([p] { Py_DECREF(p); });  // leaked once Python is exiting
        }
      }) {}

// --- conversions ---

py::object to_datetime(Timestamp t) {
  static py::object* from_timestamp = [] {
    py::module_ dt = py::module_::import("datetime");
    py::object utc = dt.attr("timezone").attr("utc");
    // Leaked: a module-lifetime cache that must not be destroyed after the interpreter.
    return new py::object(py::cpp_function(
        [dt, utc](double s) { return dt.attr("datetime").attr("fromtimestamp")(s, utc); }));
  }();
  const auto ms = t.time_since_epoch().count();
  return (*from_timestamp)(static_cast<double>(ms) / 1000.0);
}

py::object text_or_bytes(std::string_view bytes) {
  PyObject* s = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "strict");
  if (s != nullptr) return py::reinterpret_steal<py::object>(s);
  PyErr_Clear();
  return py::bytes(bytes.data(), bytes.size());
}

// --- errors ---

namespace {

// The classes of idem/errors.py, handed over by the package at import
// (_set_error_classes). Leaked references: they live as long as the process.
struct ErrorClasses {
  PyObject* error = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* payload_too_large = nullptr;
  PyObject* in_progress = nullptr;
  PyObject* key_reuse = nullptr;
  PyObject* lease_lost = nullptr;
  PyObject* store_unavailable = nullptr;
  PyObject* decode_failed = nullptr;
  PyObject* shut_down = nullptr;
};
ErrorClasses g_errors;

void set_error_classes(const py::dict& classes) {
  auto take = [&](const char* name, PyObject*& slot) {
    py::object cls = classes[name];
    slot = cls.release().ptr();
  };
  take("Error", g_errors.error);
  take("InvalidArgument", g_errors.invalid_argument);
  take("PayloadTooLarge", g_errors.payload_too_large);
  take("InProgress", g_errors.in_progress);
  take("KeyReuse", g_errors.key_reuse);
  take("LeaseLost", g_errors.lease_lost);
  take("StoreUnavailable", g_errors.store_unavailable);
  take("DecodeFailed", g_errors.decode_failed);
  take("ShutDown", g_errors.shut_down);
}

std::string code_name(ErrorCode code) {
  std::string s = to_string(code);
  for (char& c : s) {
    if (c == ' ') c = '_';
  }
  return s;
}

// The exception object for `e`, with its facts as attributes.
py::object make_error(const Error& e) {
  PyObject* cls = g_errors.error;
  if (cls == nullptr) return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(e.what());
  py::dict facts;
  if (const auto* p = dynamic_cast<const PayloadTooLarge*>(&e)) {
    cls = g_errors.payload_too_large;
    facts["argument"] = p->argument();
    facts["size"] = p->size();
    facts["limit"] = p->limit();
  } else if (const auto* p = dynamic_cast<const InvalidArgument*>(&e)) {
    cls = g_errors.invalid_argument;
    facts["argument"] = p->argument();
  } else if (const auto* p = dynamic_cast<const InProgress*>(&e)) {
    cls = g_errors.in_progress;
    facts["lease_expires_at"] = to_datetime(p->lease_expires_at());
    facts["lease_remaining"] = static_cast<double>(p->lease_remaining().count()) / 1000.0;
  } else if (const auto* p = dynamic_cast<const KeyReuse*>(&e)) {
    cls = g_errors.key_reuse;
    facts["stored_fingerprint"] = text_or_bytes(p->stored_fingerprint());
    facts["request_fingerprint"] = text_or_bytes(p->request_fingerprint());
  } else if (const auto* p = dynamic_cast<const LeaseLost*>(&e)) {
    cls = g_errors.lease_lost;
    facts["token"] = p->token();
  } else if (const auto* p = dynamic_cast<const StoreUnavailable*>(&e)) {
    cls = g_errors.store_unavailable;
    facts["store"] = p->store();
    facts["reason"] = p->reason();
  } else if (const auto* p = dynamic_cast<const DecodeFailed*>(&e)) {
    cls = g_errors.decode_failed;
    facts["data"] = py::bytes(p->bytes());
    facts["reason"] = p->reason();
  } else if (dynamic_cast<const ShutDown*>(&e) != nullptr) {
    cls = g_errors.shut_down;
  }
  py::object error = py::reinterpret_borrow<py::object>(cls)(e.what());
  error.attr("code") = code_name(e.code());
  error.attr("retryable") = e.retryable();
  error.attr("scope") = e.scope().empty() ? py::object(py::none()) : text_or_bytes(e.scope());
  error.attr("key") = e.key().empty() ? py::object(py::none()) : text_or_bytes(e.key());
  for (auto item : facts) error.attr(item.first) = item.second;
  return error;
}

void set_error(const Error& e) {
  py::object error = make_error(e);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
}

}  // namespace

void raise_idem_error(const Error& e) {
  set_error(e);
  throw py::error_already_set();
}

void raise_with_cause(const Error& e, py::error_already_set& cause) {
  py::object exc = make_error(e);
  PyException_SetCause(exc.ptr(), cause.value().inc_ref().ptr());
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

void raise_decode_failed(py::error_already_set& cause, std::string_view bytes, RecordRef record) {
  const std::string reason = py::str(cause.value());
  raise_with_cause(DecodeFailed(std::string(bytes), reason, record), cause);
}

// --- arguments ---

std::string type_name(py::handle value) {
  return py::str(py::type::handle_of(value).attr("__name__"));
}

std::string bytes_arg(py::handle value, const char* name) {
  PyObject* o = value.ptr();
  if (PyUnicode_Check(o)) {
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(o, &size);
    if (utf8 != nullptr) return std::string(utf8, static_cast<std::size_t>(size));
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) throw py::error_already_set();
    py::error_already_set cause;
    // A lone surrogate ('\ud800', as os.fsdecode and surrogateescape make): the argument
    // has the right type but a value that has no UTF-8 form, so by Python's convention a
    // ValueError, not a TypeError ('\ud800'.encode() raises UnicodeEncodeError, a
    // ValueError). It is idem.InvalidArgument (a ValueError too), like every other scope or
    // key that cannot be one (empty, too long): `argument` names it, `except idem.Error`
    // catches it, and the UnicodeEncodeError is its __cause__.
    std::string where;
    try {
      const auto start = py::cast<Py_ssize_t>(cause.value().attr("start"));
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X",
                    static_cast<unsigned>(PyUnicode_ReadChar(o, start)));
      where =
          std::string(" holds the lone surrogate ") + code + " at index " + std::to_string(start);
    } catch (py::error_already_set&) {
      where = " holds a lone surrogate";
    }
    raise_with_cause(InvalidArgument(name, std::string("a str must encode as UTF-8, and this one") +
                                               where + "; pass bytes for a binary " + name),
                     cause);
  }
  if (PyBytes_Check(o)) {
    return std::string(PyBytes_AS_STRING(o), static_cast<std::size_t>(PyBytes_GET_SIZE(o)));
  }
  if (PyByteArray_Check(o)) {
    return std::string(PyByteArray_AS_STRING(o), static_cast<std::size_t>(PyByteArray_GET_SIZE(o)));
  }
  throw py::type_error(std::string(name) + " must be str or bytes, not " + type_name(value));
}

std::optional<std::string> opt_bytes_arg(py::handle value, const char* name) {
  if (value.is_none()) return std::nullopt;
  PyObject* o = value.ptr();
  if (!PyUnicode_Check(o) && !PyBytes_Check(o) && !PyByteArray_Check(o)) {
    throw py::type_error(std::string(name) + " must be str or bytes (or None), not " +
                         type_name(value));
  }
  return bytes_arg(value, name);
}

std::size_t count_arg(py::handle value, const char* name) {
  PyObject* o = value.ptr();
  if (!PyLong_Check(o) || PyBool_Check(o)) {
    throw py::type_error(std::string(name) + " must be an int, not " + type_name(value));
  }
  const unsigned long long n = PyLong_AsUnsignedLongLong(o);
  if (n == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();  // OverflowError: negative, or more than 64 bits
    if (PyObject_RichCompareBool(o, py::int_(0).ptr(), Py_LT) == 1) {
      throw InvalidArgument(name, "must be 0 or more, got " + std::string(py::repr(value)));
    }
    return static_cast<std::size_t>(-1);
  }
  return static_cast<std::size_t>(n);
}

// --- executors alive, for the exit hook ---

namespace {

std::mutex g_executors_mu;
std::vector<std::weak_ptr<Executor>> g_executors;

}  // namespace

void register_executor(const std::shared_ptr<Executor>& executor) {
  std::lock_guard lock(g_executors_mu);
  std::erase_if(g_executors, [](const std::weak_ptr<Executor>& w) { return w.expired(); });
  g_executors.push_back(executor);
}

void shut_down_executors_at_exit() {
  std::vector<std::shared_ptr<Executor>> alive;
  {
    std::lock_guard lock(g_executors_mu);
    for (auto& w : g_executors) {
      if (auto e = w.lock()) alive.push_back(std::move(e));
    }
    g_executors.clear();
  }
  // Nothing will end an open attempt now: release its lease at once rather than after
  // shutdown_timeout, so the next process finds the key free (attempt 1, not stolen).
  // Waiting duplicates stop with ShutDown. The GIL is released so that on_event callbacks
  // and threads finishing their store calls can go on.
  // The last references are dropped there too: an executor whose Python object went away
  // meanwhile is destroyed here, and joins its heartbeat thread.
  without_gil([&] {
    for (auto& e : alive) e->shutdown(Duration{0});
    alive.clear();
  });
}

namespace {

py::dict record_dict(const Record& r) {
  py::dict d;
  const bool complete = r.state == RecordState::kComplete;
  d["state"] = complete ? "complete" : "in_progress";
  d["token"] = r.token;
  d["attempt"] = r.attempt;
  d["acquired_at"] = complete ? py::object(py::none()) : to_datetime(r.acquired_at);
  d["lease_expires_at"] = complete ? py::object(py::none()) : to_datetime(r.lease_expires_at);
  d["completed_at"] = complete ? to_datetime(r.completed_at) : py::object(py::none());
  d["expires_at"] = to_datetime(r.expires_at);
  d["payload"] = complete ? py::object(py::bytes(r.payload)) : py::object(py::none());
  d["fingerprint"] = r.fingerprint ? text_or_bytes(*r.fingerprint) : py::object(py::none());
  d["now"] = to_datetime(r.now);
  return d;
}

}  // namespace

}  // namespace idem::python

namespace py = pybind11;
using namespace idem::python;

PYBIND11_MODULE(_idem, m) {
  m.doc() = "The C++ core of the idem package (use `import idem`, not this module).";
  m.attr("__version__") = idem::version();
  Gate::instance().set_main_thread(py::cast<unsigned long>(
      py::module_::import("threading").attr("main_thread")().attr("ident")));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const idem::Error& e) {
      set_error(e);
    }
  });

  m.def("_set_error_classes", &set_error_classes, py::arg("classes"));
  m.def(
      "_check_scope", [](py::handle value) { idem::validate_scope(bytes_arg(value, "scope")); },
      py::arg("value"),
      "Raises what run() raises for a scope that cannot be one: TypeError for a type other "
      "than str or bytes, InvalidArgument for a str with no UTF-8 form or a wrong length. "
      "For the decorator's fixed scope, checked when it decorates; not for callers.");
  m.def(
      "_at_exit",
      [] {
        Gate::instance().begin_exit();
        shut_down_executors_at_exit();
        Gate::instance().close();
      },
      "Shuts every executor down and stops the library's threads from calling Python. "
      "Registered with atexit by the package; not for callers.");
  m.def("_gate_open", [] { return Gate::instance().is_open(); });

  m.def("available_schemes", &idem::available_schemes,
        "The store URL schemes this build can open, e.g. ['memory', 'postgres', ...].");

  py::class_<PyStore, std::shared_ptr<PyStore>>(m, "Store",
                                                "A store opened from a URL; see idem.open_store.")
      .def(
          "describe", [](const PyStore& s) { return s.store->describe(); },
          "The store's URL with any password redacted.")
      .def(
          "get",
          [](const PyStore& s, py::handle scope_obj, py::handle key_obj) -> py::object {
            const std::string scope = bytes_arg(scope_obj, "scope");
            const std::string key = bytes_arg(key_obj, "key");
            auto r = without_gil([&] { return s.store->get(scope, key); });
            if (!r) return py::none();
            return record_dict(*r);
          },
          py::arg("scope"), py::arg("key"),
          "A snapshot of one record as a dict, or None. Changes nothing.")
      .def(
          "forget",
          [](const PyStore& s, py::handle scope_obj, py::handle key_obj) {
            const std::string scope = bytes_arg(scope_obj, "scope");
            const std::string key = bytes_arg(key_obj, "key");
            return without_gil([&] { return s.store->forget(scope, key); });
          },
          py::arg("scope"), py::arg("key"),
          "An operator's delete, whatever the record's state; a current owner is then fenced.")
      .def(
          "purge",
          [](const PyStore& s, py::handle limit_obj) {
            const std::size_t limit = count_arg(limit_obj, "limit");
            return without_gil([&] { return s.store->purge(limit); });
          },
          py::arg("limit") = 1000, "Deletes up to `limit` expired records; returns how many.")
      .def("__repr__", [](const PyStore& s) { return "<idem.Store " + s.store->describe() + ">"; });

  m.def(
      "open_store",
      [](const std::string& url, bool read_only, bool create_if_missing) {
        idem::OpenOptions options;
        options.read_only = read_only;
        options.create_if_missing = create_if_missing;
        auto store = without_gil([&] { return idem::open_store(url, options); });
        return std::make_shared<PyStore>(PyStore{std::move(store), url});
      },
      py::arg("url"), py::kw_only(), py::arg("read_only") = false,
      py::arg("create_if_missing") = true,
      "Opens a store from a URL (memory:, sqlite:///path, postgresql://..., redis://...).");

  bind_executor(m);
}
