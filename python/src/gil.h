#pragma once

// The GIL and the threads of the C++ library.
//
// Every store call and every wait runs with the GIL released (without_gil), so other Python
// threads run meanwhile. The library's own threads (the executor's heartbeat) and Python
// threads that released the GIL call back into Python (on_event, stop callbacks, dropping a
// Python object held by C++) only through with_gil(), which asks the gate first.
//
// The gate closes at interpreter exit (an atexit hook in the package): from then on no C++
// thread takes the GIL, because CPython 3.11 ends a thread that asks for the GIL after
// finalization began with pthread_exit, and a forced unwind through the library's noexcept
// heartbeat code would abort the process. Closing waits, with the GIL released, for the
// callbacks already inside to return; callbacks after that are skipped, and Python objects
// dropped after that are leaked (the process is exiting).

#include <pybind11/pybind11.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace idem::python {

namespace py = pybind11;

class Gate {
 public:
  static Gate& instance();

  // Whether a C++ thread may take the GIL now; true counts it as inside until leave().
  bool enter();
  void leave();
  // Refuses every later enter() and waits for the threads inside to leave. The caller holds
  // the GIL; it is released while waiting, so those threads can finish.
  void close();
  bool is_open() const;
  // Set first thing at exit, before the executors are shut down: an acquisition that
  // completes from then on gives its key back (begin raises ShutDown) rather than start an
  // action while the process exits (a waiter would otherwise take over the key that the
  // shutdown of another executor just released).
  void begin_exit() { exiting_.store(true, std::memory_order_seq_cst); }
  bool exiting() const { return exiting_.load(std::memory_order_seq_cst); }
  // The interpreter's main thread (captured when the module is imported).
  void set_main_thread(unsigned long ident) { main_thread_ = ident; }
  bool on_main_thread() const;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> open_{true};  // written under mu_
  int inside_ = 0;
  unsigned long main_thread_ = 0;
  std::atomic<bool> exiting_{false};
};

// Runs f() holding the GIL when the gate is open; returns whether it ran. For C++ threads
// (the heartbeat) and for Python threads that released the GIL (on_event inside a store
// call): PyGILState takes the GIL, or finds it already held by this thread.
template <typename F>
bool with_gil(F&& f) {
  Gate& gate = Gate::instance();
  if (!gate.enter()) return false;
  struct Leave {
    Gate& gate;
    ~Leave() { gate.leave(); }
  } leave{gate};
  const PyGILState_STATE state = PyGILState_Ensure();
  try {
    f();
  } catch (...) {
    PyGILState_Release(state);
    throw;
  }
  PyGILState_Release(state);
  return true;
}

// Takes the GIL back after without_gil(). A thread other than the main one that comes back
// once the interpreter is exiting (the gate closed at exit, or finalization began) never
// returns: CPython 3.11 would end it with pthread_exit inside PyEval_RestoreThread, and the
// forced unwind would run pybind11's destructors, which drop Python references without the
// GIL while the interpreter is torn down. Only daemon threads are left by then, and the
// process is about to end them all; this one parks until it does (what CPython 3.14 does
// itself for such threads).
void restore_thread(PyThreadState* saved);

// Runs f() with the GIL released and returns what it returns (or rethrows what it throws,
// after taking the GIL back through restore_thread).
template <typename F>
auto without_gil(F&& f) -> std::invoke_result_t<F&> {
  using R = std::invoke_result_t<F&>;
  PyThreadState* const saved = PyEval_SaveThread();
  if constexpr (std::is_void_v<R>) {
    try {
      f();
    } catch (...) {
      restore_thread(saved);
      throw;
    }
    restore_thread(saved);
  } else {
    std::optional<R> out;
    try {
      out.emplace(f());
    } catch (...) {
      restore_thread(saved);
      throw;
    }
    restore_thread(saved);
    return std::move(*out);
  }
}

// A reference to a Python object that C++ may copy and drop on any thread: the last copy
// drops the reference under with_gil() (or leaks it once the gate has closed).
class SharedObject {
 public:
  SharedObject() = default;
  explicit SharedObject(py::object object);
  PyObject* get() const noexcept { return ref_.get(); }
  explicit operator bool() const noexcept { return ref_ != nullptr; }
  // A new reference, for a caller that holds the GIL.
  py::object object() const { return py::reinterpret_borrow<py::object>(ref_.get()); }

 private:
  std::shared_ptr<PyObject> ref_;
};

// Calls `callable(args...)` for a callback from C++: under with_gil(), printing (not
// raising) whatever it raises, as Python does for exceptions in callbacks it cannot return
// to (sys.unraisablehook). Returns false when the gate was closed.
template <typename... Args>
bool call_back(const SharedObject& callable, const char* what, Args&&... args) {
  return with_gil([&] {
    try {
      callable.object()(std::forward<Args>(args)...);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable(what);
    }
  });
}

}  // namespace idem::python
