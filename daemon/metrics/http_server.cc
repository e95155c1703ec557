#include "daemon/metrics/http_server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <thread>

namespace kv::daemon::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

class HttpServer::Impl {
 public:
  explicit Impl(Route route) : route_(std::move(route)), acceptor_(io_), retry_(io_) {}

  Status Listen(const std::string& listen) {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return Status::InvalidArgument("metrics address '" + listen + "' is not HOST:PORT");
    }
    std::string host = listen.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    boost::system::error_code ec;
    auto ip = asio::ip::make_address(host, ec);
    int port = -1;
    try {
      port = std::stoi(listen.substr(colon + 1));
    } catch (...) {
    }
    if (ec || port < 0 || port > 65535) {
      return Status::InvalidArgument("metrics address '" + listen + "' is not HOST:PORT");
    }
    tcp::endpoint endpoint(ip, static_cast<uint16_t>(port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status::IoError("metrics: listen on " + listen + ": " + ec.message());
    const auto bound = acceptor_.local_endpoint();
    address_ = bound.address().to_string() + ":" + std::to_string(bound.port());
    Accept();
    thread_ = std::thread([this] { io_.run(); });
    return Status::Ok();
  }

  ~Impl() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  const std::string& address() const { return address_; }

 private:
  // One exchange per connection (Connection: close): scrapers reconnect each time anyway, and it
  // keeps a connection from holding the only serving slot between scrapes.
  struct Exchange {
    explicit Exchange(tcp::socket s) : stream(std::move(s)) {}
    beast::tcp_stream stream;
    beast::flat_buffer buffer;
    http::request<http::empty_body> request;
    http::response<http::string_body> response;
  };

  void Accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        // Out of file descriptors, say: retry a little later rather than spin on the error.
        spdlog::warn("metrics: accept: {}", ec.message());
        retry_.expires_after(std::chrono::milliseconds(100));
        retry_.async_wait([this](const boost::system::error_code& e) {
          if (!e) Accept();
        });
        return;
      }
      Serve(std::make_shared<Exchange>(std::move(socket)));
    });
  }

  void Serve(std::shared_ptr<Exchange> x) {
    x->stream.expires_after(kDeadline);
    x->buffer.max_size(kMaxRequestBytes);
    http::async_read(x->stream, x->buffer, x->request,
                     [this, x](const boost::system::error_code& ec, size_t) {
                       if (ec) {
                         Done(x);
                         return;
                       }
                       Respond(x);
                     });
  }

  void Respond(const std::shared_ptr<Exchange>& x) {
    auto& res = x->response;
    res.version(x->request.version());
    res.keep_alive(false);
    res.set(http::field::server, "kvd");
    const std::string target(x->request.target());
    const std::string path = target.substr(0, target.find('?'));
    if (path != route_.path) {
      res.result(http::status::not_found);
      res.set(http::field::content_type, "text/plain");
      res.body() = "not found; try " + route_.path + "\n";
    } else if (x->request.method() != http::verb::get && x->request.method() != http::verb::head) {
      res.result(http::status::method_not_allowed);
      res.set(http::field::allow, "GET, HEAD");
      res.set(http::field::content_type, "text/plain");
      res.body() = "GET only\n";
    } else {
      res.result(http::status::ok);
      res.set(http::field::content_type, route_.content_type);
      res.body() = route_.render();
      if (x->request.method() == http::verb::head) {
        res.content_length(res.body().size());
        res.body().clear();
      }
    }
    if (x->request.method() != http::verb::head) res.prepare_payload();
    x->stream.expires_after(kDeadline);
    http::async_write(x->stream, res,
                      [this, x](const boost::system::error_code&, size_t) { Done(x); });
  }

  // Closes the exchange and takes the next connection: one at a time (see the header).
  void Done(const std::shared_ptr<Exchange>& x) {
    boost::system::error_code ignored;
    x->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    x->stream.close();
    Accept();
  }

  static constexpr std::chrono::seconds kDeadline{5};
  static constexpr size_t kMaxRequestBytes = 16 * 1024;

  Route route_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  std::string address_;
  std::thread thread_;
};

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen, Route route) {
  auto impl = std::make_unique<Impl>(std::move(route));
  KV_RETURN_IF_ERROR(impl->Listen(listen));
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;

std::string HttpServer::address() const {
  return impl_->address();
}

}  // namespace kv::daemon::metrics
