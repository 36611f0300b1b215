#pragma once

// What the two halves of the extension (module.cpp: errors, stores, the module; executor.cpp:
// the executor, attempts, results, codecs) share.

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
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

// The arguments every public entry point takes, converted once, with errors that name the
// argument (never pybind11's "Unable to cast" or its dump of a signature).
//
// A scope, key or fingerprint (`name`): str (its UTF-8) or bytes (a bytearray too).
// TypeError "key must be str or bytes, not NoneType" for any other type; idem.InvalidArgument
// for a str that has no UTF-8 form (a lone surrogate), see module.cpp.
std::string bytes_arg(py::handle value, const char* name);
// The same, with None for "not given".
std::optional<std::string> opt_bytes_arg(py::handle value, const char* name);
// A count (a limit, a size): an int, 0 or more. TypeError for another type,
// idem.InvalidArgument when negative; one too large for size_t reads as the largest.
std::size_t count_arg(py::handle value, const char* name);
// The name of value's type, for TypeError messages.
std::string type_name(py::handle value);

// Raises the Python exception for `e`, with the exception in flight (`cause`) as its
// __cause__.
[[noreturn]] void raise_with_cause(const Error& e, py::error_already_set& cause);

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
