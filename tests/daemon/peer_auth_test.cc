// Issue 19, peer authentication: a connection to a kvd that holds a secret gets its challenge and
// nothing else (no hello, no layout, no transport endpoint) until it proved the secret; a wrong
// secret is refused quickly with a clear error on both sides and both kvds keep serving; without
// a secret only loopback peers are served.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "base/framing.h"
#include "connector/connector.h"
#include "daemon/daemon.h"
#include "daemon/peer_auth.h"
#include "protocol/kvd.pb.h"
#include "tests/support/spy_transport.h"
#include "tests/support/tiny_pd.h"
#include "tools/kvbench/pd/pd_sim.h"
#include "transport/transport.h"

namespace kv {
namespace {

using connector::Connector;
using testing::SpyTransport;
using Clock = std::chrono::steady_clock;

const std::string kSecret(40, 's');
const std::string kOtherSecret(40, 'o');

std::shared_ptr<daemon::Daemon> StartDaemon(const std::string& name, const std::string& secret,
                                            std::shared_ptr<SpyTransport::Counters> spy = nullptr,
                                            std::string listen = "127.0.0.1:0",
                                            bool insecure = false) {
  daemon::DaemonOptions options;
  options.name = name;
  options.listen = std::move(listen);
  options.auth_secret = secret;
  options.insecure_peers = insecure;
  // With a secret transfer tokens are required (--transfer-token auto): RunPd's prefill engines
  // fix each request's token before their first save and its decode engines present it.
  options.lease = std::chrono::milliseconds(10000);
  options.handshake_timeout = std::chrono::milliseconds(2000);
  auto local = transport::CreateTransport("local");
  EXPECT_TRUE(local.ok()) << local.status().ToString();
  if (!local.ok()) return nullptr;
  if (spy) {
    options.transport = std::make_unique<SpyTransport>(std::move(local).value(), spy);
  } else {
    options.transport = std::move(local).value();
  }
  auto d = daemon::Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

int ConnectTo(const std::string& address, const char* from_ip = nullptr) {
  const size_t colon = address.rfind(':');
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (from_ip != nullptr) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    inet_pton(AF_INET, from_ip, &local.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
      close(fd);
      return -1;
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The next PeerMessage kvd sends within `wait`; nullopt when none came (or the socket closed).
std::optional<proto::PeerMessage> ReadMessage(int fd, kv::FrameDecoder& decoder,
                                              std::chrono::milliseconds wait, bool* closed) {
  const auto deadline = Clock::now() + wait;
  for (;;) {
    auto frame = decoder.Next();
    if (!frame.ok()) return std::nullopt;
    if (frame->has_value()) {
      proto::PeerMessage m;
      if (!m.ParseFromString(**frame)) return std::nullopt;
      return m;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      *closed = true;
      return std::nullopt;
    }
    decoder.Append(buf, static_cast<size_t>(n));
  }
}

void Send(int fd, const proto::PeerMessage& m) {
  std::string frame;
  ASSERT_TRUE(kv::AppendFrame(m.SerializeAsString(), &frame).ok());
  ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
}

// ---- the proof and the secret file ----------------------------------------------------------

TEST(PeerAuthProof, BindsSecretRoleNamesAndNonces) {
  const std::string a(32, 'a'), b(32, 'b');
  const std::string base = daemon::auth::Proof(kSecret, 2, true, "p", "d", a, b);
  EXPECT_EQ(base.size(), daemon::auth::kProofBytes);
  EXPECT_TRUE(daemon::auth::Equal(base, daemon::auth::Proof(kSecret, 2, true, "p", "d", a, b)));
  for (const std::string& other :
       {daemon::auth::Proof(kOtherSecret, 2, true, "p", "d", a, b),
        daemon::auth::Proof(kSecret, 3, true, "p", "d", a, b),
        daemon::auth::Proof(kSecret, 2, false, "p", "d", a, b),  // reflected: the other role
        daemon::auth::Proof(kSecret, 2, true, "x", "d", a, b),
        daemon::auth::Proof(kSecret, 2, true, "p", "x", a, b),
        daemon::auth::Proof(kSecret, 2, true, "p", "d", b, a),
        daemon::auth::Proof(kSecret, 2, true, "pd", "", a, b)}) {
    EXPECT_FALSE(daemon::auth::Equal(base, other));
  }
  EXPECT_FALSE(daemon::auth::Equal("", ""));
}

class SecretFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() /
            ("kvd-secret-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove(path_); }
  void Write(const std::string& bytes, mode_t mode) {
    std::ofstream(path_, std::ios::binary) << bytes;
    ASSERT_EQ(chmod(path_.c_str(), mode), 0);
  }
  std::filesystem::path path_;
};

TEST_F(SecretFile, OwnerOnlyAndLongEnoughIsRead) {
  Write(kSecret, 0600);
  auto secret = daemon::auth::ReadSecretFile(path_.string());
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  EXPECT_EQ(*secret, kSecret);
}

TEST_F(SecretFile, ReadableByOthersIsRefused) {
  Write(kSecret, 0644);
  auto secret = daemon::auth::ReadSecretFile(path_.string());
  ASSERT_FALSE(secret.ok());
  EXPECT_NE(secret.status().message().find("0600"), std::string::npos)
      << secret.status().ToString();
}

TEST_F(SecretFile, ShorterThan32BytesIsRefused) {
  Write(std::string(31, 'x'), 0600);
  auto secret = daemon::auth::ReadSecretFile(path_.string());
  ASSERT_FALSE(secret.ok());
  EXPECT_NE(secret.status().message().find("31 bytes"), std::string::npos)
      << secret.status().ToString();
}

// The kvd executable refuses a secret file others can read, before it serves anything.
TEST_F(SecretFile, KvdRefusesAFileOthersCanReadWithAClearError) {
  Write(kSecret, 0640);
  const auto kvd = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "kvd";
  const std::string command = "'" + kvd.string() + "' --socket '" + path_.string() +
                              ".sock' --auth-secret-file '" + path_.string() + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << output;
  EXPECT_NE(output.find("must be 0600"), std::string::npos) << output;
  EXPECT_EQ(output.find("ready"), std::string::npos) << output;
}

TEST(PeerAuthOptions, AShortSecretInTheOptionsIsRefusedAtStart) {
  daemon::DaemonOptions options;
  options.transport_name = "local";
  options.auth_secret = "short";
  EXPECT_FALSE(daemon::Daemon::Start(std::move(options)).ok());
}

// ---- a peer without the secret ------------------------------------------------------------------

TEST(PeerAuth, APeerWithoutTheSecretLearnsNothingAndGetsNoEndpoint) {
  auto spy = std::make_shared<SpyTransport::Counters>();
  auto victim = StartDaemon("victim", kSecret, spy);
  ASSERT_TRUE(victim);
  // An engine with a cache: before the fix its layout went out in the hello to any client.
  auto engine = Connector::OpenEmbedded(victim, {"prefill", 0, 1, std::chrono::milliseconds(5000)});
  ASSERT_TRUE(engine.ok());
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 4;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  ASSERT_TRUE((*engine)->RegisterKvCaches(connector::HostCaches({&spec, 1})).ok());

  int fd = ConnectTo(victim->listen_address());
  ASSERT_GE(fd, 0);
  kv::FrameDecoder decoder;
  bool closed = false;
  auto first = ReadMessage(fd, decoder, std::chrono::milliseconds(2000), &closed);
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->body_case(), proto::PeerMessage::kChallenge);
  EXPECT_EQ(first->challenge().node_name(), "victim");
  EXPECT_EQ(first->challenge().nonce().size(), daemon::auth::kNonceBytes);
  // Nothing else follows while we say nothing.
  EXPECT_FALSE(ReadMessage(fd, decoder, std::chrono::milliseconds(300), &closed).has_value());
  EXPECT_FALSE(closed);

  // A hello straight away (what every kvd sent before) is refused, with the reason.
  proto::PeerMessage hello;
  hello.mutable_hello()->set_protocol_version(proto::PEER_PROTOCOL);
  hello.mutable_hello()->set_node_name("intruder");
  hello.mutable_hello()->set_transport("local");
  Send(fd, hello);
  auto refused = ReadMessage(fd, decoder, std::chrono::milliseconds(2000), &closed);
  ASSERT_TRUE(refused.has_value());
  ASSERT_EQ(refused->body_case(), proto::PeerMessage::kRefused);
  EXPECT_NE(refused->refused().reason().find("without authenticating"), std::string::npos);
  EXPECT_FALSE(ReadMessage(fd, decoder, std::chrono::milliseconds(2000), &closed).has_value());
  EXPECT_TRUE(closed);
  close(fd);

  // A guessed proof: refused, closed.
  fd = ConnectTo(victim->listen_address());
  ASSERT_GE(fd, 0);
  kv::FrameDecoder decoder2;
  closed = false;
  auto challenge = ReadMessage(fd, decoder2, std::chrono::milliseconds(2000), &closed);
  ASSERT_TRUE(challenge.has_value());
  proto::PeerMessage mine;
  mine.mutable_challenge()->set_protocol_version(proto::PEER_PROTOCOL);
  mine.mutable_challenge()->set_node_name("intruder");
  mine.mutable_challenge()->set_nonce(std::string(32, 'n'));
  Send(fd, mine);
  auto their_proof = ReadMessage(fd, decoder2, std::chrono::milliseconds(2000), &closed);
  ASSERT_TRUE(their_proof.has_value());
  EXPECT_EQ(their_proof->body_case(), proto::PeerMessage::kProof);
  proto::PeerMessage guess;
  guess.mutable_proof()->set_mac(std::string(32, 'g'));
  Send(fd, guess);
  auto answer = ReadMessage(fd, decoder2, std::chrono::milliseconds(2000), &closed);
  ASSERT_TRUE(answer.has_value());
  ASSERT_EQ(answer->body_case(), proto::PeerMessage::kRefused);
  EXPECT_NE(answer->refused().reason().find("authentication failed"), std::string::npos);
  EXPECT_FALSE(ReadMessage(fd, decoder2, std::chrono::milliseconds(2000), &closed).has_value());
  EXPECT_TRUE(closed);
  close(fd);

  EXPECT_EQ(spy->endpoints_opened.load(), 0);
  EXPECT_EQ(spy->connects.load(), 0);
  auto status = victim->Snapshot();
  EXPECT_EQ(status.peer_auth(), "secret");
  EXPECT_GE(status.auth_failures(), 2u);
  EXPECT_EQ(status.name(), "victim");
}

// ---- two kvds
// ------------------------------------------------------------------------------------

connector::PdConfig Small() {
  return testing_support::TinyPd();
}

Result<connector::PdResult> RunPd(const std::shared_ptr<daemon::Daemon>& prefill,
                                  const std::shared_ptr<daemon::Daemon>& decode) {
  return connector::RunPd(
      Small(),
      [&](const connector::ConnectorOptions& o) { return Connector::OpenEmbedded(prefill, o); },
      [&](const connector::ConnectorOptions& o) { return Connector::OpenEmbedded(decode, o); });
}

TEST(PeerAuth, KvdsWithTheSameSecretMoveEveryByte) {
  auto prefill = StartDaemon("prefill-node", kSecret);
  auto decode = StartDaemon("decode-node", kSecret);
  ASSERT_TRUE(prefill && decode);
  auto r = RunPd(prefill, decode);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verified, Small().requests) << r->first_error;
  EXPECT_EQ(prefill->Snapshot().auth_failures(), 0u);
}

LayoutSpec TinySpec() {
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 4;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  return spec;
}

// A decode engine on `decode` loads request "r" from `prefill`'s kvd: the error its first layer
// ends with.
Status LoadFrom(const std::shared_ptr<daemon::Daemon>& decode,
                const std::shared_ptr<daemon::Daemon>& prefill) {
  auto sink = Connector::OpenEmbedded(decode, {"decode", 0, 1, std::chrono::milliseconds(8000)});
  if (!sink.ok()) return sink.status();
  const LayoutSpec spec = TinySpec();
  KV_RETURN_IF_ERROR((*sink)->RegisterKvCaches(connector::HostCaches({&spec, 1})).status());
  connector::TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  const std::vector<int64_t> blocks = {1};
  KV_RETURN_IF_ERROR((*sink)->StartLoad("r", params, blocks));
  return (*sink)->WaitLayer("r", 0);
}

TEST(PeerAuth, AWrongSecretIsRefusedQuicklyOnBothSidesAndBothKeepServing) {
  auto prefill = StartDaemon("prefill-node", kSecret);
  auto decode = StartDaemon("decode-node", kOtherSecret);
  ASSERT_TRUE(prefill && decode);
  const auto start = Clock::now();
  const Status s = LoadFrom(decode, prefill);
  const auto took = Clock::now() - start;
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("authentication failed"), std::string::npos) << s.ToString();
  EXPECT_LT(took, std::chrono::seconds(3)) << "refused, not left to a timeout";
  // Both sides saw it: each checks the other's proof.
  const auto until = Clock::now() + std::chrono::seconds(3);
  while ((prefill->Snapshot().auth_failures() == 0 || decode->Snapshot().auth_failures() == 0) &&
         Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(prefill->Snapshot().auth_failures(), 1u);
  EXPECT_GE(decode->Snapshot().auth_failures(), 1u);
  // Both still serve: the prefill kvd with a decode kvd that holds the secret, the decode kvd
  // with a prefill kvd that holds its own.
  auto good_decode = StartDaemon("decode-node-2", kSecret);
  auto good_prefill = StartDaemon("prefill-node-2", kOtherSecret);
  ASSERT_TRUE(good_decode && good_prefill);
  for (auto [p, d] : {std::pair{prefill, good_decode}, std::pair{good_prefill, decode}}) {
    auto again = RunPd(p, d);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->verified, Small().requests) << again->first_error;
  }
}

TEST(PeerAuth, AKvdWithoutASecretIsToldWhyItIsRefused) {
  auto prefill = StartDaemon("prefill-node", kSecret);
  auto decode = StartDaemon("decode-node", "");
  ASSERT_TRUE(prefill && decode);
  const Status s = LoadFrom(decode, prefill);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--auth-secret-file"), std::string::npos) << s.ToString();
}

// ---- without a secret: loopback only
// ----------------------------------------------------------------

// This host's first non-loopback IPv4 address, if it has one that is up.
std::optional<std::string> NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    found = text;
  }
  freeifaddrs(list);
  return found;
}

TEST(PeerAuth, WithoutASecretOnlyLoopbackPeersAreServed) {
  const auto ip = NonLoopbackAddress();
  if (!ip) GTEST_SKIP() << "no non-loopback IPv4 address on this host";
  for (bool insecure : {false, true}) {
    auto d = StartDaemon("open", "", nullptr, "0.0.0.0:0", insecure);
    ASSERT_TRUE(d);
    const std::string port = d->listen_address().substr(d->listen_address().rfind(':') + 1);
    int fd = ConnectTo(*ip + ":" + port, ip->c_str());
    ASSERT_GE(fd, 0);
    kv::FrameDecoder decoder;
    bool closed = false;
    auto m = ReadMessage(fd, decoder, std::chrono::milliseconds(2000), &closed);
    if (insecure) {
      ASSERT_TRUE(m.has_value());
      EXPECT_EQ(m->body_case(), proto::PeerMessage::kHello);
      EXPECT_EQ(d->Snapshot().peer_auth(), "insecure");
    } else {
      EXPECT_FALSE(m.has_value()) << "kvd sent " << m->ShortDebugString();
      EXPECT_TRUE(closed);
      auto status = d->Snapshot();
      EXPECT_EQ(status.peer_auth(), "loopback-only");
      EXPECT_GE(status.peers_refused(), 1u);
    }
    close(fd);
  }
}

}  // namespace
}  // namespace kv
