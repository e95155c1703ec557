// The handshake that opens a transport backend's own TCP side channel, before anything else
// crosses it: nccl's carries the ncclUniqueIds with which a process joins a communicator and
// then writes into the registered memory the channel names (issue 19). It admits peers as kvd's
// peer port does (daemon/peer_auth.h), from TransportOptions::auth (transport.h):
//
//  * With a secret: a mutual challenge-response. The dialer sends a challenge (the channel's
//    label, its name, a fresh 32-byte nonce); the acceptor answers with its own challenge and
//    its proof; the dialer checks it and sends its proof; the acceptor checks that and sends
//    "accepted". A proof is HMAC-SHA256 under the secret over a domain string, the label, the
//    prover's role (dialer or acceptor), both names and both nonces, each length-prefixed
//    (base/hmac.h), compared in constant time. The roles stop a proof from being reflected, the
//    nonces from being replayed, the label from being used on another kind of channel. Either
//    side that finds a wrong proof, or a peer without a secret, sends a refusal naming the
//    reason and fails at once: a wrong secret fails the dialer's connect in one round trip.
//  * Without a secret: the challenges carry no nonce and no proof follows; the caller accepts
//    and dials loopback peers only (PeerIsLoopback) unless `insecure`. A side with a secret
//    refuses a side without one, both ways.
//
// After the handshake, with a secret, every frame both ways is sealed (SealChannel: base/
// frame_seal.h, AES-256-GCM under a key per direction derived from the secret, the label, both
// names and both nonces; each direction's frames numbered from 0): encrypted (the unique ids no
// longer cross in the clear) and authenticated, so a man in the middle who relays a handshake
// between two honest sides can neither read, inject, alter, replay nor reorder a frame; a frame
// that does not open fails the reader (FrameReader::ReadAvailable) and the channel is closed.
// Only the handshake's frames (labels, names, nonces, proofs) are plaintext. Without a secret
// nothing is sealed (loopback only, or --insecure). What the channel's frames set up (NCCL's own
// transports, which carry the KV bytes) is not encrypted by this.
//
// ChannelHandshake is a state machine over frames (no I/O), so a poll loop can drive many at
// once; DialHandshake drives the dialer's side over a blocking-with-deadline socket. Neither is
// thread-safe; one per connection.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "base/framed_socket.h"
#include "base/status.h"
#include "transport/transport.h"

namespace kv::transport {

inline constexpr size_t kChannelNonceBytes = 32;
inline constexpr size_t kMaxChannelName = 256;

class ChannelHandshake {
 public:
  enum class Role { kDialer, kAcceptor };

  // `label` names the channel and its protocol version ("kvd-nccl/7").
  ChannelHandshake(PeerAuth auth, std::string label, Role role);

  struct Step {
    std::vector<std::string> send;  // frames to send now, in order (a refusal included)
    Status status;  // not OK: the handshake failed; send `send` (best effort), then close
  };

  // What this side opens with: the dialer's challenge; nothing for the acceptor. Call once.
  Step Begin();
  // Handles one frame from the peer. After a failed step the handshake stays failed.
  Step OnFrame(std::string_view frame);

  // The peer proved the secret (or, without one, both said so): the channel may be used.
  bool done() const { return state_ == State::kDone; }
  // The name the peer gave in its challenge (bound to its proof with a secret); empty before.
  const std::string& peer_name() const { return peer_name_; }

  // Once done(), with a secret: seals the channel both ways (Socket::EnableSealing with this
  // side's sending key, FrameReader::EnableOpening with the peer's). Call once, right after
  // done(): after this side sent every frame the handshake gave it, and before it sends or takes
  // any other frame. Without a secret: nothing (the channel stays plaintext). kInternal before
  // done(); an error from the reader when a frame it already holds does not open.
  Status SealChannel(Socket& socket, FrameReader& reader) const;

 private:
  enum class State { kStart, kWaitChallenge, kWaitProof, kWaitAccepted, kDone, kFailed };
  Step Fail(Status why, bool tell_peer);
  std::string Prove(bool prover_dialed, std::string_view prover_name,
                    std::string_view verifier_name, std::string_view prover_nonce,
                    std::string_view verifier_nonce) const;
  std::string EncodeChallenge() const;
  Step OnChallenge(std::string_view frame);

  PeerAuth auth_;
  std::string label_;
  Role role_;
  State state_ = State::kStart;
  std::string nonce_;
  std::string peer_nonce_;
  std::string peer_name_;
};

// Whether the connected socket `fd`'s peer has a loopback address (127.0.0.0/8, ::1, or an
// IPv4-mapped loopback). False when it cannot tell.
bool PeerIsLoopback(int fd);

// Whether `auth` admits a peer on `fd`: with a secret or `insecure` any, else loopback only
// (kUnavailable naming the rule).
Status AdmitPeer(const PeerAuth& auth, int fd);

// The dialer's whole handshake on a connected socket: AdmitPeer, then frames until done, a
// refusal or `deadline`, then SealChannel. Returns the peer's name. A wrong or missing secret is
// kIncompatible with the reason, on the first answer that shows it. Frames the peer sent after
// the handshake stay in `reader` for the caller (opened, once sealed).
Result<std::string> DialHandshake(Socket& socket, FrameReader& reader, const PeerAuth& auth,
                                  std::string_view label, SteadyTime deadline);

}  // namespace kv::transport
