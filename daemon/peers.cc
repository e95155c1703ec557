#include "daemon/peers.h"

namespace kv::daemon {

namespace {
constexpr size_t kMaxImportsPerPeer = 4096;
}  // namespace

Peer& Peers::Add(uint64_t id) {
  Peer& peer = peers_[id];
  peer.id = id;
  return peer;
}

Peer* Peers::Find(uint64_t id) {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : &it->second;
}

void Peers::Remove(uint64_t id) {
  peers_.erase(id);
}

Peer* Peers::Dialed(const std::string& address) {
  for (auto& [id, peer] : peers_) {
    if (peer.dialed_address == address) return &peer;
  }
  return nullptr;
}

void Peers::Send(uint64_t id, proto::PeerMessage message) {
  Peer* peer = Find(id);
  if (peer == nullptr) return;
  if (!peer->ready) {
    peer->queued.push_back(std::move(message));
    return;
  }
  (void)peer->conn->Send(message);
}

Peers::Remote Peers::Imported(const Peer& peer, const std::string& descriptor) {
  auto it = peer.imported.find(descriptor);
  return it == peer.imported.end() ? nullptr : it->second;
}

void Peers::Remember(Peer& peer, const std::string& descriptor, Remote remote) {
  if (peer.imported.size() >= kMaxImportsPerPeer) peer.imported.clear();
  peer.imported.emplace(descriptor, std::move(remote));
}

Peers::Counts Peers::counts() const {
  Counts c;
  for (const auto& [id, peer] : peers_) {
    if (!peer.conn) continue;
    ++c.connections;
    if (!peer.authenticated) ++c.unauthenticated;
  }
  return c;
}

}  // namespace kv::daemon
