#include "daemon/membership/etcd_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <optional>
#include <sstream>

namespace kv::daemon::membership {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace pt = boost::property_tree;
using tcp = asio::ip::tcp;

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
// Responses bigger than this are not etcd answering kvd's small requests.
constexpr uint64_t kMaxResponseBytes = 16u << 20;

Result<pt::ptree> ParseJson(const std::string& body) {
  try {
    std::istringstream in(body);
    pt::ptree tree;
    pt::read_json(in, tree);
    return tree;
  } catch (const std::exception& e) {
    return Status::IoError(std::string("etcd answered with malformed JSON: ") + e.what());
  }
}

Result<int64_t> ParseInt(const std::string& text, const char* what) {
  try {
    size_t used = 0;
    long long v = std::stoll(text, &used);
    if (used == text.size()) return static_cast<int64_t>(v);
  } catch (...) {
  }
  return Status::IoError(std::string("etcd answered a ") + what + " that is not an integer: '" +
                         text + "'");
}

}  // namespace

std::string Base64Encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v =
        (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kAlphabet[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= uint8_t(bytes[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(const std::string& text) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const char* at = std::char_traits<char>::find(kAlphabet, 64, c);
    if (at == nullptr) return Status::IoError("not base64: '" + text + "'");
    v = (v << 6) | static_cast<uint32_t>(at - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((v >> bits) & 0xff);
    }
  }
  return out;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

Result<EtcdClient> EtcdClient::Create(const std::string& url, std::chrono::milliseconds timeout) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    return Status::InvalidArgument("etcd URL '" + url + "' must start with http:// (no TLS)");
  }
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (rest.empty() || rest.find('/') != std::string::npos || colon == 0 ||
      (colon != std::string::npos && colon + 1 == rest.size())) {
    return Status::InvalidArgument("etcd URL '" + url + "' is not http://HOST:PORT");
  }
  EtcdClient c;
  c.url_ = url;
  c.host_ = colon == std::string::npos ? rest : rest.substr(0, colon);
  c.port_ = colon == std::string::npos ? "2379" : rest.substr(colon + 1);
  c.timeout_ = timeout;
  return c;
}

Result<std::string> EtcdClient::Post(const std::string& target, const std::string& json) const {
  // One connection per call: kvd talks to etcd every few seconds, and a fresh connection has no
  // state a dead etcd could have left half-open.
  asio::io_context io;
  beast::tcp_stream stream(io);
  std::optional<Status> failure;
  std::string body;
  const std::string where = "etcd " + url_ + target;
  auto fail = [&](const char* step, const boost::system::error_code& ec) {
    failure = Status::Unavailable(where + ": " + step + ": " + ec.message());
  };
  tcp::resolver resolver(io);
  http::request<http::string_body> req{http::verb::post, target, 11};
  req.set(http::field::host, host_ + ":" + port_);
  req.set(http::field::content_type, "application/json");
  req.body() = json;
  req.prepare_payload();
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxResponseBytes);
  // The whole exchange under one deadline: the stream's timer covers connect, write and read;
  // io.run_for bounds name resolution too.
  stream.expires_after(timeout_);
  resolver.async_resolve(
      host_, port_, [&](const boost::system::error_code& ec, tcp::resolver::results_type results) {
        if (ec) return fail("resolve", ec);
        stream.async_connect(
            results, [&](const boost::system::error_code& ec, const tcp::endpoint&) {
              if (ec) return fail("connect", ec);
              http::async_write(stream, req, [&](const boost::system::error_code& ec, size_t) {
                if (ec) return fail("write", ec);
                http::async_read(
                    stream, buffer, parser, [&](const boost::system::error_code& ec, size_t) {
                      if (ec) return fail("read", ec);
                      body = parser.get().body();
                      const unsigned code = parser.get().result_int();
                      if (code != 200) {
                        failure = Status::Unavailable(where + ": HTTP " + std::to_string(code) +
                                                      ": " + body.substr(0, 300));
                      }
                    });
              });
            });
      });
  io.run_for(timeout_ + std::chrono::milliseconds(100));
  if (!io.stopped()) {
    return Status::Timeout(where + ": no answer within " + std::to_string(timeout_.count()) +
                           " ms");
  }
  if (failure) return *failure;
  return body;
}

Result<int64_t> EtcdClient::GrantLease(int64_t ttl_seconds) const {
  KV_ASSIGN_OR_RETURN(std::string body,
                      Post("/v3/lease/grant", "{\"TTL\": " + std::to_string(ttl_seconds) + "}"));
  KV_ASSIGN_OR_RETURN(pt::ptree tree, ParseJson(body));
  auto id = tree.get_optional<std::string>("ID");
  if (!id) return Status::IoError("etcd granted a lease without an ID: " + body.substr(0, 300));
  return ParseInt(*id, "lease ID");
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease) const {
  KV_ASSIGN_OR_RETURN(std::string body,
                      Post("/v3/lease/keepalive", "{\"ID\": \"" + std::to_string(lease) + "\"}"));
  // A stream on the gateway: one {"result": {...}} per line; the first answers ours.
  KV_ASSIGN_OR_RETURN(pt::ptree tree, ParseJson(body.substr(0, body.find('\n'))));
  if (auto error = tree.get_optional<std::string>("error.message")) {
    return Status::Unavailable("etcd lease keepalive: " + *error);
  }
  // Zero values are left out of the JSON: no TTL means the lease has expired.
  return ParseInt(tree.get<std::string>("result.TTL", "0"), "TTL");
}

Status EtcdClient::Revoke(int64_t lease) const {
  return Post("/v3/lease/revoke", "{\"ID\": \"" + std::to_string(lease) + "\"}").status();
}

Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) const {
  std::string json =
      "{\"key\": \"" + Base64Encode(key) + "\", \"value\": \"" + Base64Encode(value) + "\"";
  if (lease != 0) json += ", \"lease\": \"" + std::to_string(lease) + "\"";
  return Post("/v3/kv/put", json + "}").status();
}

Result<std::optional<std::string>> EtcdClient::Get(const std::string& key) const {
  KV_ASSIGN_OR_RETURN(std::string body,
                      Post("/v3/kv/range", "{\"key\": \"" + Base64Encode(key) + "\"}"));
  KV_ASSIGN_OR_RETURN(pt::ptree tree, ParseJson(body));
  auto kvs = tree.get_child_optional("kvs");
  if (!kvs || kvs->empty()) return std::optional<std::string>();
  KV_ASSIGN_OR_RETURN(std::string value,
                      Base64Decode(kvs->begin()->second.get<std::string>("value", "")));
  return std::optional<std::string>(std::move(value));
}

Result<std::vector<std::pair<std::string, std::string>>> EtcdClient::Prefix(
    const std::string& prefix) const {
  // The range [prefix, prefix with its last byte + 1): every key that starts with prefix.
  std::string end = prefix;
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (!end.empty()) end.back() = static_cast<char>(end.back() + 1);
  const std::string range_end = end.empty() ? std::string(1, '\0') : end;
  KV_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/range", "{\"key\": \"" + Base64Encode(prefix) +
                                                                 "\", \"range_end\": \"" +
                                                                 Base64Encode(range_end) + "\"}"));
  KV_ASSIGN_OR_RETURN(pt::ptree tree, ParseJson(body));
  std::vector<std::pair<std::string, std::string>> out;
  if (auto kvs = tree.get_child_optional("kvs")) {
    for (const auto& [unused, kv] : *kvs) {
      KV_ASSIGN_OR_RETURN(std::string key, Base64Decode(kv.get<std::string>("key", "")));
      KV_ASSIGN_OR_RETURN(std::string value, Base64Decode(kv.get<std::string>("value", "")));
      out.emplace_back(std::move(key), std::move(value));
    }
  }
  return out;
}

}  // namespace kv::daemon::membership
