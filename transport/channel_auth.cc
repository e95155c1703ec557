#include "transport/channel_auth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <utility>

#include "base/codec.h"
#include "base/hmac.h"

namespace kv::transport {
namespace {

// Frame types of the handshake; a side channel's own messages come only after it.
enum : uint32_t {
  kChallenge = 0x6b764331,  // label, has_secret, name, nonce
  kProof = 0x6b764332,      // mac
  kAccepted = 0x6b764333,   // nothing
  kRefused = 0x6b764334,    // reason
};
constexpr size_t kMaxReason = 512;

std::string Printable(std::string_view s) {
  std::string out(s.substr(0, 64));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

}  // namespace

ChannelHandshake::ChannelHandshake(PeerAuth auth, std::string label, Role role)
    : auth_(std::move(auth)), label_(std::move(label)), role_(role) {}

std::string ChannelHandshake::Prove(bool prover_dialed, std::string_view prover_name,
                                    std::string_view verifier_name, std::string_view prover_nonce,
                                    std::string_view verifier_nonce) const {
  std::string message;
  crypto::AppendField(&message, "kvd side channel auth v1");
  crypto::AppendField(&message, label_);
  crypto::AppendField(&message, prover_dialed ? "dialer" : "acceptor");
  crypto::AppendField(&message, prover_name);
  crypto::AppendField(&message, verifier_name);
  crypto::AppendField(&message, prover_nonce);
  crypto::AppendField(&message, verifier_nonce);
  return crypto::HmacSha256(auth_.secret, message);
}

std::string ChannelHandshake::EncodeChallenge() const {
  return ByteWriter()
      .u32(kChallenge)
      .bytes(label_)
      .u32(auth_.secret.empty() ? 0 : 1)
      .bytes(auth_.name)
      .bytes(nonce_)
      .take();
}

ChannelHandshake::Step ChannelHandshake::Fail(Status why, bool tell_peer) {
  state_ = State::kFailed;
  Step step;
  if (tell_peer) {
    step.send.push_back(
        ByteWriter().u32(kRefused).bytes(why.message().substr(0, kMaxReason)).take());
  }
  step.status = std::move(why);
  return step;
}

ChannelHandshake::Step ChannelHandshake::Begin() {
  if (state_ != State::kStart) return Fail(Status::Internal("handshake begun twice"), false);
  if (auth_.name.size() > kMaxChannelName) {
    return Fail(Status::InvalidArgument("side channel node name longer than 256 bytes"), false);
  }
  if (!auth_.secret.empty()) {
    auto nonce = crypto::RandomBytes(kChannelNonceBytes);
    if (!nonce.ok()) return Fail(nonce.status(), false);
    nonce_ = std::move(nonce).value();
  }
  state_ = State::kWaitChallenge;
  Step step;
  if (role_ == Role::kDialer) step.send.push_back(EncodeChallenge());
  return step;
}

ChannelHandshake::Step ChannelHandshake::OnChallenge(std::string_view frame) {
  ByteReader r(frame);
  uint32_t type = 0, has_secret = 0;
  std::string_view label, name, nonce;
  if (!r.u32(&type) || !r.bytes(&label) || !r.u32(&has_secret) || !r.bytes(&name) ||
      !r.bytes(&nonce) || !r.at_end() || has_secret > 1 || name.size() > kMaxChannelName) {
    return Fail(Status::InvalidArgument("malformed side channel challenge"), true);
  }
  if (label != label_) {
    return Fail(Status::Incompatible("side channel speaks '" + Printable(label) + "', expected '" +
                                     label_ + "'"),
                true);
  }
  peer_name_ = std::string(name);
  const std::string who = "peer '" + Printable(name) + "'";
  if (auth_.secret.empty() && has_secret == 1) {
    return Fail(Status::Incompatible(who + " authenticates with a secret but '" + auth_.name +
                                     "' has none (--auth-secret-file on one side only)"),
                true);
  }
  if (!auth_.secret.empty() && has_secret == 0) {
    return Fail(Status::Incompatible("authentication failed: " + who +
                                     " has no peer secret (--auth-secret-file on one side only)"),
                true);
  }
  if (!auth_.secret.empty() && nonce.size() != kChannelNonceBytes) {
    return Fail(Status::InvalidArgument("side channel challenge nonce of " +
                                        std::to_string(nonce.size()) + " bytes"),
                true);
  }
  if (auth_.secret.empty() && !nonce.empty()) {
    return Fail(Status::InvalidArgument("side channel challenge without a secret has a nonce"),
                true);
  }
  if (!auth_.secret.empty() && crypto::ConstantTimeEqual(nonce, nonce_)) {
    return Fail(Status::InvalidArgument(who + " echoed this side's nonce"), true);  // reflection
  }
  peer_nonce_ = std::string(nonce);
  Step step;
  const bool dialer = role_ == Role::kDialer;
  if (!dialer) step.send.push_back(EncodeChallenge());
  if (auth_.secret.empty()) {
    // Nothing to prove: the acceptor accepts (its caller admitted the peer's address).
    if (dialer) {
      state_ = State::kWaitAccepted;
    } else {
      step.send.push_back(ByteWriter().u32(kAccepted).take());
      state_ = State::kDone;
    }
    return step;
  }
  if (!dialer) {
    // The acceptor proves first; the dialer proves only after the acceptor's proof checked out.
    step.send.push_back(ByteWriter()
                            .u32(kProof)
                            .bytes(Prove(false, auth_.name, peer_name_, nonce_, peer_nonce_))
                            .take());
  }
  state_ = State::kWaitProof;
  return step;
}

ChannelHandshake::Step ChannelHandshake::OnFrame(std::string_view frame) {
  if (state_ == State::kFailed || state_ == State::kDone || state_ == State::kStart) {
    return Fail(Status::InvalidArgument("side channel frame outside the handshake"), false);
  }
  ByteReader r(frame);
  uint32_t type = 0;
  if (!r.u32(&type)) return Fail(Status::InvalidArgument("empty side channel frame"), true);
  if (type == kRefused) {
    std::string_view reason;
    if (!r.bytes(&reason)) reason = "(no reason)";
    return Fail(
        Status::Incompatible("refused by the peer: " + std::string(reason.substr(0, kMaxReason))),
        false);
  }
  switch (state_) {
    case State::kWaitChallenge:
      if (type != kChallenge) break;
      return OnChallenge(frame);
    case State::kWaitProof: {
      if (type != kProof) break;
      std::string_view mac;
      if (!r.bytes(&mac) || !r.at_end()) {
        return Fail(Status::InvalidArgument("malformed side channel proof"), true);
      }
      const bool dialer = role_ == Role::kDialer;
      // The peer proves in its own role: the dialer checks an acceptor's proof and vice versa.
      const std::string expected = Prove(!dialer, peer_name_, auth_.name, peer_nonce_, nonce_);
      if (!crypto::ConstantTimeEqual(mac, expected)) {
        return Fail(Status::Incompatible("authentication failed: peer '" + Printable(peer_name_) +
                                         "' does not hold this side's secret (--auth-secret-file "
                                         "differs)"),
                    true);
      }
      Step step;
      if (dialer) {
        step.send.push_back(ByteWriter()
                                .u32(kProof)
                                .bytes(Prove(true, auth_.name, peer_name_, nonce_, peer_nonce_))
                                .take());
        state_ = State::kWaitAccepted;
      } else {
        step.send.push_back(ByteWriter().u32(kAccepted).take());
        state_ = State::kDone;
      }
      return step;
    }
    case State::kWaitAccepted:
      if (type != kAccepted || !r.at_end()) break;
      state_ = State::kDone;
      return Step{};
    default:
      break;
  }
  return Fail(Status::InvalidArgument("unexpected side channel frame during the handshake"), true);
}

Status ChannelHandshake::SealChannel(Socket& socket, FrameReader& reader) const {
  if (state_ != State::kDone) return Status::Internal("side channel sealed before its handshake");
  if (auth_.secret.empty()) return Status::Ok();
  const bool dialer = role_ == Role::kDialer;
  const std::string_view dialer_name = dialer ? auth_.name : peer_name_;
  const std::string_view acceptor_name = dialer ? peer_name_ : auth_.name;
  const std::string_view dialer_nonce = dialer ? nonce_ : peer_nonce_;
  const std::string_view acceptor_nonce = dialer ? peer_nonce_ : nonce_;
  auto key = [&](std::string_view direction) {
    std::string message;
    crypto::AppendField(&message, "kvd side channel seal v1");
    crypto::AppendField(&message, label_);
    crypto::AppendField(&message, direction);
    crypto::AppendField(&message, dialer_name);
    crypto::AppendField(&message, acceptor_name);
    crypto::AppendField(&message, dialer_nonce);
    crypto::AppendField(&message, acceptor_nonce);
    return crypto::HmacSha256(auth_.secret, message);  // empty on failure: refused by the AEAD
  };
  const std::string from_dialer = key("dialer to acceptor");
  const std::string from_acceptor = key("acceptor to dialer");
  KV_RETURN_IF_ERROR(socket.EnableSealing(dialer ? from_dialer : from_acceptor));
  return reader.EnableOpening(dialer ? from_acceptor : from_dialer);
}

bool PeerIsLoopback(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return false;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

Status AdmitPeer(const PeerAuth& auth, int fd) {
  if (!auth.secret.empty() || auth.insecure || PeerIsLoopback(fd)) return Status::Ok();
  return Status::Unavailable(
      "side channel: without a peer secret (--auth-secret-file) only loopback peers are "
      "accepted and dialed (--insecure opens it)");
}

Result<std::string> DialHandshake(Socket& socket, FrameReader& reader, const PeerAuth& auth,
                                  std::string_view label, SteadyTime deadline) {
  KV_RETURN_IF_ERROR(AdmitPeer(auth, socket.fd()));
  ChannelHandshake handshake(auth, std::string(label), ChannelHandshake::Role::kDialer);
  ChannelHandshake::Step step = handshake.Begin();
  while (true) {
    for (const std::string& frame : step.send) {
      Status sent = socket.SendFrame(frame, deadline);
      if (!sent.ok() && step.status.ok()) return sent;
    }
    KV_RETURN_IF_ERROR(step.status);
    if (handshake.done()) {
      KV_RETURN_IF_ERROR(handshake.SealChannel(socket, reader)
                             .WithContext("side channel to " + handshake.peer_name()));
      return handshake.peer_name();
    }
    auto frame = ReceiveFrame(socket.fd(), reader, deadline);
    if (!frame.ok()) {
      return frame.status().WithContext("side channel handshake with " + std::string(label) +
                                        " peer");
    }
    step = handshake.OnFrame(*frame);
  }
}

}  // namespace kv::transport
