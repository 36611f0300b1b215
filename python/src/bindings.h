#pragma once

// What the two halves of the extension (module.cpp: errors, stores, the module; executor.cpp:
// the executor, attempts, results, codecs) share.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "idem/executor.h"
#include "idem/store.h"
#include "idem/types.h"

namespace idem::python {

namespace py = pybind11;

// A store opened from a URL (or shared by several executors).
struct PyStore {
  std::shared_ptr<Store> store;
  std::string url;  // as given, for repr() only when it has no password: describe() otherwise
};

// A store timestamp as an aware datetime in UTC.
py::object to_datetime(Timestamp t);

// Bytes the library hands back (scopes, keys, fingerprints): str when they are valid UTF-8,
// else bytes. Callers pass str or bytes and mostly pass text.
py::object text_or_bytes(std::string_view bytes);

// Raises the Python exception for an idem::Error (the classes of idem/errors.py).
[[noreturn]] void raise_idem_error(const Error& e);

// idem.DecodeFailed for a codec's decode() that raised: the exception in flight becomes its
// __cause__. `record` names the record.
[[noreturn]] void raise_decode_failed(py::error_already_set& cause, std::string_view bytes,
                                      RecordRef record);

// Executors alive in this process, shut down by the package's atexit hook before the gate
// closes (so open attempts release their keys and no heartbeat outlives Python).
void register_executor(const std::shared_ptr<Executor>& executor);
void shut_down_executors_at_exit();

void bind_executor(py::module_& m);

}  // namespace idem::python
