#pragma once

// The proxy's log lines (docs/proxy.md, "Health, metrics and logs"): one event a line, in
// logfmt or JSON, each with a timestamp and a level. The error log (startup, shutdown,
// what went wrong inside a request, under its request id) is always on; the access log adds
// one line per request. Lines are written whole with one call, so lines from many threads
// never interleave.

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "options.h"

namespace idem::proxy {

enum class Level { kInfo, kWarn, kError };

// One key=value of a line. `number`: written bare (JSON numbers), else as a string.
struct Field {
  std::string_view name;
  std::string value;
  bool number = false;
};

class Logger {
 public:
  // `write` receives each line, newline included.
  Logger(LogFormat format, std::function<void(std::string_view)> write)
      : format_(format), write_(std::move(write)) {}

  void log(Level level, std::string_view message, const std::vector<Field>& fields = {}) const;
  void info(std::string_view message, const std::vector<Field>& fields = {}) const {
    log(Level::kInfo, message, fields);
  }
  void warn(std::string_view message, const std::vector<Field>& fields = {}) const {
    log(Level::kWarn, message, fields);
  }
  void error(std::string_view message, const std::vector<Field>& fields = {}) const {
    log(Level::kError, message, fields);
  }

  // The line log() would write, without the newline (for tests).
  std::string line(Level level, std::string_view message, const std::vector<Field>& fields) const;

 private:
  LogFormat format_;
  std::function<void(std::string_view)> write_;
};

// A duration in milliseconds with three decimals, for a Field marked as a number.
std::string millis(double ms);

}  // namespace idem::proxy
