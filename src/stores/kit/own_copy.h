#pragma once

// The store kit's hand-out of one failure to many callers. A batch that fails fails every
// caller in it, and each caller throws the error in its own thread. Rethrowing one
// std::exception_ptr in many threads is valid C++, but the exception's reference count, and
// that of the message a std::runtime_error copy shares, are kept inside libstdc++, which
// ThreadSanitizer does not instrument: the thread that drops the last reference frees what
// other threads read, and a program built with TSan reports a race inside idem. So the
// batch's runner hands each caller an error of its own, built before it wakes them, which
// only that caller's thread touches.

#include <exception>

namespace idem::kit {

// A new exception equal to `error`'s, sharing nothing with it: the same class, fields and
// message, built again from its fields. Done for the errors a store's statement throws
// (StoreUnavailable, StoreNotFound) and every other idem::Error whose fields make its
// message (InProgress, KeyReuse, PayloadTooLarge, DecodeFailed), and std::bad_alloc.
// Anything else is returned as it is (so is `error` when memory runs out while copying):
// still correct, only shared. Null for null.
std::exception_ptr own_copy(const std::exception_ptr& error) noexcept;

}  // namespace idem::kit
