// SPEC §10 under hostile input (docs/RELIABILITY.md, "Hostile input"): bytes that mean
// something to a layer a store passes them through (NUL, invalid UTF-8, SQL, Lua, RESP,
// Redis key syntax), at and one over the size limits, forged tokens and extreme durations
// and purge limits. Each is refused with InvalidArgument naming the input, or stored and
// returned byte for byte; no other record changes. (Empty and over-long plain scopes and
// keys, zero and slightly too long durations and the 64 MiB payload limit are in
// validation_conformance.cpp and identity_conformance.cpp.)

#include <gmock/gmock.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "conformance/test_data.h"
#include "idem/error.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

using namespace std::string_literals;

// Each string means something to some layer: C strings, UTF-8 decoders, SQL (quotes,
// comments, dollar quoting, LIKE wildcards), Lua (long brackets, patterns), RESP and the
// Redis key layout (braces are a hash tag, ':' and '%' its separators), terminals, paths.
std::vector<std::string> hostile_strings() {
  return {"\0"s,
          "\0\0\0"s,
          "a\0"s,
          "\0a"s,
          "a\0b"s,
          "\x80"s,
          "\xc0\xaf"s,
          "\xe2\x82"s,
          "\xed\xa0\x80"s,
          "\xf4\x90\x80\x80"s,
          "\xfe\xff\xff\xfe"s,
          "\xef\xbb\xbf"s,
          "\xc2\x85"s,
          "'"s,
          "''"s,
          "\""s,
          "'; DELETE FROM idem_records; --"s,
          "') OR ('1'='1"s,
          "$1"s,
          "$$ x $$"s,
          "\\"s,
          "\\x00"s,
          "E'\\\\'"s,
          "/* */ --"s,
          ";"s,
          "%"s,
          "_"s,
          "NULL"s,
          "]]"s,
          "[["s,
          "--[==["s,
          "%z%d%%"s,
          "redis.call('FLUSHALL')"s,
          "return redis.call('DEL', KEYS[1])"s,
          "\r\n*1\r\n$8\r\nFLUSHALL\r\n"s,
          "{"s,
          "}"s,
          "{}"s,
          ":"s,
          "%3A"s,
          "%7B"s,
          "*"s,
          "?"s,
          "[a-z]"s,
          "%s%n"s,
          "$(reboot)"s,
          "../../etc/passwd"s,
          "\n"s,
          "\r"s,
          "\t"s,
          "\x1b[2J"s,
          "\x7f"s};
}

// `size` bytes made of the hostile strings one after another.
std::string hostile_bytes(std::size_t size, std::size_t start) {
  const std::vector<std::string> parts = hostile_strings();
  std::string out;
  for (std::size_t i = start; out.size() < size; ++i) out += parts[i % parts.size()];
  out.resize(size);
  return out;
}

// A completed record and one in progress that no hostile call may touch.
struct Bystanders {
  Token in_progress_token = 0;
  Record complete;
  Record in_progress;
};

Bystanders make_bystanders(Store& store, Duration live) {
  Bystanders b;
  const AcquireResult done = store.acquire("bystander", "done", live, live);
  EXPECT_THAT(done, IsFreshlyAcquired());
  EXPECT_THAT(store.complete("bystander", "done", std::get<Acquired>(done).lease.token,
                             "untouched \0 payload"s, live),
              IsDone());
  const AcquireResult running = store.acquire("bystander", "running", live, live, "fp");
  EXPECT_THAT(running, IsFreshlyAcquired());
  b.in_progress_token = std::get<Acquired>(running).lease.token;
  b.complete = store.get("bystander", "done").value();
  b.in_progress = store.get("bystander", "running").value();
  return b;
}

// `same` is the fixture's expect_same_record.
void expect_untouched(Store& store, const Bystanders& b, Duration live,
                      const std::function<void(const Record&, const Record&)>& same) {
  const std::optional<Record> done = store.get("bystander", "done");
  const std::optional<Record> running = store.get("bystander", "running");
  ASSERT_TRUE(done && running) << "a bystander record vanished";
  same(b.complete, *done);
  same(b.in_progress, *running);
  EXPECT_THAT(store.acquire("bystander", "done", live, live), IsReplay("untouched \0 payload"s));
}

// Expects `call` to throw InvalidArgument naming `argument`.
void expect_invalid(const std::function<void()>& call, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "no exception, expected an invalid " << argument;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

// expect_untouched with the fixture's expect_same_record (a protected member).
#define IDEM_BYSTANDERS_UNTOUCHED(b)   \
  expect_untouched(store(), b, live(), \
                   [this](const Record& x, const Record& y) { expect_same_record(x, y); })

TEST_P(StoreConformance, HostileBytesAreStoredAsDataInEveryField) {
  // Every hostile string as scope, key, fingerprint and payload at once; each record comes
  // back byte for byte and separately from the others.
  const Bystanders bystanders = make_bystanders(store(), live());
  const std::vector<std::string> hostile = hostile_strings();
  for (std::size_t i = 0; i < hostile.size(); ++i) {
    const std::string& h = hostile[i];
    const Lease lease = acquire_fresh(h, h, live(), live(), h);
    ASSERT_THAT(store().extend(h, h, lease.token, live()), IsDone()) << i;
    ASSERT_THAT(store().complete(h, h, lease.token, h + all_bytes(), live()), IsDone()) << i;
  }
  for (std::size_t i = 0; i < hostile.size(); ++i) {
    SCOPED_TRACE("hostile string " + std::to_string(i));
    const std::string& h = hostile[i];
    const AcquireResult r = store().acquire(h, h, live(), live(), h);
    ASSERT_THAT(r, IsReplay(h + all_bytes()));
    EXPECT_EQ(std::get<Replay>(r).fingerprint, h);
    const Record rec = expect_record(h, h);
    EXPECT_TRUE(rec.payload == h + all_bytes());
    EXPECT_EQ(rec.fingerprint, h);
  }
  // Forgetting every other one leaves the rest.
  for (std::size_t i = 0; i < hostile.size(); i += 2)
    EXPECT_TRUE(store().forget(hostile[i], hostile[i]));
  for (std::size_t i = 0; i < hostile.size(); ++i) {
    EXPECT_EQ(store().get(hostile[i], hostile[i]).has_value(), i % 2 == 1) << i;
  }
  IDEM_BYSTANDERS_UNTOUCHED(bystanders);
}

TEST_P(StoreConformance, HostileScopesAndKeysAtTheLimitsWorkAndOneOverIsRefused) {
  const Bystanders bystanders = make_bystanders(store(), live());
  const std::string scope = hostile_bytes(kMaxScopeBytes, 0);
  const std::string key = hostile_bytes(kMaxKeyBytes, 7);
  // The same bytes one longer, with a NUL: a store that counted up to a NUL or cut at the
  // limit would see the record above.
  const std::string long_scope = scope + "\0"s;
  const std::string long_key = key + "\0"s;

  const Lease lease = acquire_fresh(scope, key, live(), live(), hostile_bytes(4096, 3));
  ASSERT_THAT(store().complete(scope, key, lease.token, hostile_bytes(100'000, 5), live()),
              IsDone());
  EXPECT_THAT(store().acquire(scope, key, live(), live()), IsReplay(hostile_bytes(100'000, 5)));
  EXPECT_EQ(expect_record(scope, key).fingerprint, hostile_bytes(4096, 3));

  for (const auto& c : {std::tuple{long_scope, key, "scope"s}, std::tuple{scope, long_key, "key"s},
                        std::tuple{long_scope, long_key, "scope"s}}) {
    // Named references, not a structured binding: the lambdas below capture them, which
    // clang 14 (scripts/tidy.sh) does not take for a binding.
    const std::string& s = std::get<0>(c);
    const std::string& k = std::get<1>(c);
    const std::string& argument = std::get<2>(c);
    expect_invalid([&] { store().acquire(s, k, live(), live()); }, argument);
    expect_invalid([&] { (void)store().complete(s, k, lease.token, "p", live()); }, argument);
    expect_invalid([&] { (void)store().release(s, k, lease.token); }, argument);
    expect_invalid([&] { (void)store().extend(s, k, lease.token, live()); }, argument);
    expect_invalid([&] { (void)store().get(s, k); }, argument);
    expect_invalid([&] { (void)store().forget(s, k); }, argument);
    const ExtendRequest batch[] = {{scope, key, lease.token, live()}, {s, k, lease.token, live()}};
    expect_invalid([&] { (void)store().extend_many(batch); }, argument);
  }
  EXPECT_THAT(store().acquire(scope, key, live(), live()), IsReplay(hostile_bytes(100'000, 5)));
  IDEM_BYSTANDERS_UNTOUCHED(bystanders);
}

TEST_P(StoreConformance, ForgedTokensAreFenced) {
  // A caller that guesses, wraps or overflows a token never gets another's lease: near
  // misses, the sign bit (PostgreSQL's int8), 2^53 (Lua numbers are doubles), the extremes.
  const Bystanders bystanders = make_bystanders(store(), live());
  const Lease lease = acquire_fresh("s", "k", live(), live());
  const Record before = expect_record("s", "k");
  const Token t = lease.token;
  constexpr Token k53 = Token{1} << 53;
  constexpr Token k63 = Token{1} << 63;
  const std::vector<Token> forged = {0,
                                     1,
                                     t - 1,
                                     t + 1,
                                     t ^ 1,
                                     t + k53,
                                     t ^ k53,
                                     t | k63,
                                     t + k63,
                                     k53,
                                     k53 + 1,
                                     k63,
                                     k63 - 1,
                                     k63 + 1,
                                     std::numeric_limits<Token>::max(),
                                     std::numeric_limits<Token>::max() - 1,
                                     bystanders.in_progress_token};
  for (const Token f : forged) {
    if (f == t) continue;
    SCOPED_TRACE("forged token " + std::to_string(f));
    EXPECT_THAT(store().complete("s", "k", f, "forged", live()), IsFenced());
    EXPECT_THAT(store().extend("s", "k", f, live()), IsFenced());
    EXPECT_THAT(store().release("s", "k", f), IsFenced());
    const ExtendRequest batch[] = {{"s", "k", f, live()}};
    const std::vector<ExtendResult> results = store().extend_many(batch);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_THAT(results[0], IsFenced());
  }
  expect_same_record(before, expect_record("s", "k"));
  EXPECT_THAT(store().complete("s", "k", t, "real", live()), IsDone());
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("real"));
  IDEM_BYSTANDERS_UNTOUCHED(bystanders);
}

TEST_P(StoreConformance, ExtremeDurationsAreRefusedBeforeAnyWrite) {
  const Bystanders bystanders = make_bystanders(store(), live());
  const Lease lease = acquire_fresh("s", "k", live(), live());
  const Record before = expect_record("s", "k");
  const std::vector<Duration> extreme = {Duration::max(),
                                         Duration::min(),
                                         Duration{std::numeric_limits<std::int32_t>::max()} * 1000,
                                         Duration::max() / 2,
                                         -kMaxDuration,
                                         kMaxDuration * 2,
                                         Duration::min() + Duration{1}};
  for (const Duration d : extreme) {
    SCOPED_TRACE(std::to_string(d.count()) + " ms");
    expect_invalid([&] { store().acquire("s", "new", d, live()); }, "lease duration");
    expect_invalid([&] { store().acquire("s", "new", live(), d); }, "ttl");
    expect_invalid([&] { store().acquire("s", "k", d, d); }, "lease duration");
    expect_invalid([&] { (void)store().complete("s", "k", lease.token, "p", d); }, "ttl");
    expect_invalid([&] { (void)store().extend("s", "k", lease.token, d); }, "lease duration");
    const ExtendRequest batch[] = {{"s", "k", lease.token, live()}, {"s", "k", lease.token, d}};
    expect_invalid([&] { (void)store().extend_many(batch); }, "lease duration");
  }
  EXPECT_EQ(store().get("s", "new"), std::nullopt);
  expect_same_record(before, expect_record("s", "k"));
  IDEM_BYSTANDERS_UNTOUCHED(bystanders);
}

TEST_P(StoreConformance, EnormousPurgeLimitsWork) {
  // A limit the store's own integer types cannot hold (SQLite's and PostgreSQL's int8,
  // a 32-bit count) deletes what has expired and nothing else.
  const Bystanders bystanders = make_bystanders(store(), live());
  const std::vector<std::size_t> limits = {std::numeric_limits<std::size_t>::max(),
                                           std::size_t{1} << 63, (std::size_t{1} << 32) + 1,
                                           std::size_t{1} << 31};
  for (std::size_t round = 0; round < limits.size(); ++round) {
    SCOPED_TRACE("limit " + std::to_string(limits[round]));
    for (int i = 0; i < 3; ++i) {
      acquire_and_complete("expiring", std::to_string(round) + "-" + std::to_string(i), "p",
                           ticks(2));
    }
    pass(ticks(3));
    const std::size_t deleted = store().purge(limits[round]);
    if (native_expiry()) {
      EXPECT_LE(deleted, 3u);
    } else {
      EXPECT_EQ(deleted, 3u);
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(store().get("expiring", std::to_string(round) + "-" + std::to_string(i)),
                std::nullopt);
    }
  }
  IDEM_BYSTANDERS_UNTOUCHED(bystanders);
}

}  // namespace
}  // namespace idem::testing
