// Peers: the peer kvds this one is connected to or dialing: each one's connection, handshake
// and authentication state, heartbeat clock, transport peer and import cache. Owned by
// Daemon::Core (core.h); the protocol over them is peer_session.cc.
//
// Threading: io thread only.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/connection.h"
#include "daemon/setup_worker.h"
#include "protocol/kvd.pb.h"
#include "transport/transport.h"

namespace kv::daemon {

struct Peer {
  uint64_t id = 0;
  std::shared_ptr<Connection> conn;                          // null while connecting
  std::shared_ptr<boost::asio::ip::tcp::socket> connecting;  // until the dial completes
  std::string dialed_address;                                // set when we dialed it
  std::string name;                                          // from its hello
  std::string remote_ip;  // of an accepted connection, for the per-address limit
  // Peer authentication (peer_auth.h): authenticated once the peer's proof matched (or at once
  // without a secret). `name` is bound to the proof: its hello must carry the same.
  bool authenticated = false;
  bool dialed = false;      // this side dialed the connection (the role inside the proofs)
  std::string our_nonce;    // sent in our challenge
  std::string their_nonce;  // from theirs; empty until it came
  int requests = 0;         // source requests bound to it (max_requests_per_peer)
  bool ready = false;       // hello exchanged and transport connected
  transport::PeerId transport_peer = 0;
  uint64_t transport_endpoint = 0;  // open_endpoint()'s, until connect_endpoint() takes it
  std::chrono::steady_clock::time_point last_heard;
  std::vector<proto::PeerMessage> queued;  // sent once ready
  // The peer's regions imported into the transport, by packed descriptor: every request into a
  // region shares one import instead of a blocking round trip to the transport's thread each.
  std::map<std::string, std::shared_ptr<transport::RemoteMemory>> imported;
  HeldMessages held;  // while its transport connect or a Want's imports run off the io thread
};

class Peers {
 public:
  using Remote = std::shared_ptr<transport::RemoteMemory>;

  // A new peer `id` (unique, from Core::next_id_), dialing or accepted.
  Peer& Add(uint64_t id);
  Peer* Find(uint64_t id);
  void Remove(uint64_t id);
  void Clear() { peers_.clear(); }
  // The peer this kvd dialed at `address` (with or without its connection yet), or null.
  Peer* Dialed(const std::string& address);
  // Sends `message` to peer `id`: queued until it is ready, dropped if it is gone. A send that
  // fails closes the connection (its close handler erases the peer).
  void Send(uint64_t id, proto::PeerMessage message);

  // The peer's import of region `descriptor`, or null; Remember caches one, within a bound (a
  // peer whose engines re-register leaves stale entries, dropped all at once; requests in
  // flight hold their own references).
  static Remote Imported(const Peer& peer, const std::string& descriptor);
  static void Remember(Peer& peer, const std::string& descriptor, Remote remote);

  struct Counts {
    uint32_t connections = 0;
    uint32_t unauthenticated = 0;
  };
  Counts counts() const;

  // Every peer, by id, for what walks them all (status, heartbeats, shutdown).
  std::map<uint64_t, Peer>& all() { return peers_; }
  const std::map<uint64_t, Peer>& all() const { return peers_; }

 private:
  std::map<uint64_t, Peer> peers_;
};

}  // namespace kv::daemon
