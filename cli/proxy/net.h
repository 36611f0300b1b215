#pragma once

// The names the proxy's asynchronous code uses for Boost.Asio and Boost.Beast.

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http/message.hpp>
#include <chrono>

namespace idem::proxy {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;
}  // namespace idem::proxy
