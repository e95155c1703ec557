// Unit tests of the pieces behind --metrics-listen and --etcd that need no root, no etcd and no
// second process: the exposition text, the HTTP endpoint, base64 and member records, and the
// bounds on every call to an etcd that is not there, and the resolution of peer names (against a
// stand-in that answers like etcd).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/membership/etcd_client.h"
#include "daemon/membership/membership.h"
#include "daemon/membership/peer_resolver.h"
#include "daemon/metrics/http_server.h"
#include "daemon/metrics/metrics.h"

namespace kv::daemon {
namespace {

using namespace std::chrono_literals;
namespace http = boost::beast::http;

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(MetricsText, HistogramBucketsAreCumulativeWithSumAndCount) {
  metrics::Histogram h;
  h.Observe(50us);
  h.Observe(3ms);
  h.Observe(2s);
  h.Observe(100s);
  std::string out;
  h.Render("x_seconds", "role=\"source\"", &out);
  EXPECT_TRUE(Has(out, "x_seconds_bucket{role=\"source\",le=\"0.0001\"} 1")) << out;
  EXPECT_TRUE(Has(out, "x_seconds_bucket{role=\"source\",le=\"0.001\"} 1")) << out;
  EXPECT_TRUE(Has(out, "x_seconds_bucket{role=\"source\",le=\"0.005\"} 2")) << out;
  EXPECT_TRUE(Has(out, "x_seconds_bucket{role=\"source\",le=\"10\"} 3")) << out;
  EXPECT_TRUE(Has(out, "x_seconds_bucket{role=\"source\",le=\"60\"} 3")) << out;
  EXPECT_TRUE(Has(out, "x_seconds_bucket{role=\"source\",le=\"+Inf\"} 4")) << out;
  EXPECT_TRUE(Has(out, "x_seconds_count{role=\"source\"} 4")) << out;
  EXPECT_TRUE(Has(out, "x_seconds_sum{role=\"source\"} 102.00305")) << out;
}

TEST(MetricsText, CountsByPeerEscapeLabelsAndAddTheSnapshot) {
  metrics::Metrics m;
  m.RequestDone(metrics::Role::kSource, "dec\"o\\de\n", "ucx", true, 100, 1ms);
  m.RequestDone(metrics::Role::kSource, "dec\"o\\de\n", "ucx", true, 50, 1ms);
  m.RequestDone(metrics::Role::kSource, "dec\"o\\de\n", "ucx", false, 999, 1ms);
  m.RequestDone(metrics::Role::kDestination, "prefill", "ucx", true, 7, 1ms);
  m.HeartbeatTimeout();
  const std::string peer = "peer=\"dec\\\"o\\\\de\\n\",transport=\"ucx\"";
  std::string text = m.Render(nullptr, "1.2.3");
  EXPECT_TRUE(Has(text, "kvd_transfers_total{" + peer + ",role=\"source\",outcome=\"done\"} 2"))
      << text;
  EXPECT_TRUE(Has(text, "kvd_transfers_total{" + peer + ",role=\"source\",outcome=\"failed\"} 1"))
      << text;
  // Failed transfers' bytes are not counted as moved.
  EXPECT_TRUE(Has(text, "kvd_transfer_bytes_total{" + peer + ",role=\"source\"} 150")) << text;
  EXPECT_TRUE(Has(text,
                  "kvd_transfer_bytes_total{peer=\"prefill\",transport=\"ucx\","
                  "role=\"destination\"} 7"))
      << text;
  EXPECT_TRUE(Has(text, "kvd_request_seconds_count{role=\"source\"} 2")) << text;
  EXPECT_TRUE(Has(text, "kvd_heartbeat_timeouts_total 1")) << text;
  EXPECT_EQ(text.find("kvd_info"), std::string::npos) << "no snapshot, no gauges";

  proto::DaemonStatus status;
  status.set_name("node-a");
  status.set_transport("ucx");
  status.set_transfers_in_flight(3);
  status.mutable_offload()->set_hits(11);
  status.mutable_offload()->set_capacity_bytes(1 << 20);
  status.add_peers()->set_state("ready");
  text = m.Render(&status, "1.2.3");
  EXPECT_TRUE(
      Has(text, "kvd_info{name=\"node-a\",transport=\"ucx\",listen=\"\",version=\"1.2.3\"} 1"))
      << text;
  EXPECT_TRUE(Has(text, "kvd_transfers_in_flight 3")) << text;
  EXPECT_TRUE(Has(text, "kvd_offload_hits_total 11")) << text;
  EXPECT_TRUE(Has(text, "kvd_offload_capacity_bytes 1048576")) << text;
  EXPECT_TRUE(Has(text, "kvd_peers{state=\"ready\"} 1")) << text;
  EXPECT_TRUE(Has(text, "kvd_peers{state=\"connecting\"} 0")) << text;
}

// One request to `address`; (status code, body).
std::pair<unsigned, std::string> Request(const std::string& address, http::verb verb,
                                         const std::string& target) {
  boost::asio::io_context io;
  boost::beast::tcp_stream stream(io);
  const size_t colon = address.rfind(':');
  boost::asio::ip::tcp::endpoint at(boost::asio::ip::make_address(address.substr(0, colon)),
                                    static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  stream.expires_after(5s);
  stream.connect(at);
  http::request<http::empty_body> req{verb, target, 11};
  req.set(http::field::host, address);
  http::write(stream, req);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(stream, buffer, res);
  return {res.result_int(), res.body()};
}

TEST(MetricsHttp, ServesTheRouteAndRefusesTheRest) {
  int renders = 0;
  auto server =
      metrics::HttpServer::Start("127.0.0.1:0", {"/metrics", "text/plain; version=0.0.4", [&] {
                                                   ++renders;
                                                   return std::string("up 1\n");
                                                 }});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string address = (*server)->address();
  EXPECT_NE(address, "127.0.0.1:0");
  auto [code, body] = Request(address, http::verb::get, "/metrics");
  EXPECT_EQ(code, 200u);
  EXPECT_EQ(body, "up 1\n");
  EXPECT_EQ(Request(address, http::verb::get, "/metrics?x=1").first, 200u);
  EXPECT_EQ(Request(address, http::verb::get, "/other").first, 404u);
  EXPECT_EQ(Request(address, http::verb::post, "/metrics").first, 405u);
  EXPECT_EQ(renders, 2);
}

TEST(MetricsHttp, RejectsAMalformedAddress) {
  for (const char* bad : {"nohost", ":9464", "127.0.0.1:99999", "not-an-ip:80"}) {
    auto server = metrics::HttpServer::Start(bad, {"/metrics", "text/plain", [] { return ""; }});
    EXPECT_FALSE(server.ok()) << bad;
  }
}

TEST(Etcd, Base64RoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n : {0, 1, 2, 3, 4, 255, 256}) {
    const std::string s = all.substr(0, n);
    auto back = membership::Base64Decode(membership::Base64Encode(s));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s) << n;
  }
  EXPECT_EQ(membership::Base64Encode("/kvd/members/"), "L2t2ZC9tZW1iZXJzLw==");
  EXPECT_FALSE(membership::Base64Decode("a*b=").ok());
}

TEST(Etcd, MemberRecordsRoundTrip) {
  membership::Member m;
  m.name = "node \"a\"";
  m.address = "10.0.0.1:7000";
  m.transports = {"ucx", "nccl"};
  m.version = "0.1.0";
  m.host = "h";
  m.pid = 42;
  auto back = membership::ParseMember(membership::MemberJson(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->name, m.name);
  EXPECT_EQ(back->address, m.address);
  EXPECT_EQ(back->transports, m.transports);
  EXPECT_EQ(back->pid, 42);
  EXPECT_FALSE(membership::ParseMember("{\"address\": \"x\"}").ok()) << "no name";
  EXPECT_FALSE(membership::ParseMember("not json").ok());
}

TEST(Etcd, UrlsAreHttpHostPort) {
  EXPECT_TRUE(membership::EtcdClient::Create("http://127.0.0.1:2379").ok());
  EXPECT_TRUE(membership::EtcdClient::Create("http://etcd:2379/").ok());
  for (const char* bad :
       {"https://127.0.0.1:2379", "127.0.0.1:2379", "http://", "http://h:", "http://h:2379/v3"}) {
    EXPECT_FALSE(membership::EtcdClient::Create(bad).ok()) << bad;
  }
}

// A listening socket that never accepts: the kernel completes connections, nobody answers.
struct SilentListener {
  SilentListener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd, 16);
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~SilentListener() { close(fd); }
  int fd = -1;
  int port = 0;
};

TEST(Etcd, EveryCallIsBoundedWhenEtcdIsAbsentOrSilent) {
  SilentListener silent;
  const std::string silent_url = "http://127.0.0.1:" + std::to_string(silent.port);
  auto client = membership::EtcdClient::Create(silent_url, 300ms);
  ASSERT_TRUE(client.ok());
  auto start = std::chrono::steady_clock::now();
  auto lease = client->GrantLease(5);
  EXPECT_FALSE(lease.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << lease.status().ToString();

  // Nothing listens on the silent listener's port once it is closed: refused at once.
  int closed_port = 0;
  {
    SilentListener gone;
    closed_port = gone.port;
  }
  auto refused =
      membership::EtcdClient::Create("http://127.0.0.1:" + std::to_string(closed_port), 2s);
  ASSERT_TRUE(refused.ok());
  start = std::chrono::steady_clock::now();
  auto range = refused->Prefix("/kvd/members/");
  EXPECT_FALSE(range.ok());
  EXPECT_EQ(range.status().code(), Code::kUnavailable) << range.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

TEST(Etcd, MembershipWithASilentEtcdStartsAndStopsPromptly) {
  SilentListener silent;
  membership::MembershipOptions o;
  o.etcd_url = "http://127.0.0.1:" + std::to_string(silent.port);
  o.name = "node-a";
  o.address = "127.0.0.1:7000";
  o.timeout = 200ms;
  auto start = std::chrono::steady_clock::now();
  auto m = membership::Membership::Start(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 100ms) << "Start must not wait for etcd";
  std::this_thread::sleep_for(300ms);
  start = std::chrono::steady_clock::now();
  m->reset();
  // At most the call in progress (200 ms) and, with no lease, no revoke.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);

  o.ttl = std::chrono::seconds(1);
  EXPECT_FALSE(membership::Membership::Start(o).ok()) << "a TTL under 2 s";
  o.ttl = std::chrono::seconds(10);
  o.etcd_url = "ftp://x";
  EXPECT_FALSE(membership::Membership::Start(o).ok());
}

TEST(PeerNames, AddressesHaveAColonNamesDoNot) {
  EXPECT_TRUE(membership::IsDaemonName("prefill-3"));
  EXPECT_FALSE(membership::IsDaemonName("10.0.0.1:7000"));
  EXPECT_FALSE(membership::IsDaemonName("[::1]:7000"));
  EXPECT_FALSE(membership::IsDaemonName(""));
}

// Every callback of a resolver's lookups, collected; Wait is bounded.
struct Answers {
  std::mutex mu;
  std::vector<Result<std::string>> got;
  membership::PeerResolver::Done Collect() {
    return [this](Result<std::string> r) {
      std::lock_guard lock(mu);
      got.push_back(std::move(r));
    };
  }
  bool Wait(size_t n, std::chrono::milliseconds bound) {
    const auto until = std::chrono::steady_clock::now() + bound;
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard lock(mu);
        if (got.size() >= n) return true;
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
};

TEST(PeerNames, ASilentEtcdFailsEveryWaiterOnceWithinItsTimeout) {
  SilentListener silent;
  membership::ResolverOptions o;
  o.etcd_url = "http://127.0.0.1:" + std::to_string(silent.port);
  o.timeout = 200ms;
  auto resolver = membership::PeerResolver::Start(o);
  ASSERT_TRUE(resolver.ok()) << resolver.status().ToString();
  Answers answers;
  const auto start = std::chrono::steady_clock::now();
  (*resolver)->Resolve("a", answers.Collect());
  (*resolver)->Resolve("a", answers.Collect());  // shares the first one's lookup
  (*resolver)->Resolve("b", answers.Collect());
  ASSERT_TRUE(answers.Wait(3, 3s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "two lookups of 200 ms";
  std::this_thread::sleep_for(50ms);
  std::lock_guard lock(answers.mu);
  ASSERT_EQ(answers.got.size(), 3u) << "one answer per waiter";
  for (const auto& r : answers.got) {
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE(r.status().code() == Code::kTimeout || r.status().code() == Code::kUnavailable)
        << r.status().ToString();
  }
  EXPECT_FALSE((*resolver)->Cached("a").has_value());
}

TEST(PeerNames, StopsPromptlyWithLookupsPending) {
  SilentListener silent;
  membership::ResolverOptions o;
  o.etcd_url = "http://127.0.0.1:" + std::to_string(silent.port);
  o.timeout = 300ms;
  auto resolver = membership::PeerResolver::Start(o);
  ASSERT_TRUE(resolver.ok());
  Answers answers;
  for (const char* name : {"a", "b", "c", "d"}) (*resolver)->Resolve(name, answers.Collect());
  std::this_thread::sleep_for(50ms);
  const auto start = std::chrono::steady_clock::now();
  resolver->reset();
  // At most the lookup in progress; the queued ones are dropped, their callbacks never called.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  std::lock_guard lock(answers.mu);
  EXPECT_LE(answers.got.size(), 1u);
}

// An etcd stand-in on loopback: answers every POST /v3/kv/range with the member record of
// `address` (none when empty), as etcd's JSON gateway does; counts the lookups.
class FakeEtcd {
 public:
  FakeEtcd() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 16);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    url_ = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeEtcd() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  void Set(std::string address) {
    std::lock_guard lock(mu_);
    address_ = std::move(address);
  }
  int lookups() const { return lookups_; }
  const std::string& url() const { return url_; }

 private:
  void Serve() {
    while (true) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string in;
      char buf[4096];
      // The whole request: headers, then Content-Length bytes of body.
      while (true) {
        const size_t end = in.find("\r\n\r\n");
        const size_t at = in.find("Content-Length: ");
        if (end != std::string::npos && at != std::string::npos &&
            in.size() >= end + 4 + std::stoul(in.substr(at + 16))) {
          break;
        }
        const ssize_t n = read(c, buf, sizeof(buf));
        if (n <= 0) break;
        in.append(buf, static_cast<size_t>(n));
      }
      std::string body = "{}";
      {
        std::lock_guard lock(mu_);
        if (!address_.empty()) {
          membership::Member m;
          m.name = "prefill";
          m.address = address_;
          body = "{\"kvs\": [{\"key\": \"" + membership::Base64Encode("/kvd/members/prefill") +
                 "\", \"value\": \"" + membership::Base64Encode(membership::MemberJson(m)) +
                 "\"}]}";
        }
      }
      ++lookups_;
      const std::string out =
          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
          "Content-Length: " +
          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
      (void)!write(c, out.data(), out.size());
      close(c);
    }
  }
  int fd_ = -1;
  std::string url_;
  std::mutex mu_;
  std::string address_;
  std::atomic<int> lookups_{0};
  std::thread thread_;
};

TEST(PeerNames, CachesUntilTheAddressFailsThenLooksUpAgain) {
  FakeEtcd etcd;
  etcd.Set("10.0.0.1:7000");
  membership::ResolverOptions o;
  o.etcd_url = etcd.url();
  o.refresh = 1h;  // no background refresh in this test
  auto made = membership::PeerResolver::Start(o);
  ASSERT_TRUE(made.ok());
  membership::PeerResolver& resolver = **made;
  Answers answers;
  resolver.Resolve("prefill", answers.Collect());
  ASSERT_TRUE(answers.Wait(1, 3s));
  ASSERT_TRUE(answers.got[0].ok()) << answers.got[0].status().ToString();
  EXPECT_EQ(*answers.got[0], "10.0.0.1:7000");
  EXPECT_EQ(resolver.Cached("prefill"), "10.0.0.1:7000");

  // The kvd restarts on another port: the cached address stands until it fails...
  etcd.Set("10.0.0.1:7001");
  EXPECT_EQ(resolver.Cached("prefill"), "10.0.0.1:7000");
  EXPECT_EQ(etcd.lookups(), 1) << "a cached name costs no lookup";
  resolver.Forget("10.0.0.2:9");  // another address: nothing changes
  EXPECT_EQ(resolver.Cached("prefill"), "10.0.0.1:7000");
  // ... then the next request looks the name up again.
  resolver.Forget("10.0.0.1:7000");
  EXPECT_FALSE(resolver.Cached("prefill").has_value());
  resolver.Resolve("prefill", answers.Collect());
  ASSERT_TRUE(answers.Wait(2, 3s));
  ASSERT_TRUE(answers.got[1].ok()) << answers.got[1].status().ToString();
  EXPECT_EQ(*answers.got[1], "10.0.0.1:7001");

  // etcd no longer lists it: NotFound, and the name leaves the cache.
  etcd.Set("");
  resolver.Forget("10.0.0.1:7001");
  resolver.Resolve("prefill", answers.Collect());
  ASSERT_TRUE(answers.Wait(3, 3s));
  EXPECT_EQ(answers.got[2].status().code(), Code::kNotFound) << answers.got[2].status().ToString();
  EXPECT_FALSE(resolver.Cached("prefill").has_value());
}

TEST(PeerNames, AStaleAddressIsUsedAtOnceAndRefreshedBehind) {
  FakeEtcd etcd;
  etcd.Set("10.0.0.1:7000");
  membership::ResolverOptions o;
  o.etcd_url = etcd.url();
  o.refresh = 1ms;
  auto made = membership::PeerResolver::Start(o);
  ASSERT_TRUE(made.ok());
  Answers answers;
  (*made)->Resolve("prefill", answers.Collect());
  ASSERT_TRUE(answers.Wait(1, 3s));
  etcd.Set("10.0.0.1:7001");
  std::this_thread::sleep_for(5ms);
  EXPECT_EQ((*made)->Cached("prefill"), "10.0.0.1:7000") << "stale, yet served without waiting";
  // The background lookup it queued brings the new address, bounded.
  const auto until = std::chrono::steady_clock::now() + 3s;
  while ((*made)->Cached("prefill") != "10.0.0.1:7001" &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ((*made)->Cached("prefill"), "10.0.0.1:7001");
  EXPECT_GE(etcd.lookups(), 2);
}

}  // namespace
}  // namespace kv::daemon
