// Issue 19, the peer port encrypted: two kvds with the cluster secret talk through a TCP relay
// that records every byte and can tamper with one frame. Through it a request loads as always,
// but its request id and transfer token never appear on the wire (without a secret they do: the
// recording sees the Want); a flipped bit in a sealed frame, a replayed frame and two frames
// swapped each close the connection, the decode engine hears why ("did not open"), and both kvds
// go on serving each other directly.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/framing.h"
#include "connector/connector.h"
#include "daemon/daemon.h"
#include "tests/support/tiny_pd.h"
#include "tools/kvbench/pd/pd_sim.h"
#include "transport/transport.h"

namespace kv {
namespace {

using connector::Connector;
using Clock = std::chrono::steady_clock;

const std::string kSecret(40, 's');

std::shared_ptr<daemon::Daemon> StartDaemon(const std::string& name, const std::string& secret) {
  daemon::DaemonOptions options;
  options.name = name;
  options.listen = "127.0.0.1:0";
  options.auth_secret = secret;
  // The pd runs here ask before the prefill finished (layer streaming): no token yet then.
  options.require_transfer_token = false;
  options.lease = std::chrono::milliseconds(10000);
  options.handshake_timeout = std::chrono::milliseconds(3000);
  // Authenticated peers beat often, so that a frame follows the hello soon (the reorder case).
  options.heartbeat_interval = std::chrono::milliseconds(50);
  options.missed_heartbeats = 40;
  auto local = transport::CreateTransport("local");
  EXPECT_TRUE(local.ok()) << local.status().ToString();
  if (!local.ok()) return nullptr;
  options.transport = std::move(local).value();
  auto d = daemon::Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

// ---- the relay ------------------------------------------------------------------------------

enum class Tamper { kNone, kFlip, kReplay, kReorder };
// Which way the tampered frame goes: from the kvd the relay dials (`target`, the acceptor) to
// the kvd that dialed the relay, or the other way.
enum class Way { kToDialer, kToAcceptor };

// A TCP forwarder on 127.0.0.1 to `target` (HOST:PORT), frame-aware: it records every byte both
// ways as it came from its sender and forwards frame by frame. In the direction `way`, frame `at`
// (counting from 0, the plaintext challenge and proof included) is tampered with: kFlip flips
// one bit of its body, kReplay sends it twice, kReorder sends frame at + 1 before it.
class Relay {
 public:
  Relay(const std::string& target, Tamper tamper, size_t at, Way way = Way::kToDialer)
      : tamper_(tamper), at_(at), way_(way) {
    const size_t colon = target.rfind(':');
    target_.sin_family = AF_INET;
    target_.sin_port = htons(static_cast<uint16_t>(std::stoi(target.substr(colon + 1))));
    inet_pton(AF_INET, target.substr(0, colon).c_str(), &target_.sin_addr);
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof any;
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
    EXPECT_EQ(listen(listen_fd_, 16), 0);
    EXPECT_EQ(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&any), &length), 0);
    address_ = "127.0.0.1:" + std::to_string(ntohs(any.sin_port));
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~Relay() {
    stop_ = true;
    acceptor_.join();  // then no forwarder is added
    {
      std::lock_guard lock(mu_);
      for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : threads_) t.join();
    for (int fd : fds_) close(fd);
    close(listen_fd_);
  }

  const std::string& address() const { return address_; }
  std::string recorded() {
    std::lock_guard lock(mu_);
    return recorded_;
  }
  size_t connections() {
    std::lock_guard lock(mu_);
    return fds_.size() / 2;
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(server, reinterpret_cast<const sockaddr*>(&target_), sizeof target_) != 0) {
        close(client);
        close(server);
        continue;
      }
      std::lock_guard lock(mu_);
      fds_.push_back(client);
      fds_.push_back(server);
      const bool to_dialer = way_ == Way::kToDialer;
      threads_.emplace_back([this, client, server, to_dialer] {
        Forward(client, server, to_dialer ? Tamper::kNone : tamper_);
      });
      threads_.emplace_back([this, server, client, to_dialer] {
        Forward(server, client, to_dialer ? tamper_ : Tamper::kNone);
      });
    }
  }

  void Forward(int from, int to, Tamper tamper) {
    FrameDecoder decoder;
    size_t index = 0;
    std::string held;  // kReorder: frame `at_`, sent after the next one
    char buf[64 * 1024];
    while (!stop_) {
      pollfd p{from, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = recv(from, buf, sizeof buf, 0);
      if (n <= 0) break;
      {
        std::lock_guard lock(mu_);
        recorded_.append(buf, static_cast<size_t>(n));
      }
      decoder.Append(buf, static_cast<size_t>(n));
      while (true) {
        auto frame = decoder.Next();
        if (!frame.ok() || !frame->has_value()) break;
        std::string body = std::move(**frame);
        std::string out;
        const size_t i = index++;
        if (tamper == Tamper::kFlip && i == at_ && !body.empty()) {
          body[body.size() / 2] ^= 0x04;
        }
        if (tamper == Tamper::kReorder && i == at_) {
          held = std::move(body);
          continue;
        }
        bool framed = AppendFrame(body, &out).ok();
        if (tamper == Tamper::kReplay && i == at_) framed = framed && AppendFrame(body, &out).ok();
        if (tamper == Tamper::kReorder && i == at_ + 1) {
          framed = framed && AppendFrame(held, &out).ok();
        }
        EXPECT_TRUE(framed);
        if (send(to, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size())) {
          break;
        }
      }
    }
    shutdown(to, SHUT_WR);
  }

  const Tamper tamper_;
  const size_t at_;
  const Way way_;
  sockaddr_in target_{};
  int listen_fd_ = -1;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<int> fds_;  // guarded by mu_
  std::string recorded_;  // guarded by mu_
  std::thread acceptor_;
  std::vector<std::thread> threads_;  // the forwarders: added by the acceptor under mu_
};

// ---- engines --------------------------------------------------------------------------------

LayoutSpec TinySpec() {
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 4;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  return spec;
}

std::unique_ptr<Connector> Engine(const std::shared_ptr<daemon::Daemon>& d,
                                  const std::string& instance) {
  auto engine = Connector::OpenEmbedded(d, {instance, 0, 1, std::chrono::milliseconds(8000)});
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return nullptr;
  const LayoutSpec spec = TinySpec();
  EXPECT_TRUE((*engine)->RegisterKvCaches(connector::HostCaches({&spec, 1})).ok());
  return std::move(engine).value();
}

Status Load(Connector& sink, const std::string& request, const connector::TransferParams& params) {
  const std::vector<int64_t> blocks = {1};
  KV_RETURN_IF_ERROR(sink.StartLoad(request, params, blocks));
  for (int l = 0; l < 2; ++l) KV_RETURN_IF_ERROR(sink.WaitLayer(request, l));
  return Status::Ok();
}

connector::PdConfig Small() {
  return testing_support::TinyPd();
}

// A P/D run straight between the two kvds (no relay): both still serve.
void ExpectServing(const std::shared_ptr<daemon::Daemon>& prefill,
                   const std::shared_ptr<daemon::Daemon>& decode) {
  auto r = connector::RunPd(
      Small(),
      [&](const connector::ConnectorOptions& o) { return Connector::OpenEmbedded(prefill, o); },
      [&](const connector::ConnectorOptions& o) { return Connector::OpenEmbedded(decode, o); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verified, Small().requests) << r->first_error;
}

// ---- the tests ------------------------------------------------------------------------------

TEST(PeerSeal, TheWireCarriesNeitherTheRequestIdNorItsTransferToken) {
  const std::string request = "req-canary-5f0c2a9e-the-request-id";
  for (const bool with_secret : {true, false}) {
    SCOPED_TRACE(with_secret ? "with a secret" : "loopback without a secret");
    const std::string secret = with_secret ? kSecret : "";
    auto prefill = StartDaemon("prefill-node", secret);
    auto decode = StartDaemon("decode-node", secret);
    ASSERT_TRUE(prefill && decode);
    Relay relay(prefill->listen_address(), Tamper::kNone, 0);
    auto source = Engine(prefill, "prefill");
    auto sink = Engine(decode, "decode");
    ASSERT_TRUE(source && sink);
    const std::vector<int64_t> blocks = {0};
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(source->SaveLayer(request, l, blocks).ok());
    auto params = source->RequestFinished(request);
    ASSERT_TRUE(params.ok()) << params.status().ToString();
    ASSERT_FALSE(params->transfer_token.empty());
    params->peer_address = relay.address();
    params->tokens = 16;
    const Status loaded = Load(*sink, request, *params);
    ASSERT_TRUE(loaded.ok()) << loaded.ToString();
    const std::string wire = relay.recorded();
    EXPECT_EQ(relay.connections(), 1u);
    ASSERT_GT(wire.size(), 200u);
    const bool id_seen = wire.find(request) != std::string::npos;
    const bool token_seen = wire.find(params->transfer_token) != std::string::npos;
    if (with_secret) {
      EXPECT_FALSE(id_seen) << "the request id crossed the wire in the clear";
      EXPECT_FALSE(token_seen) << "the transfer token crossed the wire in the clear";
      // Only the challenges are plaintext: the node names are there, the layouts' engine
      // instance names are not.
      EXPECT_NE(wire.find("decode-node"), std::string::npos);
    } else {
      // The recording sees what crosses: without a secret the Want is plaintext (as before).
      EXPECT_TRUE(id_seen);
      EXPECT_TRUE(token_seen);
    }
  }
}

TEST(PeerSeal, AFlippedReplayedOrReorderedFrameClosesThePeerAndBothKvdsServeOn) {
  auto prefill = StartDaemon("prefill-node", kSecret);
  auto decode = StartDaemon("decode-node", kSecret);
  ASSERT_TRUE(prefill && decode);
  // The prefill kvd's frames 0 and 1 are its challenge and proof (plaintext); frame 2 is its
  // hello, the first sealed one, and heartbeats follow it.
  for (const Tamper tamper : {Tamper::kFlip, Tamper::kReplay, Tamper::kReorder}) {
    const char* what = tamper == Tamper::kFlip     ? "flipped bit"
                       : tamper == Tamper::kReplay ? "replayed frame"
                                                   : "reordered frames";
    SCOPED_TRACE(what);
    {
      Relay relay(prefill->listen_address(), tamper, 2);
      auto sink = Engine(decode, "decode");
      ASSERT_TRUE(sink);
      connector::TransferParams params;
      params.peer_address = relay.address();
      params.tokens = 16;
      const Status s = Load(*sink, "r", params);
      ASSERT_FALSE(s.ok()) << "a " << what << " went unnoticed";
      // The decode kvd closed the peer on the frame that did not open, and says so.
      EXPECT_NE(s.message().find("did not open"), std::string::npos) << s.ToString();
      EXPECT_EQ(relay.connections(), 1u);
    }
    ExpectServing(prefill, decode);
  }
  // A frame that does not open counts as an authentication failure (kvctl status).
  EXPECT_EQ(decode->Snapshot().auth_failures(), 3u);
  EXPECT_EQ(prefill->Snapshot().auth_failures(), 0u);
}

// The other direction: the decode kvd's hello altered on its way; the prefill kvd closes the
// connection (and counts an authentication failure), the load fails, both serve on.
TEST(PeerSeal, AFlippedFrameTowardsTheAcceptorClosesItToo) {
  auto prefill = StartDaemon("prefill-node", kSecret);
  auto decode = StartDaemon("decode-node", kSecret);
  ASSERT_TRUE(prefill && decode);
  {
    Relay relay(prefill->listen_address(), Tamper::kFlip, 2, Way::kToAcceptor);
    auto sink = Engine(decode, "decode");
    ASSERT_TRUE(sink);
    connector::TransferParams params;
    params.peer_address = relay.address();
    params.tokens = 16;
    const Status s = Load(*sink, "r", params);
    ASSERT_FALSE(s.ok()) << "a flipped bit went unnoticed";
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (prefill->Snapshot().auth_failures() == 0 && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(prefill->Snapshot().auth_failures(), 1u);
    EXPECT_EQ(decode->Snapshot().auth_failures(), 0u);
  }
  ExpectServing(prefill, decode);
  EXPECT_EQ(prefill->Snapshot().auth_failures(), 1u);
}

}  // namespace
}  // namespace kv
