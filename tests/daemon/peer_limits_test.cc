// Issue 19, limits: connections before authentication and per source address are capped at
// accept (the rest are closed at once, counted in the status); a hello announcing 20,000 ranks
// and a load naming one destination block twice are refused.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "connector/connector.h"
#include "daemon/daemon.h"
#include "base/framing.h"
#include "protocol/kvd.pb.h"

namespace kv {
namespace {

using Clock = std::chrono::steady_clock;

int ConnectTo(const std::string& address) {
  const size_t colon = address.rfind(':');
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// What kvd did with a connection within `wait`: sent a frame (1), closed it without one (0), or
// neither (-1).
int Outcome(int fd, std::chrono::milliseconds wait, std::string* first_frame = nullptr) {
  kv::FrameDecoder decoder;
  const auto until = Clock::now() + wait;
  while (Clock::now() < until) {
    auto frame = decoder.Next();
    if (frame.ok() && frame->has_value()) {
      if (first_frame != nullptr) *first_frame = **frame;
      return 1;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return 0;
    decoder.Append(buf, static_cast<size_t>(n));
  }
  return -1;
}

std::shared_ptr<daemon::Daemon> Start(daemon::DaemonOptions options) {
  options.transport_name = "local";
  auto d = daemon::Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

TEST(PeerLimits, ConnectionsStillAuthenticatingAreCapped) {
  daemon::DaemonOptions options;
  options.name = "capped";
  options.auth_secret = std::string(32, 'k');
  options.max_unauthenticated_peers = 4;
  options.handshake_timeout = std::chrono::milliseconds(5000);
  auto d = Start(std::move(options));
  ASSERT_TRUE(d);
  std::vector<int> fds;
  int served = 0, refused = 0;
  for (int i = 0; i < 10; ++i) {
    fds.push_back(ConnectTo(d->listen_address()));
    const int outcome = Outcome(fds.back(), std::chrono::milliseconds(1000));
    served += outcome == 1;
    refused += outcome == 0;
  }
  EXPECT_EQ(served, 4);
  EXPECT_EQ(refused, 6);
  auto status = d->Snapshot();
  EXPECT_EQ(status.unauthenticated_connections(), 4u);
  EXPECT_EQ(status.peers_refused(), 6u);
  for (int fd : fds) close(fd);
}

TEST(PeerLimits, ConnectionsFromOneAddressAreCapped) {
  daemon::DaemonOptions options;
  options.name = "capped";
  options.max_peer_connections_per_address = 3;
  auto d = Start(std::move(options));
  ASSERT_TRUE(d);
  std::vector<int> fds;
  int served = 0, refused = 0;
  for (int i = 0; i < 5; ++i) {
    fds.push_back(ConnectTo(d->listen_address()));
    const int outcome = Outcome(fds.back(), std::chrono::milliseconds(1000));
    served += outcome == 1;  // without a secret: kvd's hello
    refused += outcome == 0;
  }
  EXPECT_EQ(served, 3);
  EXPECT_EQ(refused, 2);
  EXPECT_EQ(d->Snapshot().peer_connections(), 3u);
  for (int fd : fds) close(fd);
}

TEST(PeerLimits, AHelloWith20000RanksIsRefused) {
  daemon::DaemonOptions options;
  options.name = "victim";
  auto d = Start(std::move(options));
  ASSERT_TRUE(d);
  const int fd = ConnectTo(d->listen_address());
  std::string first;
  ASSERT_EQ(Outcome(fd, std::chrono::milliseconds(2000), &first), 1);
  proto::PeerMessage theirs;
  ASSERT_TRUE(theirs.ParseFromString(first));
  ASSERT_EQ(theirs.body_case(), proto::PeerMessage::kHello);
  proto::PeerMessage hello;
  hello.mutable_hello()->set_protocol_version(proto::PEER_PROTOCOL);
  hello.mutable_hello()->set_node_name("flood");
  hello.mutable_hello()->set_transport(theirs.hello().transport());
  // A transport address kvd can connect to, so that only the ranks can be refused.
  hello.mutable_hello()->set_transport_address(theirs.hello().transport_address());
  hello.mutable_hello()->set_tp_size(20000);
  for (int r = 0; r < 20000; ++r) hello.mutable_hello()->add_ranks()->set_tp_rank(r);
  std::string frame;
  ASSERT_TRUE(kv::AppendFrame(hello.SerializeAsString(), &frame).ok());
  ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
  EXPECT_EQ(Outcome(fd, std::chrono::milliseconds(3000)), 0) << "kvd kept the connection";
  close(fd);
  const proto::DaemonStatus status = d->Snapshot();
  for (const auto& p : status.peers()) EXPECT_NE(p.state(), "ready");
}

TEST(PeerLimits, ALoadNamingADestinationBlockTwiceIsRefused) {
  daemon::DaemonOptions options;
  options.name = "decode";
  auto d = Start(std::move(options));
  ASSERT_TRUE(d);
  auto engine =
      connector::Connector::OpenEmbedded(d, {"decode", 0, 1, std::chrono::milliseconds(5000)});
  ASSERT_TRUE(engine.ok());
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 4;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  ASSERT_TRUE((*engine)->RegisterKvCaches(connector::HostCaches({&spec, 1})).ok());
  connector::TransferParams params;
  params.peer_address = "127.0.0.1:1";
  params.tokens = 32;
  const std::vector<int64_t> blocks = {2, 2};
  Status s = (*engine)->StartLoad("r", params, blocks);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("named twice"), std::string::npos) << s.ToString();
}

// A peer's Want flood holds at most max_requests_per_peer requests on the source.
TEST(PeerLimits, RequestsBoundToOnePeerAreCapped) {
  daemon::DaemonOptions options;
  options.name = "prefill";
  options.max_requests_per_peer = 2;
  auto prefill = Start(std::move(options));
  daemon::DaemonOptions decode_options;
  decode_options.name = "decode";
  auto decode = Start(std::move(decode_options));
  ASSERT_TRUE(prefill && decode);
  auto engine =
      connector::Connector::OpenEmbedded(decode, {"decode", 0, 1, std::chrono::milliseconds(5000)});
  ASSERT_TRUE(engine.ok());
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 8;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  ASSERT_TRUE((*engine)->RegisterKvCaches(connector::HostCaches({&spec, 1})).ok());
  connector::TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  // Three loads the prefill side has nothing of yet (layer streaming): two are held there.
  for (int i = 0; i < 3; ++i) {
    const std::vector<int64_t> blocks = {i};
    ASSERT_TRUE((*engine)->StartLoad("r" + std::to_string(i), params, blocks).ok());
  }
  Status third = (*engine)->WaitLayer("r2", 0);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.code(), Code::kResourceExhausted) << third.ToString();
  EXPECT_EQ(prefill->Snapshot().transfers_in_flight(), 2u);
}

}  // namespace
}  // namespace kv
