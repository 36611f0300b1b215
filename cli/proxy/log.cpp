#include "log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

namespace idem::proxy {

namespace {

const char* name_of(Level level) {
  switch (level) {
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

// RFC 3339 in UTC with milliseconds: 2026-12-03T09:58:29.707Z.
std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch());
  const std::time_t seconds = static_cast<std::time_t>(ms.count() / 1000);
  std::tm tm{};
  ::gmtime_r(&seconds, &tm);
  char out[96];
  std::snprintf(out, sizeof out, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms.count() % 1000));
  return out;
}

// A logfmt value: bare when it can be, else quoted with \" \\ \n \t and \xNN escapes.
void logfmt_value(std::string& out, std::string_view value) {
  bool bare = !value.empty();
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || c == '"' || c == '=' || c == '\\') bare = false;
  }
  if (bare) {
    out += value;
    return;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0x0f];
    } else {
      out += c;
    }
  }
  out += '"';
}

}  // namespace

std::string Logger::line(Level level, std::string_view message,
                         const std::vector<Field>& fields) const {
  if (format_ == LogFormat::kJson) {
    nlohmann::ordered_json j;
    j["ts"] = timestamp();
    j["level"] = name_of(level);
    j["msg"] = message;
    for (const Field& f : fields) {
      if (f.number) {
        j[std::string(f.name)] = nlohmann::ordered_json::parse(f.value, nullptr, false);
      } else {
        j[std::string(f.name)] = f.value;
      }
    }
    // Bytes a client sent may not be UTF-8: replaced, never thrown on.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string out = "ts=" + timestamp() + " level=" + name_of(level) + " msg=";
  logfmt_value(out, message);
  for (const Field& f : fields) {
    out += ' ';
    out += f.name;
    out += '=';
    logfmt_value(out, f.value);
  }
  return out;
}

void Logger::log(Level level, std::string_view message, const std::vector<Field>& fields) const {
  if (!write_) return;
  std::string text = line(level, message, fields);
  text += '\n';
  write_(text);
}

std::string millis(double ms) {
  char out[32];
  std::snprintf(out, sizeof out, "%.3f", ms);
  return out;
}

}  // namespace idem::proxy
