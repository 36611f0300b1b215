#include "soak/soak_log.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <utility>

namespace idem::soak {

std::string digest(std::string_view bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::string make_payload(Token token, std::string_view key, std::string_view filler) {
  std::string p = std::to_string(token);
  p += '|';
  p += key;
  p += '|';
  p += filler;
  return p;
}

std::optional<Token> payload_token(std::string_view payload) {
  const std::size_t bar = payload.find('|');
  if (bar == 0 || bar == std::string_view::npos || bar > 20) return std::nullopt;
  Token t = 0;
  for (char c : payload.substr(0, bar)) {
    if (c < '0' || c > '9') return std::nullopt;
    t = t * 10 + static_cast<Token>(c - '0');
  }
  return t;
}

std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

struct Ran {
  std::int64_t wall = 0;
  std::string digest;
};

struct Replay {
  std::string key;
  Token token = 0;
  std::string digest;
  std::int64_t call_wall = 0;
  std::optional<std::int64_t> completed_at;
  std::optional<std::int64_t> expires_at;
};

struct Done {
  std::string key;
  Token token = 0;
  std::string digest;
};

std::optional<std::int64_t> optional_ms(const std::string& field) {
  if (field == "-") return std::nullopt;
  return std::stoll(field);
}

// Every line of every log, whole lines only; counts the torn last lines.
std::vector<std::string> whole_lines(const std::vector<std::string>& logs, long long* torn) {
  std::vector<std::string> lines;
  for (const std::string& log : logs) {
    std::size_t start = 0;
    while (start < log.size()) {
      const std::size_t nl = log.find('\n', start);
      if (nl == std::string::npos) {
        ++*torn;
        break;
      }
      if (nl > start) lines.push_back(log.substr(start, nl - start));
      start = nl + 1;
    }
  }
  return lines;
}

class Checker {
 public:
  Checker(const SoakRules& rules, SoakReport& report) : rules_(rules), report_(report) {}

  void read(const std::string& line) {
    std::istringstream in(line);
    std::string what, key;
    in >> what;
    try {
      if (what == "purge") {
        long long n = -1;
        in >> n;
        if (!in || n < 0) return bad(line);
        report_.purged += n;
        return;
      }
      in >> key;
      if (!in || key.empty()) return bad(line);
      keys_.insert(key);
      if (what == "ran") {
        Token token = 0;
        int attempt = 0, stolen = -1;
        Ran r;
        in >> token >> attempt >> stolen >> r.wall >> r.digest;
        if (!in) return bad(line);
        ++report_.ran;
        if ((stolen == 1) != (attempt > 1)) {
          violation("key " + key + ": token " + std::to_string(token) + " ran as attempt " +
                    std::to_string(attempt) + " with stolen=" + std::to_string(stolen));
        }
        if (!ran_[key].emplace(token, r).second) {
          violation("key " + key + ": two actions ran with token " + std::to_string(token));
        }
        auto [it, fresh] = token_key_.emplace(token, key);
        if (!fresh && it->second != key && rules_.unique_tokens_store_wide) {
          violation("token " + std::to_string(token) + " was issued for keys " + it->second +
                    " and " + key + " (the store promises tokens unique across keys)");
        }
      } else if (what == "done") {
        Done d{key, 0, {}};
        in >> d.token >> d.digest;
        if (!in) return bad(line);
        ++report_.completed;
        done_.push_back(std::move(d));
      } else if (what == "replay") {
        Replay r{key, 0, {}, 0, {}, {}};
        std::string completed, expires;
        in >> r.token >> r.digest >> r.call_wall >> completed >> expires;
        if (!in) return bad(line);
        r.completed_at = optional_ms(completed);
        r.expires_at = optional_ms(expires);
        ++report_.replays;
        replays_.push_back(std::move(r));
      } else if (what == "fail") {
        ++report_.released;
      } else if (what == "busy") {
        ++report_.busy;
      } else if (what == "lost") {
        ++report_.lost;
      } else if (what == "unavailable") {
        ++report_.unavailable;
      } else if (what == "error") {
        ++report_.calls;
        violation("unexpected error: " + line);
        return;
      } else {
        return bad(line);
      }
      if (what != "ran") ++report_.calls;
    } catch (const std::exception&) {
      bad(line);
    }
  }

  void check(const std::map<std::string, FinalRecord>& final_records, std::int64_t checked_at) {
    report_.keys = keys_.size();
    // Each completion and replay names the action that made its payload.
    for (const Done& d : done_) {
      if (find(d.key, d.token, d.digest, "a completion") != nullptr) {
        completed_[d.key].insert(d.token);
      }
    }
    for (const Replay& p : replays_) {
      const Ran* r = find(p.key, p.token, p.digest, "a replay");
      if (r == nullptr) continue;
      completed_[p.key].insert(p.token);
      if (!p.completed_at || !p.expires_at) continue;
      const std::string what = "key " + p.key + ": a replay of token " + std::to_string(p.token);
      const std::int64_t ttl = rules_.ttl_of(p.key);
      if (std::llabs(*p.expires_at - *p.completed_at - ttl) > rules_.slack_ms) {
        violation(what + " expires " + std::to_string(*p.expires_at - *p.completed_at) +
                  " ms after it completed, not its TTL of " + std::to_string(ttl) + " ms");
      }
      if (*p.expires_at + rules_.slack_ms <= p.call_wall) {
        violation(what + " had expired " + std::to_string(p.call_wall - *p.expires_at) +
                  " ms before the call began");
      }
      if (*p.completed_at + rules_.slack_ms < r->wall) {
        violation(what + " completed " + std::to_string(r->wall - *p.completed_at) +
                  " ms before its action made the payload");
      }
    }
    for (const auto& [key, rec] : final_records) {
      if (!rec.complete) continue;
      if (find(key, rec.token, rec.digest, "the final record") != nullptr) {
        completed_[key].insert(rec.token);
      }
    }

    for (const auto& [key, tokens] : completed_) {
      const std::map<Token, Ran>& runs = ran_[key];
      const std::int64_t ttl = rules_.ttl_of(key);
      // After a completion, the key replays until its TTL has passed: any later lease means
      // a second completion, or a record that vanished or was overwritten early.
      for (Token t1 : tokens) {
        const Ran& first = runs.at(t1);
        for (auto it = runs.upper_bound(t1); it != runs.end(); ++it) {
          const std::int64_t gap = it->second.wall - first.wall;
          if (gap + rules_.slack_ms < ttl) {
            violation("key " + key + ": token " + std::to_string(it->first) + " ran " +
                      std::to_string(gap) + " ms after token " + std::to_string(t1) +
                      " completed it, within its TTL of " + std::to_string(ttl) + " ms");
          }
        }
      }
      // The last completion must still be there unless its TTL may have passed.
      const Token last = *tokens.rbegin();
      if (runs.at(last).wall + ttl - rules_.slack_ms > checked_at) {
        auto f = final_records.find(key);
        if (f == final_records.end() || !f->second.complete || f->second.token != last) {
          violation("key " + key + ": completed by token " + std::to_string(last) +
                    " within its TTL, but the store's record after the soak is " +
                    (f == final_records.end()
                         ? std::string("gone")
                         : (f->second.complete ? "complete" : "in progress") +
                               std::string(" with token ") + std::to_string(f->second.token)));
        }
      }
    }
  }

  const std::set<std::string>& keys() const { return keys_; }

 private:
  void bad(const std::string& line) { violation("a log line that does not parse: " + line); }
  void violation(std::string v) { report_.violations.push_back(std::move(v)); }

  // The action that ran on `key` with `token`, when it made the payload with `digest`;
  // otherwise records a violation for `what` and returns null.
  const Ran* find(const std::string& key, Token token, const std::string& digest,
                  const std::string& what) {
    const Ran* r = nullptr;
    if (auto k = ran_.find(key); k != ran_.end()) {
      if (auto t = k->second.find(token); t != k->second.end()) r = &t->second;
    }
    if (r == nullptr) {
      violation("key " + key + ": " + what + " carries token " + std::to_string(token) +
                ", but no action ran with it");
      return nullptr;
    }
    if (r->digest != digest) {
      violation("key " + key + ": " + what + " of token " + std::to_string(token) +
                " has payload " + digest + ", but its action made " + r->digest);
      return nullptr;
    }
    return r;
  }

  const SoakRules& rules_;
  SoakReport& report_;
  std::set<std::string> keys_;
  std::map<std::string, std::map<Token, Ran>> ran_;
  std::map<Token, std::string> token_key_;
  std::vector<Done> done_;
  std::vector<Replay> replays_;
  std::map<std::string, std::set<Token>> completed_;
};

}  // namespace

SoakReport check_soak(const std::vector<std::string>& logs,
                      const std::map<std::string, FinalRecord>& final_records,
                      std::int64_t checked_at_ms, const SoakRules& rules) {
  SoakReport report;
  Checker checker(rules, report);
  for (const std::string& line : whole_lines(logs, &report.torn)) checker.read(line);
  checker.check(final_records, checked_at_ms);
  return report;
}

std::vector<std::string> keys_in_logs(const std::vector<std::string>& logs) {
  long long torn = 0;
  std::set<std::string> keys;
  for (const std::string& line : whole_lines(logs, &torn)) {
    std::istringstream in(line);
    std::string what, key;
    in >> what >> key;
    if (what != "purge" && !key.empty()) keys.insert(key);
  }
  return {keys.begin(), keys.end()};
}

}  // namespace idem::soak
