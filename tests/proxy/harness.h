#pragma once

// What the end-to-end tests of `idem proxy` stand on: a scratch directory, processes whose
// output goes to files (the upstream, the proxy, curl), and HTTP clients (Beast's, and
// curl). Nothing here waits on a clock to pass; every wait is for a condition, with a bound
// only a broken implementation reaches.

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/eventually.h"
#include "test_body.h"

namespace idem::proxy::test {

namespace fs = std::filesystem;
using idem::testing::eventually;

std::string read_file(const fs::path& path);

// A temporary directory, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

// A process started in the background with its standard output and error in files.
class Child {
 public:
  // `env`: NAME=value entries added to (or replacing those of) this process's environment.
  Child(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err,
        const std::vector<std::string>& env = {});
  // Ends the process (SIGKILL) if it is still running.
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const;
  // Waits for the process to end and returns its status as a shell shows it (128 + signal
  // when killed); kills it first with SIGKILL after `bound`, so a hang fails the test.
  int wait(std::chrono::seconds bound = std::chrono::seconds(60));
  bool running();

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// Runs a process to its end; returns its status.
int run(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err);

// tests/proxy/upstream_main.cpp, run as a process in `dir`.
class Upstream {
 public:
  explicit Upstream(const fs::path& dir);
  std::uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // The lines it logged, one per request it executed (see upstream_main.cpp).
  std::vector<std::vector<std::string>> executions() const;
  // How many requests with Idempotency-Key `key` it executed (the key as sent, quotes and
  // all).
  int executions_of(const std::string& key) const;
  // Waits until it has executed `n` requests with that key.
  bool wait_for(const std::string& key, int n) const;
  void open_gate(const std::string& name) const;
  // Targets of X-Test-Announce requests whose header arrived (their body may not have).
  std::string announced() const;
  // SIGKILL, as a crash would end it.
  void kill();
  // Starts again on the same port, keeping the log.
  void restart();

 private:
  void start();
  fs::path dir_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Child> child_;
  int starts_ = 0;
};

// `idem proxy` as a process, listening on a free port.
class ProxyProcess {
 public:
  // `wrapper`: a command that runs the proxy (prlimit, say), in front of it on the line.
  ProxyProcess(const fs::path& dir, const std::string& name, const std::string& upstream_url,
               const std::string& store_url, const std::vector<std::string>& options,
               const std::vector<std::string>& wrapper = {});
  // `idem proxy` with exactly `args` and `env` added to the environment: no defaults of the
  // harness (listen address, upstream, store, access log) but what they say.
  struct Exactly {};
  ProxyProcess(Exactly, const fs::path& dir, const std::string& name,
               const std::vector<std::string>& args, const std::vector<std::string>& env);
  std::uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // The admin listener's port (--admin 127.0.0.1:0), from the log.
  std::uint16_t admin_port() const;
  void signal(int sig) const { child_->signal(sig); }
  int wait() { return child_->wait(); }
  std::string log() const { return read_file(err_); }
  bool logged(const std::string& text) const;

 private:
  void wait_until_listening();
  fs::path err_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Child> child_;
};

// An HTTP answer as a client saw it.
struct Reply {
  unsigned status = 0;
  // Headers in the order received, names as sent.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Set when the exchange failed (connection refused, closed before an answer).
  std::string error;

  // The value of the header `name` (case-insensitive), if present; the first of several.
  std::optional<std::string> header(const std::string& name) const;
  int count(const std::string& name) const;
  bool replayed() const { return header("Idempotent-Replayed") == std::string("true"); }
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// Beast's synchronous client over one kept-alive connection. Requests carry Host: 127.0.0.1
// unless `headers` name a Host (or several) themselves.
class Client {
 public:
  explicit Client(std::uint16_t port);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  Reply send(const std::string& method, const std::string& target, const Headers& headers = {},
             const std::string& body = {});
  // Whether the server closed the connection after the last answer.
  bool closed() const { return closed_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool closed_ = false;
};

// One request on a connection of its own.
Reply request(std::uint16_t port, const std::string& method, const std::string& target,
              const Headers& headers = {}, const std::string& body = {});

// Writes `bytes` as they are on a connection of its own and reads one answer: for requests
// a well-behaved client would never build (two Host lines, a chunked body with a trailer).
Reply raw_request(std::uint16_t port, const std::string& bytes);

// Connects, sends nothing, and waits up to `bound` for the server to close the connection;
// returns how the wait ended ("end of file" when it closed).
std::string idle_connection_ends(std::uint16_t port, std::chrono::seconds bound);

// A client connection read as bytes arrive, for answers that stream: the test sends what it
// likes and waits for text to arrive.
class RawConnection {
 public:
  explicit RawConnection(std::uint16_t port);
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  void send(const std::string& bytes);
  // Reads until `text` is among the bytes received; false when `bound` passed (or the
  // connection ended) first.
  bool read_until(const std::string& text,
                  std::chrono::milliseconds bound = std::chrono::seconds(30));
  // Everything received so far (since the last forget()).
  const std::string& received() const { return received_; }
  // Drops what was received, for the next answer on the same connection.
  void forget() { received_.clear(); }

 private:
  int fd_ = -1;
  std::string received_;
};

// A port nothing listens on right now (bound and released), for servers a test starts.
std::uint16_t free_port();

// Whether a TCP connection to the port is refused.
bool refuses_connections(std::uint16_t port);

// curl -sS: `args` go between the fixed options and the URL; the answer's headers and body
// come back from files in `dir` (byte for byte: curl writes the body with -o).
Reply curl(const fs::path& dir, const std::string& url, const std::vector<std::string>& args);

}  // namespace idem::proxy::test
