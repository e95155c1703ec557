// A small client of etcd's v3 HTTP/JSON gateway (the grpc-gateway every etcd >= 3.4 serves on its
// client port: POST /v3/kv/put, /v3/kv/range, /v3/lease/grant, /v3/lease/keepalive,
// /v3/lease/revoke), on Boost.Beast: Debian packages no etcd C++ client.
//
// Only what kvd's membership needs: leases, puts under a lease, prefix ranges. Keys and values
// travel base64-encoded, as the gateway wants. Every call is synchronous and bounded by the
// client's timeout (connect, write and read together), so a dead etcd costs a caller at most that.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace kv::daemon::membership {

class EtcdClient {
 public:
  // `url`: "http://HOST:PORT" (HOST an IP address or a name; no TLS, no path).
  static Result<EtcdClient> Create(const std::string& url,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(2));

  // A lease of `ttl_seconds`; its ID.
  Result<int64_t> GrantLease(int64_t ttl_seconds) const;
  // Renews the lease; its remaining TTL in seconds (0 or less: the lease has expired).
  Result<int64_t> KeepAlive(int64_t lease) const;
  Status Revoke(int64_t lease) const;
  // lease 0: no lease.
  Status Put(const std::string& key, const std::string& value, int64_t lease) const;
  // The value of `key`; nullopt when etcd has no such key.
  Result<std::optional<std::string>> Get(const std::string& key) const;
  // Every (key, value) whose key starts with `prefix`.
  Result<std::vector<std::pair<std::string, std::string>>> Prefix(const std::string& prefix) const;

  const std::string& url() const { return url_; }

 private:
  EtcdClient() = default;
  // POSTs `json` to `target`; the response body of a 200.
  Result<std::string> Post(const std::string& target, const std::string& json) const;

  std::string url_, host_, port_;
  std::chrono::milliseconds timeout_{2000};
};

std::string Base64Encode(const std::string& bytes);
Result<std::string> Base64Decode(const std::string& text);
// `text` as a JSON string literal, quotes included.
std::string JsonString(const std::string& text);

}  // namespace kv::daemon::membership
