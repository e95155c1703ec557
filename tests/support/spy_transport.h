// A transport for security tests: forwards every call to a real backend and counts what a peer
// obtained from it (endpoints opened, connections made), remembering the peers it connected to
// so that a test can send a notification as a hostile kvd would.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace kv::testing {

class SpyTransport final : public transport::Transport {
 public:
  struct Counters {
    std::atomic<int> endpoints_opened{0};
    std::atomic<int> connects{0};
    std::mutex mu;
    std::vector<transport::PeerId> peers;  // every peer connect*() returned
  };

  SpyTransport(std::unique_ptr<transport::Transport> inner, std::shared_ptr<Counters> counters)
      : inner_(std::move(inner)), counters_(std::move(counters)) {}
  std::string_view name() const override { return inner_->name(); }
  std::string address() const override { return inner_->address(); }
  bool supports(MemoryKind kind) const override { return inner_->supports(kind); }
  bool takes_run_groups() const override { return inner_->takes_run_groups(); }
  Result<std::unique_ptr<transport::MemoryRegistration>> register_memory(
      void* base, uint64_t length, MemoryLocation where) override {
    return inner_->register_memory(base, length, where);
  }
  Result<std::unique_ptr<transport::MemoryRegistration>> allocate_memory(
      uint64_t length, MemoryLocation where) override {
    return inner_->allocate_memory(length, where);
  }
  Result<transport::PeerId> connect(std::string_view peer_address) override {
    return Record(inner_->connect(peer_address));
  }
  Result<LocalEndpoint> open_endpoint() override {
    ++counters_->endpoints_opened;
    return inner_->open_endpoint();
  }
  Result<transport::PeerId> connect_endpoint(std::string_view peer_address,
                                             uint64_t endpoint) override {
    return Record(inner_->connect_endpoint(peer_address, endpoint));
  }
  void release_endpoint(uint64_t endpoint) override { inner_->release_endpoint(endpoint); }
  void disconnect(transport::PeerId peer) override { inner_->disconnect(peer); }
  Result<std::unique_ptr<transport::RemoteMemory>> import_remote(transport::PeerId peer,
                                                                 std::string_view packed) override {
    return inner_->import_remote(peer, packed);
  }
  Status post(const transport::Batch& batch, transport::Completion done) override {
    return inner_->post(batch, std::move(done));
  }
  Status notify(transport::PeerId peer, std::string message) override {
    return inner_->notify(peer, std::move(message));
  }
  void set_notification_handler(transport::NotificationHandler handler) override {
    inner_->set_notification_handler(std::move(handler));
  }
  // As a hostile kvd: sends `message` as a notification to every peer connected so far. True
  // when there was one and every send was accepted.
  bool NotifyEveryPeer(const std::string& message) {
    std::vector<transport::PeerId> peers;
    {
      std::lock_guard lock(counters_->mu);
      peers = counters_->peers;
    }
    bool ok = !peers.empty();
    for (transport::PeerId peer : peers) ok = inner_->notify(peer, message).ok() && ok;
    return ok;
  }

 private:
  Result<transport::PeerId> Record(Result<transport::PeerId> peer) {
    ++counters_->connects;
    if (peer.ok()) {
      std::lock_guard lock(counters_->mu);
      counters_->peers.push_back(*peer);
    }
    return peer;
  }
  std::unique_ptr<transport::Transport> inner_;
  std::shared_ptr<Counters> counters_;
};

}  // namespace kv::testing
