// The side-channel handshake (transport/channel_auth.h) that guards nccl's unique-id exchange:
// over loopback TCP, an acceptor that sends a stand-in "unique id" only after the handshake (as
// the nccl backend does) hands it to a dialer with the right secret and to no other; a wrong or
// missing secret fails the dialer on the first answer (kIncompatible, not the deadline's
// kTimeout) with a reason; reflected proofs, another channel's label and a non-loopback peer
// without a secret are refused.
#include "transport/channel_auth.h"

#include <sys/socket.h>

#include <future>
#include <string>

#include <gtest/gtest.h>

#include "base/codec.h"
#include "base/framed_socket.h"

namespace kv::transport {
namespace {

using namespace std::chrono_literals;

constexpr std::string_view kLabel = "kvd-test-channel/1";
constexpr std::string_view kUniqueId = "the unique id";

const std::string kSecret(32, 's');
const std::string kOtherSecret(32, 'o');

SteadyTime Later() {
  return std::chrono::steady_clock::now() + 30s;
}

struct AcceptorResult {
  Status status;
  bool done = false;
  std::string peer_name;
};

// Accepts one connection on `listener`, runs the acceptor's handshake and, once it is done,
// sends kUniqueId; closes the connection when the handshake fails.
AcceptorResult Accept(Listener& listener, const PeerAuth& auth) {
  AcceptorResult result;
  Result<Socket> socket = Status::Unavailable("nothing accepted");
  while (true) {
    if (!WaitReadable(listener.fd(), Later())) return {Status::Timeout("no dialer"), false, ""};
    socket = listener.Accept();
    if (!socket.ok() || socket->valid()) break;
  }
  if (!socket.ok()) return {socket.status(), false, ""};
  if (Status admit = AdmitPeer(auth, socket->fd()); !admit.ok()) return {admit, false, ""};
  ChannelHandshake handshake(auth, std::string(kLabel), ChannelHandshake::Role::kAcceptor);
  ChannelHandshake::Step step = handshake.Begin();
  FrameReader reader;
  while (step.status.ok() && !handshake.done()) {
    auto frame = ReceiveFrame(socket->fd(), reader, Later());
    if (!frame.ok()) return {frame.status(), false, ""};
    step = handshake.OnFrame(*frame);
    for (const std::string& out : step.send) (void)socket->SendFrame(out, Later());
  }
  result.status = step.status;
  result.done = handshake.done();
  result.peer_name = handshake.peer_name();
  if (result.done) (void)socket->SendFrame(kUniqueId, Later());
  return result;
}

struct Outcome {
  Result<std::string> dialed = Status::Internal("not run");
  AcceptorResult accepted;
  std::string after;  // what the dialer could read after its handshake: the id, or nothing
};

Outcome Handshake(const PeerAuth& dialer, const PeerAuth& acceptor) {
  auto listener = Listener::Listen("tcp:127.0.0.1:0");
  EXPECT_TRUE(listener.ok()) << listener.status().ToString();
  auto accepted = std::async(std::launch::async, [&] { return Accept(*listener, acceptor); });
  Outcome run;
  auto socket = Socket::Connect(listener->endpoint(), Later());
  EXPECT_TRUE(socket.ok()) << socket.status().ToString();
  FrameReader reader;
  run.dialed = DialHandshake(*socket, reader, dialer, kLabel, Later());
  run.accepted = accepted.get();
  // Whatever else the acceptor sent before closing (it closes once Accept returns).
  while (true) {
    auto frame = ReceiveFrame(socket->fd(), reader, Later());
    if (!frame.ok()) break;
    run.after += *frame;
    if (*frame == kUniqueId) break;
  }
  return run;
}

TEST(ChannelAuth, TheRightSecretGetsTheIdAndBothNamesAreBound) {
  Outcome run = Handshake({kSecret, false, "decode"}, {kSecret, false, "prefill"});
  ASSERT_TRUE(run.dialed.ok()) << run.dialed.status().ToString();
  EXPECT_EQ(*run.dialed, "prefill");
  ASSERT_TRUE(run.accepted.status.ok()) << run.accepted.status.ToString();
  EXPECT_TRUE(run.accepted.done);
  EXPECT_EQ(run.accepted.peer_name, "decode");
  EXPECT_EQ(run.after, kUniqueId);
}

TEST(ChannelAuth, AWrongSecretFailsOnTheFirstAnswerAndGetsNoId) {
  Outcome run = Handshake({kOtherSecret, false, "intruder"}, {kSecret, false, "prefill"});
  ASSERT_FALSE(run.dialed.ok());
  // Failed on the acceptor's proof, not at the 30 s deadline.
  EXPECT_EQ(run.dialed.status().code(), Code::kIncompatible) << run.dialed.status().ToString();
  EXPECT_NE(run.dialed.status().message().find("does not hold"), std::string::npos)
      << run.dialed.status().ToString();
  EXPECT_FALSE(run.accepted.done);
  EXPECT_EQ(run.accepted.status.code(), Code::kIncompatible) << run.accepted.status.ToString();
  EXPECT_NE(run.accepted.status.message().find("refused by the peer"), std::string::npos)
      << run.accepted.status.ToString();
  EXPECT_EQ(run.after.find(kUniqueId), std::string::npos);
}

TEST(ChannelAuth, ADialerWithoutASecretIsRefusedAndGetsNoId) {
  Outcome run = Handshake({"", false, "intruder"}, {kSecret, false, "prefill"});
  ASSERT_FALSE(run.dialed.ok());
  EXPECT_EQ(run.dialed.status().code(), Code::kIncompatible) << run.dialed.status().ToString();
  EXPECT_NE(run.dialed.status().message().find("refused by the peer"), std::string::npos)
      << run.dialed.status().ToString();
  EXPECT_FALSE(run.accepted.done);
  EXPECT_NE(run.accepted.status.message().find("has no peer secret"), std::string::npos)
      << run.accepted.status.ToString();
  EXPECT_EQ(run.after.find(kUniqueId), std::string::npos);
}

// The acceptor without a secret sees the dialer's challenge ask for one and refuses first.
TEST(ChannelAuth, ADialerWithASecretAndAnAcceptorWithoutRefuseEachOther) {
  Outcome run = Handshake({kSecret, false, "decode"}, {"", false, "impostor"});
  ASSERT_FALSE(run.dialed.ok());
  EXPECT_EQ(run.dialed.status().code(), Code::kIncompatible) << run.dialed.status().ToString();
  EXPECT_NE(run.dialed.status().message().find("'impostor' has none"), std::string::npos)
      << run.dialed.status().ToString();
  EXPECT_FALSE(run.accepted.done);
  EXPECT_EQ(run.after.find(kUniqueId), std::string::npos);
}

TEST(ChannelAuth, WithoutSecretsLoopbackPeersAreAccepted) {
  Outcome run = Handshake({"", false, "decode"}, {"", false, "prefill"});
  ASSERT_TRUE(run.dialed.ok()) << run.dialed.status().ToString();
  EXPECT_TRUE(run.accepted.done);
  EXPECT_EQ(run.after, kUniqueId);
}

TEST(ChannelAuth, AnotherChannelsLabelIsRefused) {
  auto listener = Listener::Listen("tcp:127.0.0.1:0");
  ASSERT_TRUE(listener.ok());
  const PeerAuth auth{kSecret, false, "prefill"};
  auto accepted = std::async(std::launch::async, [&] { return Accept(*listener, auth); });
  auto socket = Socket::Connect(listener->endpoint(), Later());
  ASSERT_TRUE(socket.ok());
  FrameReader reader;
  auto dialed = DialHandshake(*socket, reader, {kSecret, false, "decode"}, "kvd-other/1", Later());
  EXPECT_EQ(dialed.status().code(), Code::kIncompatible) << dialed.status().ToString();
  AcceptorResult result = accepted.get();
  EXPECT_FALSE(result.done);
  EXPECT_EQ(result.status.code(), Code::kIncompatible) << result.status.ToString();
}

// A dialer that answers the acceptor's challenge with the acceptor's own proof (a reflection)
// is refused: the proofs name the prover's role.
TEST(ChannelAuth, AReflectedProofIsRefused) {
  ChannelHandshake acceptor({kSecret, false, "prefill"}, std::string(kLabel),
                            ChannelHandshake::Role::kAcceptor);
  ASSERT_TRUE(acceptor.Begin().status.ok());
  const std::string nonce(kChannelNonceBytes, 'n');
  const std::string challenge =
      ByteWriter().u32(0x6b764331).bytes(kLabel).u32(1).bytes("prefill2").bytes(nonce).take();
  ChannelHandshake::Step answer = acceptor.OnFrame(challenge);
  ASSERT_TRUE(answer.status.ok()) << answer.status.ToString();
  ASSERT_EQ(answer.send.size(), 2u);  // its challenge and its proof
  ChannelHandshake::Step reflected = acceptor.OnFrame(answer.send[1]);
  EXPECT_EQ(reflected.status.code(), Code::kIncompatible) << reflected.status.ToString();
  EXPECT_FALSE(acceptor.done());
  ASSERT_EQ(reflected.send.size(), 1u);  // the refusal, nothing else
  // And the handshake stays failed: a later frame does not revive it.
  EXPECT_FALSE(acceptor.OnFrame(answer.send[1]).status.ok());
  EXPECT_FALSE(acceptor.done());
}

// Without a secret only loopback peers are admitted; a unix socket pair stands in for a peer
// whose address is not loopback.
TEST(ChannelAuth, WithoutASecretANonLoopbackPeerIsNotAdmitted) {
  int fds[2];
  ASSERT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds));
  Socket a(fds[0]), b(fds[1]);
  EXPECT_FALSE(PeerIsLoopback(a.fd()));
  EXPECT_EQ(AdmitPeer({"", false, "x"}, a.fd()).code(), Code::kUnavailable);
  EXPECT_TRUE(AdmitPeer({"", true, "x"}, a.fd()).ok());  // --insecure
  EXPECT_TRUE(AdmitPeer({kSecret, false, "x"}, a.fd()).ok());
  FrameReader reader;
  auto dialed = DialHandshake(a, reader, {"", false, "x"}, kLabel, Later());
  EXPECT_EQ(dialed.status().code(), Code::kUnavailable) << dialed.status().ToString();
}

}  // namespace
}  // namespace kv::transport
