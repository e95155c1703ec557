// The peer protocol: one TCP Connection per peer kvd. Both sides send PeerHello at once; after
// both hellos (version, transport, layouts checked; the transport connected) the peer is ready
// and queued messages flow. Heartbeats keep it alive; see Core::Sweep.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <utility>

#include "daemon/core.h"
#include "daemon/peer_auth.h"
#include "protocol/wire_layout.h"

namespace kv::daemon {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

// Peers must speak one protocol: the older kvd is told to upgrade rather than misparse frames
// (3 seals the frames after the proofs, 2 MAC'd them).
std::string PeerVersionMismatch(uint32_t theirs) {
  return "peer speaks protocol " + std::to_string(theirs) + ", this kvd " +
         std::to_string(proto::PEER_PROTOCOL) +
         " (kvds must run the same peer protocol: upgrade the older one; 3 encrypts the peer "
         "port)";
}

}  // namespace

proto::PeerHello Daemon::Core::BuildHello() const {
  proto::PeerHello hello;
  hello.set_protocol_version(proto::PEER_PROTOCOL);
  hello.set_node_name(options_.name);
  hello.set_transport(std::string(transport_->name()));
  hello.set_transport_address(transport_->address());
  for (const auto& [id, engine] : registry_.engines()) {
    if (!engine.hello) continue;
    proto::RankInfo* rank = hello.add_ranks();
    rank->set_tp_rank(engine.tp_rank);
    for (const auto& region : engine.regions) ToWire(region->layout.spec(), rank->add_regions());
    // The largest: every rank announced must lie below it (CheckPeerLayouts). Instances of other
    // TP sizes share a kvd: vLLM's scheduler-side connector is rank 0 of 1 beside TP 2 workers,
    // and where it connected last the hello said "rank 1 of 1" and the peer refused it.
    hello.set_tp_size(std::max(hello.tp_size(), engine.tp_size));
  }
  return hello;
}

void Daemon::Core::ServePeer(int fd, std::string dialed_address, std::string remote_ip) {
  Peer* dialing = dialed_address.empty() ? nullptr : peers_.Dialed(dialed_address);
  Peer& peer = dialing != nullptr && !dialing->conn ? *dialing : peers_.Add(next_id_++);
  const uint64_t id = peer.id;
  peer.connecting.reset();
  peer.dialed = !dialed_address.empty();
  peer.dialed_address = std::move(dialed_address);
  peer.last_heard = Clock::now();
  std::string label =
      "peer " + (peer.dialed_address.empty() ? "#" + std::to_string(id) : peer.dialed_address);
  peer.remote_ip = std::move(remote_ip);
  peer.conn = Connection::Adopt(io_, fd, PeerLimits(), std::move(label));
  peer.conn->Start(
      [this, id](std::string body) {
        OnPeerMessage(id, body);
        send_queue_->FlushIfDue();
      },
      [this, id](const Status& why) { OnPeerClosed(id, why); });
  if (options_.auth_secret.empty()) {
    // Loopback only (AcceptPeers, PeerFor) or --insecure: the hello goes out at once.
    peer.authenticated = true;
    SendHello(peer);
    return;
  }
  // Nothing about this kvd but its name and a nonce before the peer proved the secret.
  auto nonce = auth::RandomBytes(auth::kNonceBytes);
  if (!nonce.ok()) {
    peer.conn->Close(nonce.status());
    return;
  }
  peer.our_nonce = *nonce;
  proto::PeerMessage challenge;
  challenge.mutable_challenge()->set_protocol_version(proto::PEER_PROTOCOL);
  challenge.mutable_challenge()->set_node_name(options_.name);
  challenge.mutable_challenge()->set_nonce(peer.our_nonce);
  (void)peer.conn->Send(challenge);
}

void Daemon::Core::SendHello(Peer& peer) {
  proto::PeerMessage hello;
  *hello.mutable_hello() = BuildHello();
  // The peer gets a transport end of its own where the backend has one, so that its failure
  // cannot wedge what other peers send us (transport.h, open_endpoint).
  Result<transport::Transport::LocalEndpoint> endpoint = transport_->open_endpoint();
  if (endpoint.ok()) {
    peer.transport_endpoint = endpoint->id;
    hello.mutable_hello()->set_transport_address(std::move(endpoint->address));
  } else {
    spdlog::warn("kvd {}: {}: no transport endpoint of its own ({}); sharing one", options_.name,
                 peer.conn->label(), endpoint.status().ToString());
  }
  (void)peer.conn->Send(hello);
}

void Daemon::Core::RefusePeer(Peer& peer, const Status& why) {
  proto::PeerMessage refused;
  refused.mutable_refused()->set_reason(why.message().substr(0, 512));
  // Written at once where the socket takes it (Connection::Send tries before it queues).
  (void)peer.conn->Send(refused);
  peer.conn->Close(why.WithContext(peer.conn->label()));
}

Status Daemon::Core::OnAuthMessage(Peer& peer, const proto::PeerMessage& m) {
  switch (m.body_case()) {
    case proto::PeerMessage::kChallenge: {
      const proto::PeerChallenge& c = m.challenge();
      if (!peer.their_nonce.empty()) return Status::InvalidArgument("challenge sent twice");
      if (c.protocol_version() != proto::PEER_PROTOCOL) {
        return Status::Incompatible(PeerVersionMismatch(c.protocol_version()));
      }
      if (c.node_name().empty() || c.node_name().size() > kMaxRequestIdBytes) {
        return Status::InvalidArgument("peer node name must have 1 to 256 bytes");
      }
      // Two kvds of one name could not tell their proofs apart (and names address requests).
      if (c.node_name() == options_.name) {
        return Status::InvalidArgument("peer claims this kvd's own name '" + options_.name + "'");
      }
      if (c.nonce().size() != auth::kNonceBytes) {
        return Status::InvalidArgument("challenge nonce of " + std::to_string(c.nonce().size()) +
                                       " bytes");
      }
      peer.name = c.node_name();
      peer.their_nonce = c.nonce();
      proto::PeerMessage proof;
      proof.mutable_proof()->set_mac(auth::Proof(options_.auth_secret, proto::PEER_PROTOCOL,
                                                 peer.dialed, options_.name, peer.name,
                                                 peer.our_nonce, peer.their_nonce));
      (void)peer.conn->Send(proof);
      return Status::Ok();
    }
    case proto::PeerMessage::kProof: {
      if (peer.their_nonce.empty()) return Status::InvalidArgument("proof before challenge");
      const std::string expected =
          auth::Proof(options_.auth_secret, proto::PEER_PROTOCOL, !peer.dialed, peer.name,
                      options_.name, peer.their_nonce, peer.our_nonce);
      if (!auth::Equal(expected, m.proof().mac())) {
        ++auth_failures_;
        return Status::Incompatible("authentication failed: peer '" + peer.name.substr(0, 64) +
                                    "' does not hold this kvd's secret (--auth-secret-file "
                                    "differs)");
      }
      peer.authenticated = true;
      spdlog::info("kvd {}: {} authenticated as {}", options_.name, peer.conn->label(), peer.name);
      // Every later frame both ways is sealed: the peer's next one is its hello, sent after it
      // checked our proof, which precedes everything we send from here on.
      const auth::SessionKeys keys =
          auth::DeriveSessionKeys(options_.auth_secret, peer.dialed, options_.name, peer.name,
                                  peer.our_nonce, peer.their_nonce);
      if (!peer.conn->EnableSealing(keys.send, keys.receive).ok()) return Status::Ok();  // closed
      SendHello(peer);
      return Status::Ok();
    }
    case proto::PeerMessage::kRefused:
      ++auth_failures_;
      return Status::Incompatible("refused by the peer: " + m.refused().reason().substr(0, 512));
    case proto::PeerMessage::kHello:
      ++auth_failures_;
      return Status::Incompatible(
          "peer sent its hello without authenticating: it runs without --auth-secret-file, this "
          "kvd with one");
    default:
      return Status::InvalidArgument("message before authentication");
  }
}

Result<uint64_t> Daemon::Core::PeerFor(const std::string& address) {
  if (Peer* dialed = peers_.Dialed(address)) return dialed->id;
  // A peer that dialed us is found by the address it listens on only after its hello; matching
  // by name is not possible before it, so a second session may be dialed. Both are valid.
  KV_ASSIGN_OR_RETURN(const tcp::endpoint endpoint, ParseHostPort(address, "peer address"));
  if (endpoint.port() == 0) {
    return Status::InvalidArgument("peer address '" + address + "' is not HOST:PORT");
  }
  if (options_.auth_secret.empty() && !options_.insecure_peers &&
      !endpoint.address().is_loopback()) {
    return Status::Unavailable("peer address '" + address +
                               "' is not on loopback: without --auth-secret-file this kvd dials "
                               "loopback peers only (--insecure opens it)");
  }
  const uint64_t id = next_id_++;
  Peer& peer = peers_.Add(id);
  peer.dialed_address = address;
  peer.last_heard = Clock::now();
  peer.connecting = std::make_shared<tcp::socket>(io_);
  peer.connecting->async_connect(
      endpoint, [this, id, address, socket = peer.connecting](const boost::system::error_code& ec) {
        Peer* p = FindPeer(id);
        if (p == nullptr) return;
        if (ec) {
          if (resolver_) resolver_->Forget(address);  // a name there is looked up anew
          scheduler_->FailRequestsOfPeer(
              id, Status::Unavailable("connect to kvd at " + address + ": " + ec.message()));
          peers_.Remove(id);
          return;
        }
        socket->set_option(tcp::no_delay(true));
        ServePeer(socket->release(), address);
      });
  return id;
}

void Daemon::Core::OnPeerMessage(uint64_t peer_id, const std::string& body) {
  Peer* peer = FindPeer(peer_id);
  if (peer == nullptr) return;
  peer->last_heard = Clock::now();
  if (Hold(peer->held, *peer->conn, body)) return;
  proto::PeerMessage m;
  if (!m.ParseFromString(body)) {
    peer->conn->Close(Status::InvalidArgument(peer->conn->label() + ": malformed message"));
    return;
  }
  if (!peer->authenticated) {
    Status s = OnAuthMessage(*peer, m);
    if (!s.ok()) RefusePeer(*peer, s);
    return;
  }
  if (m.body_case() == proto::PeerMessage::kChallenge) {
    // A kvd with a secret talking to one without: say so on both sides.
    RefusePeer(*peer, Status::Incompatible("peer wants to authenticate but this kvd has no "
                                           "--auth-secret-file"));
    return;
  }
  if (m.body_case() == proto::PeerMessage::kRefused) {
    ++auth_failures_;
    peer->conn->Close(Status::Incompatible(
        peer->conn->label() + ": refused by the peer: " + m.refused().reason().substr(0, 512)));
    return;
  }
  if (m.body_case() == proto::PeerMessage::kHello) {
    Status s = HandlePeerHello(*peer, m.hello());
    if (!s.ok()) peer->conn->Close(s.WithContext(peer->conn->label()));
    return;
  }
  if (!peer->ready) {
    peer->conn->Close(Status::InvalidArgument(peer->conn->label() + ": message before hello"));
    return;
  }
  switch (m.body_case()) {
    case proto::PeerMessage::kHeartbeat:
      return;
    case proto::PeerMessage::kWant:
      HandleWant(*peer, m.want());
      return;
    case proto::PeerMessage::kConfirm:
      scheduler_->OnConfirm(*peer, m.confirm().request_id());
      return;
    case proto::PeerMessage::kFail:
      scheduler_->OnPeerFail(*peer, m.fail());
      return;
    default:
      peer->conn->Close(Status::InvalidArgument(peer->conn->label() + ": unknown message"));
  }
}

namespace {

// Every layout a peer announces must parse, and its ranks must agree on the TP size. Against
// ours, region by region index (an engine registers its caches in the same order on both
// sides): what no plan can bridge — layer count, bytes per head-token, the model's KV heads — is
// refused with both values named. TP size and block size differences are the planner's job.
Status CheckPeerLayouts(const std::string& our_name, const proto::PeerHello& mine,
                        const proto::PeerHello& theirs) {
  const std::string& peer = theirs.node_name();
  std::vector<KvRegion> their_first;
  // Ranks inside a sane TP size: a hello of 20,000 ranks was accepted before. (Ranks may repeat:
  // a kvd serving two instances announces the engines of both.)
  if (theirs.tp_size() < 0 || theirs.tp_size() > kMaxTpSize || theirs.ranks_size() > kMaxTpSize) {
    return Status::InvalidArgument("peer " + peer + " announces " +
                                   std::to_string(theirs.ranks_size()) + " ranks of TP size " +
                                   std::to_string(theirs.tp_size()));
  }
  for (const proto::RankInfo& rank : theirs.ranks()) {
    if (rank.tp_rank() < 0 || rank.tp_rank() >= std::max(theirs.tp_size(), 1)) {
      return Status::InvalidArgument("peer " + peer + " announces TP rank " +
                                     std::to_string(rank.tp_rank()) + " of " +
                                     std::to_string(theirs.tp_size()));
    }
    if (rank.regions_size() > kMaxRegionsPerEngine) {
      return Status::InvalidArgument("peer " + peer + " announces " +
                                     std::to_string(rank.regions_size()) + " regions on a rank");
    }
    for (int i = 0; i < rank.regions_size(); ++i) {
      auto region = FromWire(rank.regions(i));
      if (!region.ok()) {
        return region.status().WithContext("peer " + peer + " rank " +
                                           std::to_string(rank.tp_rank()) + " region " +
                                           std::to_string(i));
      }
      if (static_cast<int>(their_first.size()) == i) their_first.push_back(*region);
    }
  }
  if (mine.ranks_size() == 0) return Status::Ok();
  const proto::RankInfo& ours = mine.ranks(0);
  const int common = std::min<int>(ours.regions_size(), static_cast<int>(their_first.size()));
  for (int i = 0; i < common; ++i) {
    auto own = FromWire(ours.regions(i));
    if (!own.ok()) continue;  // ours were validated at registration
    const KvRegion& other = their_first[i];
    const std::string where = " (region " + std::to_string(i) + ")";
    auto differ = [&](const std::string& what, int64_t a, int64_t b) {
      return Status::Incompatible(what + " differ" + where + ": " + our_name + " has " +
                                  std::to_string(a) + ", " + peer + " has " + std::to_string(b));
    };
    if (own->spec().layers != other.spec().layers) {
      return differ("layers", own->spec().layers, other.spec().layers);
    }
    if (own->logical_content_bytes() != other.logical_content_bytes()) {
      return differ("bytes per head-token (head size or dtype)", own->logical_content_bytes(),
                    other.logical_content_bytes());
    }
    if (own->total_heads() != other.total_heads()) {
      return differ("model KV heads", own->total_heads(), other.total_heads());
    }
  }
  return Status::Ok();
}

}  // namespace

Status Daemon::Core::HandlePeerHello(Peer& peer, const proto::PeerHello& hello) {
  if (peer.ready) return Status::InvalidArgument("hello sent twice");
  if (hello.protocol_version() != proto::PEER_PROTOCOL) {
    return Status::Incompatible(PeerVersionMismatch(hello.protocol_version()));
  }
  if (hello.node_name().empty() || hello.node_name().size() > kMaxRequestIdBytes) {
    return Status::InvalidArgument("peer node name must have 1 to 256 bytes");
  }
  // The name was bound to the proof: an authenticated peer cannot speak as another.
  if (!options_.auth_secret.empty() && hello.node_name() != peer.name) {
    return Status::InvalidArgument("peer authenticated as '" + peer.name + "' says hello as '" +
                                   hello.node_name().substr(0, 64) + "'");
  }
  if (hello.transport() != transport_->name()) {
    return Status::Incompatible("peer " + hello.node_name() + " uses transport '" +
                                hello.transport().substr(0, 64) + "', this kvd '" +
                                std::string(transport_->name()) + "'");
  }
  KV_RETURN_IF_ERROR(CheckPeerLayouts(options_.name, BuildHello(), hello));
  const uint64_t endpoint = std::exchange(peer.transport_endpoint, 0);  // consumed either way
  // A UCX connect is a round trip to the peer's worker: off the io thread, so that a peer that
  // stalls it delays no one else. Its later messages wait in peer.held meanwhile.
  auto work = [this, address = hello.transport_address(), endpoint]() -> Result<transport::PeerId> {
    return transport_->connect_endpoint(address, endpoint);
  };
  auto done = [this, id = peer.id, name = hello.node_name(),
               ranks = hello.ranks_size()](Result<transport::PeerId> connected) {
    PeerConnected(id, name, ranks, std::move(connected));
  };
  const Status submitted = setup_->Submit<transport::PeerId>(
      Clock::now() + options_.handshake_timeout, std::move(work), std::move(done));
  if (!submitted.ok()) {
    transport_->release_endpoint(endpoint);
    return submitted;
  }
  peer.held.busy = true;
  return Status::Ok();
}

void Daemon::Core::PeerConnected(uint64_t peer_id, std::string name, int ranks,
                                 Result<transport::PeerId> connected) {
  Peer* peer = FindPeer(peer_id);
  if (peer == nullptr) {
    if (connected.ok()) transport_->disconnect(*connected);  // it left meanwhile
    return;
  }
  if (!connected.ok()) {
    // Told why (an authenticated peer whose transport address this kvd refused, issue 19).
    RefusePeer(*peer, connected.status());
    return;
  }
  peer->transport_peer = *connected;
  peer->name = std::move(name);
  peer->ready = true;
  spdlog::info("kvd {}: peer {} ready ({} ranks)", options_.name, peer->name, ranks);
  auto queued = std::move(peer->queued);
  peer->queued.clear();
  // By id, not through `peer`: a send that fails closes the connection and erases the peer.
  for (auto& m : queued) {
    // Issue 19 (write_grants.h): a Want's source may write its request's blocks once it leaves.
    if (!scheduler_->GrantWantWrites(peer_id, m)) continue;
    peers_.Send(peer_id, std::move(m));
  }
  ReleasePeer(peer_id);
}

void Daemon::Core::ReleasePeer(uint64_t peer_id) {
  if (Peer* p = FindPeer(peer_id)) p->held.busy = false;
  // Looked up again after each message: its handler may close the connection, or start another
  // setup step (which releases the rest when it is done).
  for (Peer* p = FindPeer(peer_id); p != nullptr && !p->held.busy && !p->held.messages.empty();
       p = FindPeer(peer_id)) {
    std::string body = std::move(p->held.messages.front());
    p->held.messages.pop_front();
    p->held.bytes -= body.size();
    OnPeerMessage(peer_id, body);
    send_queue_->FlushIfDue();
  }
}

void Daemon::Core::OnPeerClosed(uint64_t peer_id, const Status& why) {
  Peer* peer = FindPeer(peer_id);
  if (peer == nullptr) return;
  const std::string who = peer->name.empty() ? peer->conn->label() : "peer " + peer->name;
  if (peer->conn->seal_broken()) ++auth_failures_;  // a frame altered or injected on the wire
  if (why.ok()) {
    spdlog::info("kvd {}: {} disconnected", options_.name, who);
  } else if (draining_) {
    // This kvd is shutting down and closed it: expected, not a fault to warn of.
    spdlog::info("kvd {}: closed {}: {}", options_.name, who, why.ToString());
  } else {
    spdlog::warn("kvd {}: lost {}: {}", options_.name, who, why.ToString());
  }
  // A daemon name cached at this address is looked up again: the kvd may come back elsewhere.
  if (resolver_ && peer->dialed) resolver_->Forget(peer->dialed_address);
  scheduler_->FailRequestsOfPeer(
      peer_id, Status::Unavailable(who + " is gone" + (why.ok() ? "" : ": " + why.message())));
  if (peer->ready) event_gate_->Disconnect(peer->transport_peer);  // and the transport's
  if (peer->transport_endpoint != 0) transport_->release_endpoint(peer->transport_endpoint);
  peers_.Remove(peer_id);
}

// ---- a Want's imports (the request itself: Scheduler::OnWant, transfers.cc) ----

void Daemon::Core::HandleWant(Peer& peer, const proto::WantRequest& want) {
  Trace("want_in", want.request_id(), -1);
  // Regions of the peer not imported yet (the first Want into each): imported on the setup
  // worker, a round trip to the transport's thread or a CUDA IPC open each.
  std::vector<std::string> missing;
  size_t named = 0;
  for (const auto& rank : want.ranks()) {
    named += static_cast<size_t>(rank.descriptors_size());
    for (const std::string& d : rank.descriptors()) {
      if (!Peers::Imported(peer, d)) missing.push_back(d);
    }
  }
  if (missing.empty() || named > static_cast<size_t>(kMaxTpSize) * kMaxRegionsPerEngine) {
    const Status s =
        scheduler_->OnWant(peer, want);  // and a Want too large to be one is refused there
    if (!s.ok()) RefuseWant(peer.id, want, s);
    return;
  }
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  auto work = [this, transport_peer = peer.transport_peer,
               missing]() -> Result<Scheduler::Imports> {
    Scheduler::Imports fresh;
    for (const std::string& d : missing) {
      KV_ASSIGN_OR_RETURN(std::shared_ptr<transport::RemoteMemory> remote,
                          transport_->import_remote(transport_peer, d));
      fresh.emplace(d, std::move(remote));
    }
    return fresh;
  };
  auto done = [this, id = peer.id, want](Result<Scheduler::Imports> fresh) {
    Peer* p = FindPeer(id);
    if (p == nullptr) return;  // gone: the imports close here
    const Status s = fresh.ok() ? scheduler_->OnWant(*p, want, *fresh) : fresh.status();
    if (!s.ok()) RefuseWant(id, want, s);
    ReleasePeer(id);
  };
  const Status submitted = setup_->Submit<Scheduler::Imports>(Clock::now() + options_.lease,
                                                              std::move(work), std::move(done));
  if (!submitted.ok()) {
    RefuseWant(peer.id, want, submitted);
    return;
  }
  peer.held.busy = true;
}

void Daemon::Core::RefuseWant(uint64_t peer_id, const proto::WantRequest& want, const Status& why) {
  Peer* peer = FindPeer(peer_id);
  if (peer == nullptr) return;
  spdlog::warn("kvd {}: refused request {} from {}: {}", options_.name,
               want.request_id().substr(0, kMaxRequestIdBytes), peer->name, why.ToString());
  proto::PeerMessage fail;
  fail.mutable_fail()->set_request_id(want.request_id().substr(0, kMaxRequestIdBytes));
  ToWire(why, fail.mutable_fail()->mutable_error());
  peers_.Send(peer_id, std::move(fail));
}

}  // namespace kv::daemon
