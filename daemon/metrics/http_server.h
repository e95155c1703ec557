// A minimal HTTP/1.1 server for kvd's read-only endpoints (/metrics), on Boost.Beast, with its
// own io_context and thread: a slow or stuck scraper holds that thread only, never kvd's control
// loop or its transports.
//
// One connection is served at a time (a Prometheus server scrapes every few seconds); every read
// and write has a 5 s deadline, so a client that connects and says nothing is dropped.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"

namespace kv::daemon::metrics {

class HttpServer {
 public:
  // GET `path` -> 200 with the text `render` returns (called on the server's thread);
  // anything else -> 404 or 405.
  struct Route {
    std::string path;
    std::string content_type;
    std::function<std::string()> render;
  };
  // Binds "HOST:PORT" (port 0: a free one) and starts the thread.
  static Result<std::unique_ptr<HttpServer>> Start(const std::string& listen, Route route);
  ~HttpServer();  // stops and joins
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::string address() const;  // "127.0.0.1:9464", the port it bound

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kv::daemon::metrics
