// idem in one minute: run an action twice with the same key. The first call runs it and
// stores its result; the second finds the result stored and replays it without running the
// action again.
//
//   quickstart [STORE_URL]        STORE_URL defaults to "memory:"; try "sqlite:demo.db"
//
// Exits 0 when the action ran at most once and the duplicate got the first call's result.

#include <cstdio>
#include <exception>
#include <string>

#include "idem/executor.h"
#include "idem/open_store.h"

int main(int argc, char** argv) {
  const std::string url = argc > 1 ? argv[1] : "memory:";
  try {
    idem::Executor executor(idem::open_store(url));

    int charges = 0;
    auto charge_card = [&](const idem::Attempt& attempt) {
      ++charges;
      // attempt.token() is the fencing token: pass it to downstream systems (SPEC §2).
      return "charged 10 EUR under token " + std::to_string(attempt.token());
    };

    // A client sends the same request twice (say it retried after a timeout).
    auto first = executor.run("payments", "order-42", charge_card);
    auto second = executor.run("payments", "order-42", charge_card);

    std::printf("first:  %s%s\n", first.value.c_str(), first.replayed ? " (replayed)" : "");
    std::printf("second: %s%s\n", second.value.c_str(), second.replayed ? " (replayed)" : "");
    std::printf("the action ran %d time(s)\n", charges);

    // With a durable store, running this program again replays both calls: the record from
    // the earlier run is still within its TTL (24 h by default).
    const bool ran_at_most_once = charges == (first.replayed ? 0 : 1);
    return second.replayed && second.value == first.value && ran_at_most_once ? 0 : 1;
  } catch (const idem::Error& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
  }
}
