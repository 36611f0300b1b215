// A small HTTP/1.1 service for the proxy's tests and benchmark (Boost.Beast, one thread per
// connection). It records every request it executes, and each request can ask it to be
// slow, wait on a gate, fail, drop the connection, or answer in chunks or in binary.
//
//   idem_test_upstream --port-file F [--port P] [--log F] [--quiet]
//
// Request headers it obeys:
//   X-Test-Gate: NAME      wait until POST /__gate/NAME opens the gate (it stays open)
//   X-Test-Delay-Ms: N     wait N ms before answering
//   X-Test-Status: N       answer with status N
//   X-Test-Drop: 1         close the connection without answering
//   X-Test-Chunked: 1      answer with Transfer-Encoding: chunked, in several chunks and a trailer
//   X-Test-Body-Size: N    answer N bytes of binary (every byte value, NULs included)
//   X-Test-Hop: 1          add hop-by-hop headers (Connection-named, Keep-Alive) to the answer
//   X-Test-Cut: N          announce a body of 2N bytes, send N of them, and close (an answer
//                          cut off midway)
//   X-Test-Stream: N       answer N chunks, chunked, one at a time: "chunk 1\n" at once, and
//                          each next one after X-Test-Stream-Gate: NAME opens (or at once)
//   X-Test-Sse: 1          with X-Test-Stream, Content-Type: text/event-stream
//   X-Test-Echo: 1         answer the request's header fields, one "name: value" a line
//   X-Test-Set-Cookie: V   add Set-Cookie: V to the answer
//   X-Test-Announce: 1     as soon as the header has arrived, before reading the body, append
//                          the target to the --log file's name + ".announce"
// Otherwise it answers 200 with a text body naming the execution number and what it saw.
// Every executed request appends one line to the --log file when it arrives:
//   <execution> <Idempotency-Key or -> <Idempotency-Token or -> <Idempotency-Attempt or ->
//   <Idempotency-Stolen or -> <method> <target> <connection number>
// Requests to /__gate/... are control requests and are not logged.

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "test_body.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

std::mutex gates_mu;
std::condition_variable gates_cv;
std::set<std::string> open_gates;

std::atomic<long> executions{0};
std::atomic<long> connections{0};
int log_fd = -1;
int announce_fd = -1;

std::string header(const http::request<http::string_body>& req, std::string_view name,
                   const char* fallback = "-") {
  auto it = req.find(name);
  return it == req.end() ? std::string(fallback) : std::string(it->value());
}

void log_execution(long n, long connection, const http::request<http::string_body>& req) {
  if (log_fd < 0) return;
  std::string line = std::to_string(n) + " " + header(req, "Idempotency-Key") + " " +
                     header(req, "Idempotency-Token") + " " + header(req, "Idempotency-Attempt") +
                     " " + header(req, "Idempotency-Stolen") + " " +
                     std::string(req.method_string()) + " " + std::string(req.target()) + " " +
                     std::to_string(connection) + "\n";
  // One write on an O_APPEND descriptor: lines from concurrent requests never interleave.
  (void)!::write(log_fd, line.data(), line.size());
}

void write_chunked(tcp::socket& socket, const std::string& text, bool keep_alive) {
  std::string out = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n";
  out += "Trailer: X-Checksum\r\n";
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  std::size_t pos = 0, piece = 1;
  while (pos < text.size()) {
    std::size_t n = std::min(piece, text.size() - pos);
    char size[32];
    std::snprintf(size, sizeof size, "%zx;ext=1\r\n", n);
    out += size;
    out += text.substr(pos, n);
    out += "\r\n";
    pos += n;
    piece *= 3;
  }
  out += "0\r\nX-Checksum: 42\r\n\r\n";
  asio::write(socket, asio::buffer(out));
}

void wait_gate(const std::string& gate) {
  std::unique_lock<std::mutex> lock(gates_mu);
  gates_cv.wait(lock, [&] { return open_gates.count(gate) != 0; });
}

// X-Test-Stream: the first chunk at once, then one per opening of the gate (or at once).
void write_stream(tcp::socket& socket, int chunks, const std::string& gate, bool sse,
                  bool keep_alive) {
  std::string head = "HTTP/1.1 200 OK\r\nContent-Type: ";
  head += sse ? "text/event-stream" : "text/plain";
  head += "\r\nTransfer-Encoding: chunked\r\n";
  if (!keep_alive) head += "Connection: close\r\n";
  head += "\r\n";
  boost::system::error_code ec;
  asio::write(socket, asio::buffer(head), ec);
  for (int i = 1; i <= chunks && !ec; ++i) {
    if (i > 1 && !gate.empty()) wait_gate(gate + "-" + std::to_string(i));
    std::string text =
        sse ? "data: chunk " + std::to_string(i) + "\n\n" : "chunk " + std::to_string(i) + "\n";
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", text.size());
    asio::write(socket, asio::buffer(std::string(size) + text + "\r\n"), ec);
  }
  if (!ec) asio::write(socket, asio::buffer(std::string("0\r\n\r\n")), ec);
}

void serve(tcp::socket socket) {
  const long connection = ++connections;
  beast::flat_buffer buffer;
  beast::error_code ec;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(256 * 1024 * 1024);
    http::read_header(socket, buffer, parser, ec);
    if (ec) return;
    if (auto it = parser.get().find("X-Test-Announce");
        it != parser.get().end() && announce_fd >= 0) {
      std::string line = std::string(parser.get().target()) + "\n";
      (void)!::write(announce_fd, line.data(), line.size());
    }
    http::read(socket, buffer, parser, ec);
    if (ec) return;
    http::request<http::string_body> req = parser.release();
    std::string target(req.target());
    const bool keep_alive = req.keep_alive();

    if (target.rfind("/__gate/", 0) == 0) {
      {
        std::lock_guard<std::mutex> lock(gates_mu);
        open_gates.insert(target.substr(8));
      }
      gates_cv.notify_all();
      http::response<http::string_body> res{http::status::ok, req.version()};
      res.body() = "opened\n";
      res.keep_alive(keep_alive);
      res.prepare_payload();
      http::write(socket, res, ec);
      if (ec || !keep_alive) return;
      continue;
    }

    const long n = ++executions;
    log_execution(n, connection, req);
    if (auto gate = header(req, "X-Test-Gate", ""); !gate.empty()) wait_gate(gate);
    if (auto delay = header(req, "X-Test-Delay-Ms", ""); !delay.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(delay.c_str())));
    }
    if (header(req, "X-Test-Drop", "") == "1") {
      socket.shutdown(tcp::socket::shutdown_both, ec);
      return;
    }
    std::string text = "execution=" + std::to_string(n) + " key=" + header(req, "Idempotency-Key") +
                       " token=" + header(req, "Idempotency-Token") +
                       " attempt=" + header(req, "Idempotency-Attempt") +
                       " stolen=" + header(req, "Idempotency-Stolen") +
                       " method=" + std::string(req.method_string()) + " target=" + target +
                       " body=" + std::to_string(req.body().size()) + "\n";
    if (auto cut = header(req, "X-Test-Cut", ""); !cut.empty()) {
      const std::size_t n = std::strtoull(cut.c_str(), nullptr, 10);
      std::string out =
          "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
          "Content-Length: " +
          std::to_string(2 * n) + "\r\n\r\n";
      out += std::string(n, 'c');
      asio::write(socket, asio::buffer(out), ec);
      socket.shutdown(tcp::socket::shutdown_both, ec);
      return;
    }
    if (auto stream = header(req, "X-Test-Stream", ""); !stream.empty()) {
      write_stream(socket, std::atoi(stream.c_str()), header(req, "X-Test-Stream-Gate", ""),
                   header(req, "X-Test-Sse", "") == "1", keep_alive);
      if (ec || !keep_alive) return;
      continue;
    }
    if (header(req, "X-Test-Echo", "") == "1") {
      for (const auto& field : req) {
        text += std::string(field.name_string()) + ": " + std::string(field.value()) + "\n";
      }
    }
    if (header(req, "X-Test-Chunked", "") == "1") {
      write_chunked(socket, text, keep_alive);
      if (!keep_alive) return;
      continue;
    }
    http::response<http::string_body> res{http::status::ok, req.version()};
    if (auto status = header(req, "X-Test-Status", ""); !status.empty()) {
      res.result(static_cast<unsigned>(std::atoi(status.c_str())));
    }
    res.set(http::field::content_type, "text/plain");
    res.set("X-Execution", std::to_string(n));
    if (auto size = header(req, "X-Test-Body-Size", ""); !size.empty()) {
      res.set(http::field::content_type, "application/octet-stream");
      res.body() = idem::proxy::test::binary_body(std::strtoull(size.c_str(), nullptr, 10));
    } else {
      res.body() = text;
    }
    if (auto cookie = header(req, "X-Test-Set-Cookie", ""); !cookie.empty()) {
      res.set(http::field::set_cookie, cookie);
    }
    if (header(req, "X-Test-Hop", "") == "1") {
      res.set(http::field::connection, "X-Hop-Secret");
      res.set("X-Hop-Secret", "must not be replayed");
      res.set(http::field::keep_alive, "timeout=5");
      res.set("X-End-To-End", "kept");
    }
    // Statuses that carry no body (RFC 9110 §6.4.1) get none.
    if (const unsigned s = res.result_int(); s < 200 || s == 204 || s == 304) res.body().clear();
    res.keep_alive(keep_alive);
    res.prepare_payload();
    http::write(socket, res, ec);
    if (ec || !keep_alive) return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string port_file, log_file;
  unsigned short port = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << arg << " needs a value\n";
        std::exit(64);
      }
      return argv[++i];
    };
    if (arg == "--port-file") {
      port_file = value();
    } else if (arg == "--log") {
      log_file = value();
    } else if (arg == "--port") {
      port = static_cast<unsigned short>(std::atoi(value().c_str()));
    } else {
      std::cerr << "unknown argument " << arg << "\n";
      return 64;
    }
  }
  if (!log_file.empty()) {
    log_fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    announce_fd =
        ::open((log_file + ".announce").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0 || announce_fd < 0) {
      std::perror(log_file.c_str());
      return 1;
    }
  }
  asio::io_context ioc;
  tcp::acceptor acceptor(ioc);
  tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), port);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(asio::socket_base::reuse_address(true));
  acceptor.bind(endpoint);
  acceptor.listen(asio::socket_base::max_listen_connections);
  if (!port_file.empty()) {
    // Written aside and renamed, so a reader never sees half a number.
    std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << acceptor.local_endpoint().port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  for (;;) {
    tcp::socket socket(ioc);
    beast::error_code ec;
    acceptor.accept(socket, ec);
    if (ec) continue;
    socket.set_option(tcp::no_delay(true), ec);
    std::thread(serve, std::move(socket)).detach();
  }
}
