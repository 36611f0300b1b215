#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/spawn_attributes.h"

#ifndef IDEM_BINARY
#error "IDEM_BINARY is set by tests/proxy/CMakeLists.txt"
#endif
#ifndef IDEM_TEST_UPSTREAM
#error "IDEM_TEST_UPSTREAM is set by tests/proxy/CMakeLists.txt"
#endif

extern char** environ;

namespace idem::proxy::test {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

bool iequal(std::string_view a, std::string_view b) { return beast::iequals(a, b); }

std::vector<std::string> split(const std::string& line) {
  std::istringstream in(line);
  return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
}

Reply to_reply(http::response<http::string_body>& res) {
  Reply r;
  r.status = res.result_int();
  for (const auto& field : res) {
    r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  r.body = std::move(res.body());
  return r;
}

}  // namespace

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// ---- ScratchDir ----

ScratchDir::ScratchDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern =
      std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/idem-proxy-test-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

// ---- Child ----

Child::Child(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err,
             const std::vector<std::string>& env) {
  std::vector<std::string> args = argv;
  std::vector<char*> c_args;
  for (auto& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const std::string name = var.substr(0, var.find('='));
    bool replaced = false;
    for (const std::string& extra : env)
      replaced = replaced || extra.substr(0, extra.find('=')) == name;
    if (!replaced) vars.push_back(var);
  }
  vars.insert(vars.end(), env.begin(), env.end());
  std::vector<char*> c_env;
  for (auto& v : vars) c_env.push_back(v.data());
  c_env.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  idem::testing::ShellSpawnAttributes attr;
  int rc = ::posix_spawn(&pid_, c_args[0], &actions, attr.get(), c_args.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
}

Child::~Child() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    (void)wait();
  }
}

void Child::signal(int sig) const { ::kill(pid_, sig); }

bool Child::running() {
  if (status_) return false;
  int ws = 0;
  pid_t r = ::waitpid(pid_, &ws, WNOHANG);
  if (r == pid_) {
    status_ = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    return false;
  }
  return r == 0;
}

int Child::wait(std::chrono::seconds bound) {
  if (!eventually([&] { return !running(); }, bound)) {
    ::kill(pid_, SIGKILL);
    (void)eventually([&] { return !running(); });
  }
  return status_.value_or(-1);
}

int run(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err) {
  Child child(argv, out, err);
  return child.wait();
}

// ---- Upstream ----

Upstream::Upstream(const fs::path& dir) : dir_(dir) { start(); }

void Upstream::start() {
  ++starts_;
  fs::path port_file = dir_ / ("upstream.port." + std::to_string(starts_));
  std::vector<std::string> argv = {IDEM_TEST_UPSTREAM, "--port-file", port_file.string(), "--log",
                                   (dir_ / "upstream.log").string()};
  if (port_ != 0) argv.insert(argv.end(), {"--port", std::to_string(port_)});
  child_ = std::make_unique<Child>(argv, dir_ / "upstream.out", dir_ / "upstream.err");
  if (!eventually([&] { return fs::exists(port_file) || !child_->running(); }) ||
      !fs::exists(port_file)) {
    throw std::runtime_error("the test upstream did not start: " +
                             read_file(dir_ / "upstream.err"));
  }
  port_ = static_cast<std::uint16_t>(std::stoi(read_file(port_file)));
}

std::vector<std::vector<std::string>> Upstream::executions() const {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(read_file(dir_ / "upstream.log"));
  for (std::string line; std::getline(in, line);) out.push_back(split(line));
  return out;
}

int Upstream::executions_of(const std::string& key) const {
  int n = 0;
  for (const auto& line : executions()) n += line.size() > 1 && line[1] == key ? 1 : 0;
  return n;
}

bool Upstream::wait_for(const std::string& key, int n) const {
  return eventually([&] { return executions_of(key) >= n; });
}

void Upstream::open_gate(const std::string& name) const {
  Reply r = request(port_, "POST", "/__gate/" + name);
  if (r.status != 200) throw std::runtime_error("could not open gate " + name + ": " + r.error);
}

std::string Upstream::announced() const { return read_file(dir_ / "upstream.log.announce"); }

void Upstream::kill() {
  child_->signal(SIGKILL);
  (void)child_->wait();
}

void Upstream::restart() {
  if (child_->running()) kill();
  start();
}

// ---- ProxyProcess ----

ProxyProcess::ProxyProcess(const fs::path& dir, const std::string& name,
                           const std::string& upstream_url, const std::string& store_url,
                           const std::vector<std::string>& options,
                           const std::vector<std::string>& wrapper)
    : err_(dir / (name + ".err")) {
  std::vector<std::string> argv = wrapper;
  argv.insert(argv.end(), {IDEM_BINARY, "proxy", "--listen", "127.0.0.1:0", "--upstream",
                           upstream_url, "--store", store_url, "--access-log"});
  argv.insert(argv.end(), options.begin(), options.end());
  child_ = std::make_unique<Child>(argv, dir / (name + ".out"), err_);
  wait_until_listening();
}

ProxyProcess::ProxyProcess(Exactly, const fs::path& dir, const std::string& name,
                           const std::vector<std::string>& args,
                           const std::vector<std::string>& env)
    : err_(dir / (name + ".err")) {
  std::vector<std::string> argv = {IDEM_BINARY, "proxy"};
  argv.insert(argv.end(), args.begin(), args.end());
  child_ = std::make_unique<Child>(argv, dir / (name + ".out"), err_, env);
  wait_until_listening();
}

void ProxyProcess::wait_until_listening() {
  const std::string marker = "listening on 127.0.0.1:";
  if (!eventually([&] { return logged(marker) || !child_->running(); }) || !logged(marker)) {
    throw std::runtime_error("idem proxy did not start: " + log());
  }
  std::string text = log();
  port_ = static_cast<std::uint16_t>(std::stoi(text.substr(text.find(marker) + marker.size())));
}

std::uint16_t ProxyProcess::admin_port() const {
  const std::string marker = "admin listening on 127.0.0.1:";
  // Logged just after the proxied port's line.
  if (!eventually([&] { return logged(marker); }))
    throw std::runtime_error("no admin listener: " + log());
  std::string text = log();
  return static_cast<std::uint16_t>(std::stoi(text.substr(text.find(marker) + marker.size())));
}

bool ProxyProcess::logged(const std::string& text) const {
  return log().find(text) != std::string::npos;
}

// ---- Reply ----

std::optional<std::string> Reply::header(const std::string& name) const {
  for (const auto& [n, v] : headers) {
    if (iequal(n, name)) return v;
  }
  return std::nullopt;
}

int Reply::count(const std::string& name) const {
  int n = 0;
  for (const auto& [h, v] : headers) n += iequal(h, name) ? 1 : 0;
  return n;
}

// ---- Client ----

struct Client::Impl {
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
};

Client::Client(std::uint16_t port) : impl_(std::make_unique<Impl>()) {
  impl_->stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
}

Client::~Client() {
  beast::error_code ignored;
  impl_->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

Reply Client::send(const std::string& method, const std::string& target, const Headers& headers,
                   const std::string& body) {
  http::request<http::string_body> req;
  req.method_string(method);
  req.target(target);
  req.version(11);
  bool host = false;
  for (const auto& [name, value] : headers) {
    req.insert(name, value);
    host = host || iequal(name, "Host");
  }
  if (!host) req.set(http::field::host, "127.0.0.1");
  req.body() = body;
  if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
    req.prepare_payload();
  }
  Reply reply;
  beast::error_code ec;
  // Bounded, so a proxy that never answers fails the test instead of hanging it.
  impl_->stream.expires_after(std::chrono::seconds(60));
  http::write(impl_->stream, req, ec);
  if (ec) {
    reply.error = "write: " + ec.message();
    closed_ = true;
    return reply;
  }
  http::response_parser<http::string_body> parser;
  parser.body_limit(512 * 1024 * 1024);
  if (method == "HEAD") parser.skip(true);
  http::read(impl_->stream, impl_->buffer, parser, ec);
  if (ec) {
    reply.error = "read: " + ec.message();
    closed_ = true;
    return reply;
  }
  http::response<http::string_body> res = parser.release();
  closed_ = !res.keep_alive();
  return to_reply(res);
}

Reply request(std::uint16_t port, const std::string& method, const std::string& target,
              const Headers& headers, const std::string& body) {
  try {
    Client client(port);
    return client.send(method, target, headers, body);
  } catch (const std::exception& e) {
    Reply r;
    r.error = e.what();
    return r;
  }
}

Reply raw_request(std::uint16_t port, const std::string& bytes) {
  Reply reply;
  try {
    asio::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    stream.expires_after(std::chrono::seconds(60));
    asio::write(stream, asio::buffer(bytes));
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(512 * 1024 * 1024);
    http::read(stream, buffer, parser);
    http::response<http::string_body> res = parser.release();
    return to_reply(res);
  } catch (const std::exception& e) {
    reply.error = e.what();
    return reply;
  }
}

std::string idle_connection_ends(std::uint16_t port, std::chrono::seconds bound) {
  asio::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  // poll(2) rather than a timed read: Asio's blocking reads take no timeout.
  pollfd p{socket.native_handle(), POLLIN, 0};
  const int ready = ::poll(&p, 1, static_cast<int>(bound.count() * 1000));
  if (ready == 0) return "still open after " + std::to_string(bound.count()) + " s";
  char byte = 0;
  const ssize_t n = ::recv(socket.native_handle(), &byte, 1, 0);
  return n == 0 ? "end of file" : n < 0 ? std::string(std::strerror(errno)) : "a byte arrived";
}

RawConnection::RawConnection(std::uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
  }
}

RawConnection::~RawConnection() {
  if (fd_ >= 0) ::close(fd_);
}

void RawConnection::send(const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    sent += static_cast<std::size_t>(n);
  }
}

bool RawConnection::read_until(const std::string& text, std::chrono::milliseconds bound) {
  const auto give_up = std::chrono::steady_clock::now() + bound;
  while (received_.find(text) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        give_up - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) return received_.find(text) != std::string::npos;
    received_.append(chunk, static_cast<std::size_t>(n));
  }
  return true;
}

std::uint16_t free_port() {
  asio::io_context ioc;
  tcp::acceptor acceptor(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  return acceptor.local_endpoint().port();
}

bool refuses_connections(std::uint16_t port) {
  asio::io_context ioc;
  tcp::socket socket(ioc);
  beast::error_code ec;
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  return ec == asio::error::connection_refused;
}

Reply curl(const fs::path& dir, const std::string& url, const std::vector<std::string>& args) {
  static std::atomic<int> calls{0};
  const std::string n = std::to_string(++calls);
  fs::path headers = dir / ("curl.headers." + n), body = dir / ("curl.body." + n);
  std::vector<std::string> argv = {"/usr/bin/curl",  "-sS", "--max-time", "60", "-D",
                                   headers.string(), "-o",  body.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(url);
  Reply reply;
  int status = run(argv, dir / ("curl.out." + n), dir / ("curl.err." + n));
  if (status != 0) {
    reply.error =
        "curl exited " + std::to_string(status) + ": " + read_file(dir / ("curl.err." + n));
    return reply;
  }
  // The last header block is the final answer (a 100 Continue comes first).
  std::istringstream in(read_file(headers));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("HTTP/", 0) == 0) {
      reply.headers.clear();
      reply.status = static_cast<unsigned>(std::stoi(line.substr(line.find(' ') + 1)));
    } else if (auto colon = line.find(':'); colon != std::string::npos) {
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      reply.headers.emplace_back(line.substr(0, colon), value);
    }
  }
  reply.body = read_file(body);
  return reply;
}

}  // namespace idem::proxy::test
