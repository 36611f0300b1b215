// A request handler as a service would write it, with the parts a production user reaches
// for in the first week (docs/api.md):
//   - a typed result through the opt-in JSON codec,
//   - a request fingerprint, so a reused key with another body is refused,
//   - cancellation when the client goes away,
//   - every error mapped to an HTTP status, retryable() deciding on Retry-After,
//   - the event hook counting into ExecutorMetrics, served as Prometheus text,
//   - an orderly shutdown.
//
//   service [STORE_URL]        STORE_URL defaults to "memory:"
//
// Exits 0 when the duplicate replayed, the reused key was refused and the metrics say so.

#include <cstdio>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>

#include "idem/codec_json.h"
#include "idem/executor.h"
#include "idem/metrics.h"
#include "idem/open_store.h"

namespace {

struct Receipt {
  std::string order;
  long cents = 0;
  std::uint64_t fence = 0;
};

void to_json(nlohmann::json& j, const Receipt& r) {
  j = {{"order", r.order}, {"cents", r.cents}, {"fence", r.fence}};
}
void from_json(const nlohmann::json& j, Receipt& r) {
  j.at("order").get_to(r.order);
  j.at("cents").get_to(r.cents);
  j.at("fence").get_to(r.fence);
}

}  // namespace

// One line opts a type with to_json/from_json into the JSON codec.
template <>
struct idem::Codec<Receipt> : idem::JsonCodec<Receipt> {};

namespace {

struct Response {
  int status;
  std::string body;
};

Response handle(idem::Executor& executor, const std::string& key, const std::string& body,
                std::stop_token client_gone) {
  try {
    auto r = executor.run<Receipt>(
        "POST /orders", key,
        [&](const idem::Attempt& attempt) {
          // ... charge the card, passing attempt.token() downstream as the fencing token;
          // a long step would check attempt.throw_if_lost() between its parts.
          attempt.throw_if_lost();
          return Receipt{body, 1299, attempt.token()};
        },
        idem::CallOptions{.wait = idem::WaitPolicy{.max_wait = std::chrono::seconds(5)},
                          .fingerprint = "sha256:" + std::to_string(std::hash<std::string>{}(body)),
                          .stop_token = client_gone});
    return Response{r.replayed ? 200 : 201, nlohmann::json(r.value).dump()};
  } catch (const idem::KeyReuse&) {
    return Response{422, "the key was used for a different request"};
  } catch (const idem::InProgress& e) {
    return Response{409, "retry after " + std::to_string(e.lease_remaining().count()) + " ms"};
  } catch (const idem::Error& e) {
    // StoreUnavailable, LeaseLost, ShutDown: 503 with Retry-After when a retry can help.
    return Response{e.retryable() ? 503 : 500, e.what()};
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string url = argc > 1 ? argv[1] : "memory:";
  idem::ExecutorMetrics metrics;
  try {
    idem::Executor executor(idem::open_store(url),
                            idem::ExecutorOptions{.on_event = metrics.hook()});
    std::stop_source connection;  // requested when the client disconnects
    const Response first = handle(executor, "order-7", "2 books", connection.get_token());
    const Response again = handle(executor, "order-7", "2 books", connection.get_token());
    const Response reused = handle(executor, "order-7", "1 lamp", connection.get_token());
    std::printf("%d %s\n%d %s\n%d %s\n", first.status, first.body.c_str(), again.status,
                again.body.c_str(), reused.status, reused.body.c_str());

    executor.shutdown();  // what the destructor does: in-flight calls get their timeout
    const Response late = handle(executor, "order-8", "a pen", connection.get_token());
    std::printf("%d %s\n", late.status, late.body.c_str());

    std::printf("--- /metrics\n%s", metrics.prometheus().c_str());
    const bool ok = (first.status == 201 || first.status == 200) && again.status == 200 &&
                    reused.status == 422 && late.status == 503 &&
                    metrics.count(idem::EventKind::kReplayed) >= 1;
    return ok ? 0 : 1;
  } catch (const idem::Error& e) {
    std::fprintf(stderr, "service: %s\n", e.what());
    return 1;
  }
}
