// The deployment examples of docs/proxy.md ("Deploying") run here, as far as a machine
// without systemd as PID 1 or a Kubernetes cluster allows:
//
//  - examples/proxy/idem-proxy.service: `systemd-analyze verify` accepts it, and its
//    ExecStart= and Environment= lines run the built binary (only the addresses and the
//    store swapped for the test's), which notifies readiness, pings the watchdog and says it
//    is stopping over a NOTIFY_SOCKET this test listens on, as systemd would.
//  - examples/proxy/kubernetes.yaml: the sidecar container's command, args and environment
//    run the built binary (PyYAML reads the manifest), its probes get 200 from the admin
//    listener, and the ports and grace period agree with the arguments.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

#ifndef IDEM_EXAMPLES_DIR
#error "IDEM_EXAMPLES_DIR is set by tests/proxy/CMakeLists.txt"
#endif

namespace idem::proxy::test {
namespace {

using ::testing::HasSubstr;

const fs::path kUnit = fs::path(IDEM_EXAMPLES_DIR) / "idem-proxy.service";
const fs::path kManifest = fs::path(IDEM_EXAMPLES_DIR) / "kubernetes.yaml";

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The value of `key=` lines of the unit, in order.
std::vector<std::string> unit_values(const std::string& unit, const std::string& key) {
  std::vector<std::string> out;
  std::istringstream in(unit);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + "=", 0) == 0) out.push_back(line.substr(key.size() + 1));
  }
  return out;
}

// Seconds of a systemd or idem duration such as "20s" or "30".
int seconds_of(const std::string& text) {
  std::smatch m;
  if (!std::regex_match(text, m, std::regex("([0-9]+)(s?)"))) {
    ADD_FAILURE() << "not a duration in whole seconds: " << text;
    return 0;
  }
  return std::stoi(m[1]);
}

// Replaces the value of `option` ("--listen X" or "--listen=X"); fails the test when the
// command line lacks it, since then the example would not say what the test checks.
void replace_option(std::vector<std::string>& args, const std::string& option,
                    const std::string& value) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == option && i + 1 < args.size()) {
      args[i + 1] = value;
      return;
    }
    if (args[i].rfind(option + "=", 0) == 0) {
      args[i] = option + "=" + value;
      return;
    }
  }
  ADD_FAILURE() << "the example's command line has no " << option;
}

std::string option_value(const std::vector<std::string>& args, const std::string& option) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == option && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind(option + "=", 0) == 0) return args[i].substr(option.size() + 1);
  }
  return {};
}

// A datagram socket standing in for systemd's NOTIFY_SOCKET: like the service manager, it
// reads every message as it comes (sd_notify blocks a sender whose reader has stopped).
class NotifySocket {
 public:
  explicit NotifySocket(const fs::path& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      throw std::runtime_error("cannot bind " + path.string());
    }
    reader_ = std::thread([this] { read(); });
  }
  ~NotifySocket() {
    stop_ = true;
    reader_.join();
    ::close(fd_);
  }
  const fs::path& path() const { return path_; }

  // The first message not taken yet that holds `text` (the ones before it are skipped),
  // or "" when none came within 30 s.
  std::string until(const std::string& text) {
    std::unique_lock<std::mutex> lock(mu_);
    std::string found;
    cv_.wait_for(lock, std::chrono::seconds(30), [&] {
      while (next_ < messages_.size()) {
        if (messages_[next_++].find(text) != std::string::npos) {
          found = messages_[next_ - 1];
          return true;
        }
      }
      return false;
    });
    return found;
  }

 private:
  void read() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) continue;
      {
        std::lock_guard<std::mutex> lock(mu_);
        messages_.emplace_back(buffer, static_cast<std::size_t>(n));
      }
      cv_.notify_all();
    }
  }

  fs::path path_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> messages_;  // guarded by mu_
  std::size_t next_ = 0;               // guarded by mu_
  std::thread reader_;
};

class DeployTest : public ::testing::Test {
 protected:
  DeployTest() : upstream_(dir_.path()) {}
  std::string store_url() const { return "sqlite://" + (dir_ / "idem.db").string(); }
  ScratchDir dir_;
  Upstream upstream_;
};

TEST_F(DeployTest, SystemdAcceptsTheUnit) {
  ASSERT_TRUE(fs::exists("/usr/bin/systemd-analyze"))
      << "systemd-analyze is missing (Debian's systemd package, in scripts/deps.sh)";
  // The unit as installed, but running the binary this build made.
  std::string unit = read_file(kUnit);
  const std::string installed = "ExecStart=/usr/bin/idem ";
  ASSERT_NE(unit.find(installed), std::string::npos);
  unit.replace(unit.find(installed), installed.size(),
               "ExecStart=" + std::string(IDEM_BINARY) + " ");
  const fs::path copy = dir_ / "idem-proxy.service";
  std::ofstream(copy) << unit;
  const int status = run({"/usr/bin/systemd-analyze", "verify", copy.string()}, dir_ / "verify.out",
                         dir_ / "verify.err");
  EXPECT_EQ(status, 0) << read_file(dir_ / "verify.err");
  EXPECT_EQ(read_file(dir_ / "verify.err"), "");
}

TEST_F(DeployTest, SystemdUnitRunsNotifiesReadinessPingsTheWatchdogAndStopsOnSigterm) {
#if !IDEM_PROXY_SYSTEMD
  GTEST_SKIP() << "this build has no sd_notify support (IDEM_WITH_SYSTEMD)";
#endif
  const std::string unit = read_file(kUnit);
  EXPECT_EQ(unit_values(unit, "Type"), std::vector<std::string>{"notify"});
  EXPECT_EQ(unit_values(unit, "KillSignal"), std::vector<std::string>{"SIGTERM"});
  ASSERT_EQ(unit_values(unit, "ExecStart").size(), 1u);
  std::vector<std::string> args = words(unit_values(unit, "ExecStart")[0]);
  ASSERT_GE(args.size(), 2u);
  EXPECT_EQ(args[0], "/usr/bin/idem");
  EXPECT_EQ(args[1], "proxy");
  // systemd waits TimeoutStopSec= after SIGTERM: the drain must fit in it.
  ASSERT_EQ(unit_values(unit, "TimeoutStopSec").size(), 1u);
  EXPECT_LT(seconds_of(option_value(args, "--drain-timeout")),
            seconds_of(unit_values(unit, "TimeoutStopSec")[0]));
  ASSERT_EQ(unit_values(unit, "WatchdogSec").size(), 1u);

  // The test's addresses and store; everything else as the unit says.
  args.erase(args.begin(), args.begin() + 2);
  replace_option(args, "--listen", "127.0.0.1:0");
  replace_option(args, "--upstream", upstream_.url());
  replace_option(args, "--store", store_url());
  replace_option(args, "--admin", "127.0.0.1:0");
  NotifySocket notify(dir_ / "notify.sock");
  std::vector<std::string> env = unit_values(unit, "Environment");
  // As systemd sets them for Type=notify and WatchdogSec= (here 0.2 s rather than the
  // unit's, so the test sees pings soon).
  env.push_back("NOTIFY_SOCKET=" + notify.path().string());
  env.push_back("WATCHDOG_USEC=200000");

  ProxyProcess proxy(ProxyProcess::Exactly{}, dir_.path(), "unit", args, env);
  const std::string ready = notify.until("READY=1");
  EXPECT_THAT(ready, HasSubstr("STATUS=listening on 127.0.0.1:"));
  // Ready means serving, on both listeners.
  EXPECT_EQ(request(proxy.port(), "GET", "/ping").status, 200u);
  EXPECT_EQ(request(proxy.admin_port(), "GET", "/readyz").status, 200u);
  EXPECT_THAT(notify.until("WATCHDOG=1"), HasSubstr("WATCHDOG=1"));
  EXPECT_THAT(notify.until("WATCHDOG=1"), HasSubstr("WATCHDOG=1"));
  // Environment= applied: the log is JSON.
  EXPECT_TRUE(proxy.logged("\"level\":\"info\""));

  proxy.signal(SIGTERM);
  EXPECT_THAT(notify.until("STOPPING=1"), HasSubstr("STATUS=SIGTERM: draining"));
  EXPECT_EQ(proxy.wait(), 0);
}

// The sidecar container of the manifest, as JSON: command, args, env (a value, or null for
// one from a Secret), ports by name, the probes, and the pod's grace period.
nlohmann::json sidecar(const fs::path& dir) {
  static constexpr const char* kScript = R"PY(
import json, sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc.get("kind") != "Deployment":
        continue
    spec = doc["spec"]["template"]["spec"]
    for c in spec["containers"]:
        if c["name"] != "idem-proxy":
            continue
        print(json.dumps({
            "command": c["command"], "args": c["args"],
            "env": {e["name"]: e.get("value") for e in c.get("env", [])},
            "ports": {p["name"]: p["containerPort"] for p in c["ports"]},
            "readiness": c["readinessProbe"]["httpGet"], "liveness": c["livenessProbe"]["httpGet"],
            "grace": spec["terminationGracePeriodSeconds"]}))
)PY";
  const int status = run({"/usr/bin/python3", "-c", kScript, kManifest.string()},
                         dir / "manifest.json", dir / "manifest.err");
  if (status != 0) {
    ADD_FAILURE() << "reading the manifest with PyYAML failed (python3-yaml, in scripts/deps.sh): "
                  << read_file(dir / "manifest.err");
    return {};
  }
  return nlohmann::json::parse(read_file(dir / "manifest.json"));
}

TEST_F(DeployTest, KubernetesSidecarRunsWithTheManifestsArgumentsAndAnswersItsProbes) {
  const nlohmann::json c = sidecar(dir_.path());
  ASSERT_FALSE(c.is_null());
  EXPECT_EQ(c["command"], (nlohmann::json{"idem", "proxy"}));
  std::vector<std::string> args = c["args"].get<std::vector<std::string>>();
  // The ports the manifest names are the ones the arguments use.
  const std::string listen = option_value(args, "--listen");
  const std::string admin = option_value(args, "--admin");
  EXPECT_EQ(listen.substr(listen.rfind(':') + 1),
            std::to_string(c["ports"]["idem-http"].get<int>()));
  EXPECT_EQ(admin.substr(admin.rfind(':') + 1),
            std::to_string(c["ports"]["idem-admin"].get<int>()));
  EXPECT_EQ(c["readiness"]["port"], "idem-admin");
  EXPECT_EQ(c["liveness"]["port"], "idem-admin");
  EXPECT_LT(seconds_of(option_value(args, "--drain-timeout")), c["grace"].get<int>());

  replace_option(args, "--listen", "127.0.0.1:0");
  replace_option(args, "--upstream", upstream_.url());
  replace_option(args, "--admin", "127.0.0.1:0");
  std::vector<std::string> env;
  for (const auto& [name, value] : c["env"].items()) {
    // The store's URL comes from a Secret in the manifest; here, the test's store.
    env.push_back(
        name + "=" +
        (value.is_null() ? (name == "IDEM_STORE" ? store_url() : "") : value.get<std::string>()));
  }
  ASSERT_NE(c["env"].find("IDEM_STORE"), c["env"].end());

  ProxyProcess proxy(ProxyProcess::Exactly{}, dir_.path(), "sidecar", args, env);
  EXPECT_EQ(request(proxy.admin_port(), "GET", c["readiness"]["path"]).status, 200u);
  EXPECT_EQ(request(proxy.admin_port(), "GET", c["liveness"]["path"]).status, 200u);
  // The manifest's --require-key, applied.
  EXPECT_EQ(request(proxy.port(), "POST", "/orders").status, 400u);
  Reply ran = request(proxy.port(), "POST", "/orders", {{"Idempotency-Key", "k1"}});
  EXPECT_EQ(ran.status, 200u);
  EXPECT_TRUE(request(proxy.port(), "POST", "/orders", {{"Idempotency-Key", "k1"}}).replayed());
  proxy.signal(SIGTERM);
  EXPECT_EQ(proxy.wait(), 0);
}

}  // namespace
}  // namespace idem::proxy::test
