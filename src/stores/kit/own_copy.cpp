#include "stores/kit/own_copy.h"

#include <new>
#include <string>

#include "idem/error.h"

namespace idem::kit {

namespace {

RecordRef record_of(const Error& e) { return {e.scope(), e.key()}; }

std::exception_ptr copy_of(const std::exception_ptr& error) {
  // Most derived first: a catch takes the first class that matches. Each is built from
  // copies of its fields, so its message is a string of its own (a copy constructor would
  // share the original's).
  try {
    std::rethrow_exception(error);
  } catch (const StoreNotFound& e) {
    return std::make_exception_ptr(StoreNotFound(e.store(), e.reason()));
  } catch (const StoreUnavailable& e) {
    return std::make_exception_ptr(
        StoreUnavailable(e.store(), e.reason(), record_of(e), e.unconfirmed()));
  } catch (const InProgress& e) {
    return std::make_exception_ptr(
        InProgress(e.lease_expires_at(), e.lease_remaining(), record_of(e)));
  } catch (const KeyReuse& e) {
    return std::make_exception_ptr(
        KeyReuse(e.stored_fingerprint(), e.request_fingerprint(), record_of(e)));
  } catch (const PayloadTooLarge& e) {
    return std::make_exception_ptr(PayloadTooLarge(e.size(), e.limit(), record_of(e)));
  } catch (const DecodeFailed& e) {
    return std::make_exception_ptr(DecodeFailed(e.bytes(), e.reason(), record_of(e)));
  } catch (const std::bad_alloc&) {
    return std::make_exception_ptr(std::bad_alloc());
  } catch (...) {
    return error;
  }
}

}  // namespace

std::exception_ptr own_copy(const std::exception_ptr& error) noexcept {
  if (!error) return nullptr;
  try {
    return copy_of(error);
  } catch (...) {
    return error;  // out of memory while copying: shared, still correct
  }
}

}  // namespace idem::kit
