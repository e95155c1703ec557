// The side-channel handshake (transport/channel_auth.h) that guards nccl's unique-id exchange:
// over loopback TCP, an acceptor that sends a stand-in "unique id" only after the handshake (as
// the nccl backend does) hands it to a dialer with the right secret and to no other; a wrong or
// missing secret fails the dialer on the first answer (kIncompatible, not the deadline's
// kTimeout) with a reason; reflected proofs, another channel's label and a non-loopback peer
// without a secret are refused. After the handshake the channel is sealed (SealChannel): the id
// never crosses in the clear, and a frame flipped, replayed or reordered on the wire fails the
// reader; without secrets the channel stays plaintext.
#include "transport/channel_auth.h"

#include <sys/socket.h>

#include <future>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "base/codec.h"
#include "base/framed_socket.h"
#include "tests/support/socket_pair.h"

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
  if (result.done) {
    // As the nccl backend does: the channel is sealed before the id goes out.
    result.status = handshake.SealChannel(*socket, reader);
    if (result.status.ok()) (void)socket->SendFrame(kUniqueId, Later());
  }
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

// ---- sealed frames after the handshake ----------------------------------------------------------

// Runs both sides' handshakes in memory, frame by frame; true when both are done.
bool HandshakeInMemory(ChannelHandshake& dialer, ChannelHandshake& acceptor) {
  std::vector<std::string> to_acceptor = dialer.Begin().send;
  std::vector<std::string> to_dialer = acceptor.Begin().send;
  for (int round = 0; round < 8 && !(dialer.done() && acceptor.done()); ++round) {
    for (const std::string& f : to_acceptor) {
      auto step = acceptor.OnFrame(f);
      if (!step.status.ok()) return false;
      to_dialer.insert(to_dialer.end(), step.send.begin(), step.send.end());
    }
    to_acceptor.clear();
    for (const std::string& f : to_dialer) {
      auto step = dialer.OnFrame(f);
      if (!step.status.ok()) return false;
      to_acceptor.insert(to_acceptor.end(), step.send.begin(), step.send.end());
    }
    to_dialer.clear();
  }
  return dialer.done() && acceptor.done();
}

using testing_support::Drain;
using testing_support::SocketPair;

std::vector<std::string> FrameBodies(const std::string& wire) {
  FrameDecoder decoder;
  decoder.Append(wire.data(), wire.size());
  std::vector<std::string> bodies;
  while (true) {
    auto frame = decoder.Next();
    if (!frame.ok() || !frame->has_value()) return bodies;
    bodies.push_back(std::move(**frame));
  }
}

// Two sides that finished the handshake, sealed; the wire between them runs through the test:
// the dialer writes into `dialer_socket`, its bytes come out of `wire_from_dialer`; what the test
// writes into `wire_to_acceptor` reaches the acceptor's socket, read with `acceptor_reader`.
struct SealedChannel {
  explicit SealedChannel(const std::string& secret)
      : dialer({secret, false, "decode"}, std::string(kLabel), ChannelHandshake::Role::kDialer),
        acceptor({secret, false, "prefill"}, std::string(kLabel),
                 ChannelHandshake::Role::kAcceptor) {
    auto [d, w] = SocketPair();
    auto [r, a] = SocketPair();
    dialer_socket = std::move(d);
    wire_from_dialer = std::move(w);
    wire_to_acceptor = std::move(r);
    acceptor_socket = std::move(a);
    handshaken = HandshakeInMemory(dialer, acceptor);
    if (!handshaken) return;
    dialer_sealed = dialer.SealChannel(dialer_socket, dialer_reader);
    acceptor_sealed = acceptor.SealChannel(acceptor_socket, acceptor_reader);
  }
  ChannelHandshake dialer, acceptor;
  Socket dialer_socket, wire_from_dialer, wire_to_acceptor, acceptor_socket;
  FrameReader dialer_reader, acceptor_reader;
  bool handshaken = false;
  Status dialer_sealed, acceptor_sealed;
};

TEST(SealedChannel, TheIdCrossesEncryptedAndOpensInOrderBothWays) {
  SealedChannel c(kSecret);
  ASSERT_TRUE(c.handshaken);
  ASSERT_TRUE(c.dialer_sealed.ok()) << c.dialer_sealed.ToString();
  ASSERT_TRUE(c.acceptor_sealed.ok()) << c.acceptor_sealed.ToString();
  for (const std::string_view f : {kUniqueId, std::string_view("second"), std::string_view("")}) {
    ASSERT_TRUE(c.dialer_socket.SendFrame(f, Later()).ok());
  }
  const std::string wire = Drain(c.wire_from_dialer.fd());
  ASSERT_FALSE(wire.empty());
  EXPECT_EQ(wire.find(kUniqueId), std::string::npos) << "the id crossed in the clear";
  EXPECT_EQ(wire.find("second"), std::string::npos);
  ASSERT_EQ(::send(c.wire_to_acceptor.fd(), wire.data(), wire.size(), 0),
            static_cast<ssize_t>(wire.size()));
  for (const std::string_view expected :
       {kUniqueId, std::string_view("second"), std::string_view("")}) {
    auto frame = ReceiveFrame(c.acceptor_socket.fd(), c.acceptor_reader, Later());
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    EXPECT_EQ(*frame, expected);
  }
  // The other way, under the other key: the acceptor's answer opens at the dialer.
  ASSERT_TRUE(c.acceptor_socket.SendFrame("ack", Later()).ok());
  const std::string back = Drain(c.wire_to_acceptor.fd());
  EXPECT_EQ(back.find("ack"), std::string::npos);
  ASSERT_EQ(::send(c.wire_from_dialer.fd(), back.data(), back.size(), 0),
            static_cast<ssize_t>(back.size()));
  auto ack = ReceiveFrame(c.dialer_socket.fd(), c.dialer_reader, Later());
  ASSERT_TRUE(ack.ok()) << ack.status().ToString();
  EXPECT_EQ(*ack, "ack");
}

// A side's own frame reflected back to it was sealed under its sending key: it does not open.
TEST(SealedChannel, AFrameReflectedToItsSenderDoesNotOpen) {
  SealedChannel c(kSecret);
  ASSERT_TRUE(c.handshaken && c.dialer_sealed.ok() && c.acceptor_sealed.ok());
  ASSERT_TRUE(c.acceptor_socket.SendFrame("mine", Later()).ok());
  const std::string own = Drain(c.wire_to_acceptor.fd());
  ASSERT_FALSE(own.empty());
  ASSERT_EQ(::send(c.wire_to_acceptor.fd(), own.data(), own.size(), 0),
            static_cast<ssize_t>(own.size()));
  ASSERT_TRUE(WaitReadable(c.acceptor_socket.fd(), Later()));
  EXPECT_EQ(c.acceptor_reader.ReadAvailable(c.acceptor_socket.fd()).code(), Code::kInvalidArgument);
  EXPECT_FALSE(c.acceptor_reader.Next().has_value());
}

TEST(SealedChannel, AFlippedReplayedOrReorderedFrameFailsTheReader) {
  enum class Tamper { kFlip, kReplay, kReorder };
  for (const Tamper tamper : {Tamper::kFlip, Tamper::kReplay, Tamper::kReorder}) {
    SealedChannel c(kSecret);
    ASSERT_TRUE(c.handshaken && c.dialer_sealed.ok() && c.acceptor_sealed.ok());
    for (const char* f : {"batch 0", "batch 1", "batch 2"}) {
      ASSERT_TRUE(c.dialer_socket.SendFrame(f, Later()).ok());
    }
    std::vector<std::string> bodies = FrameBodies(Drain(c.wire_from_dialer.fd()));
    ASSERT_EQ(bodies.size(), 3u);
    switch (tamper) {
      case Tamper::kFlip:
        bodies[1][2] ^= 0x40;
        break;
      case Tamper::kReplay:
        bodies[1] = bodies[0];
        break;
      case Tamper::kReorder:
        std::swap(bodies[1], bodies[2]);
        break;
    }
    std::string forwarded;
    for (const std::string& b : bodies) ASSERT_TRUE(AppendFrame(b, &forwarded).ok());
    ASSERT_EQ(::send(c.wire_to_acceptor.fd(), forwarded.data(), forwarded.size(), 0),
              static_cast<ssize_t>(forwarded.size()));
    ASSERT_TRUE(WaitReadable(c.acceptor_socket.fd(), Later()));
    const Status read = c.acceptor_reader.ReadAvailable(c.acceptor_socket.fd());
    EXPECT_EQ(read.code(), Code::kInvalidArgument) << read.ToString();
    EXPECT_NE(read.message().find("sealed frame 1 did not open"), std::string::npos)
        << read.ToString();
    // The frame before the tampered one came out; nothing after it.
    auto first = c.acceptor_reader.Next();
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(*first, "batch 0");
    EXPECT_FALSE(c.acceptor_reader.Next().has_value());
    EXPECT_FALSE(c.acceptor_reader.ReadAvailable(c.acceptor_socket.fd()).ok());
  }
}

TEST(SealedChannel, WithoutSecretsTheChannelStaysPlaintext) {
  SealedChannel c("");
  ASSERT_TRUE(c.handshaken);
  ASSERT_TRUE(c.dialer_sealed.ok() && c.acceptor_sealed.ok());
  ASSERT_TRUE(c.dialer_socket.SendFrame(kUniqueId, Later()).ok());
  const std::string wire = Drain(c.wire_from_dialer.fd());
  EXPECT_NE(wire.find(kUniqueId), std::string::npos);
  ASSERT_EQ(FrameBodies(wire), std::vector<std::string>{std::string(kUniqueId)});
}

TEST(SealedChannel, SealingBeforeTheHandshakeIsDoneIsRefused) {
  ChannelHandshake early({kSecret, false, "decode"}, std::string(kLabel),
                         ChannelHandshake::Role::kDialer);
  ASSERT_TRUE(early.Begin().status.ok());
  auto [a, b] = SocketPair();
  FrameReader reader;
  EXPECT_EQ(early.SealChannel(a, reader).code(), Code::kInternal);
}

}  // namespace
}  // namespace kv::transport
