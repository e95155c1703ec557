// Hostile input on both of kvd's sockets: each bad connection is closed, kvd keeps serving.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "connector/connector.h"
#include "daemon/daemon.h"
#include "protocol/kvd.pb.h"

namespace kv {
namespace {

class Robustness : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvd-robust-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    daemon::DaemonOptions options;
    options.name = "victim";
    options.socket_path = (dir_ / "kvd.sock").string();
    options.transport_name = "local";
    options.max_frame_bytes = 64 * 1024;
    options.partial_frame_timeout = std::chrono::milliseconds(300);
    options.handshake_timeout = std::chrono::milliseconds(2000);
    auto d = daemon::Daemon::Start(std::move(options));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = *d;
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  int ConnectUnix() {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::string path = (dir_ / "kvd.sock").string();
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  }
  int ConnectTcp() {
    const std::string address = daemon_->listen_address();
    const int port = std::stoi(address.substr(address.rfind(':') + 1));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  }

  // True when kvd closed the connection within 5 s (any bytes it sent first are skipped).
  static bool ClosedByPeer(int fd) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return true;
    }
    return false;
  }

  void ExpectAlive() {
    auto status =
        connector::QueryDaemonStatus((dir_ / "kvd.sock").string(), std::chrono::milliseconds(5000));
    ASSERT_TRUE(status.ok()) << status.status().ToString();
    EXPECT_EQ(status->name(), "victim");
  }

  std::filesystem::path dir_;
  std::shared_ptr<daemon::Daemon> daemon_;
};

void SendAll(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

std::string RandomBytes(size_t n) {
  std::mt19937 rng(42);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  // A small length prefix that parses as nothing protobuf accepts: the body is garbage.
  s[0] = 100;
  s[1] = s[2] = s[3] = 0;
  std::fill(s.begin() + 4, s.begin() + 104, '\xff');
  return s;
}

const std::string kHugePrefix("\xff\xff\xff\x7f", 4);
const std::string kHalfMessage = std::string("\x10\x00\x00\x00", 4) + "12345";

TEST_F(Robustness, RandomBytesOnTheUnixSocket) {
  int fd = ConnectUnix();
  SendAll(fd, RandomBytes(4096));
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);
  ExpectAlive();
}

TEST_F(Robustness, RandomBytesOnTheTcpPort) {
  int fd = ConnectTcp();
  SendAll(fd, RandomBytes(4096));
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);
  ExpectAlive();
}

TEST_F(Robustness, HugeLengthPrefixOnBothSockets) {
  for (int fd : {ConnectUnix(), ConnectTcp()}) {
    SendAll(fd, kHugePrefix);
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
  }
  ExpectAlive();
}

TEST_F(Robustness, HalfAMessageOnBothSocketsTimesOut) {
  for (int fd : {ConnectUnix(), ConnectTcp()}) {
    SendAll(fd, kHalfMessage);
    EXPECT_TRUE(ClosedByPeer(fd));  // partial-frame deadline, 300 ms here
    close(fd);
  }
  ExpectAlive();
}

TEST_F(Robustness, AnEngineThatNeverSaysHelloCannotRegister) {
  int fd = ConnectUnix();
  // seq 1, save_layer {request_id "r"}: a valid message, but before hello.
  const std::string body("\x08\x01\x22\x03\x0a\x01r", 7);
  std::string frame(4, '\0');
  frame[0] = static_cast<char>(body.size());
  SendAll(fd, frame + body);
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);
  ExpectAlive();
}

TEST_F(Robustness, ASilentPeerIsDroppedAfterTheHandshakeTimeout) {
  int fd = ConnectTcp();
  EXPECT_TRUE(ClosedByPeer(fd));  // 2 s handshake timeout, read bounded at 5 s
  close(fd);
  ExpectAlive();
}

TEST_F(Robustness, GoodEnginesAreServedBesideBadOnes) {
  int bad = ConnectUnix();
  SendAll(bad, kHalfMessage);
  auto engine = connector::Connector::Open((dir_ / "kvd.sock").string(),
                                           {"good", 0, 1, std::chrono::milliseconds(5000)});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 4;
  spec.heads = 1;
  spec.block_size = 16;
  spec.content_bytes = 64;
  EXPECT_TRUE((*engine)->RegisterKvCaches(connector::HostCaches({&spec, 1})).ok());
  EXPECT_TRUE(ClosedByPeer(bad));
  close(bad);
  auto status = connector::DaemonStatusOf(**engine);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->regions(), 1u);
}

}  // namespace
}  // namespace kv
