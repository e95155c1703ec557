// A transport for security tests: forwards every call to a real backend and counts what a peer
// obtained from it (endpoints opened, connections made) and the notifications it sent,
// remembering the peers it connected to so that a test can send a notification as a hostile kvd
// would.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/forwarding_transport.h"
#include "transport/transport.h"

namespace kv::testing {

class SpyTransport final : public ForwardingTransport {
 public:
  struct Counters {
    std::atomic<int> endpoints_opened{0};
    std::atomic<int> connects{0};
    std::atomic<int> notifies{0};            // notify() calls the transport accepted
    std::atomic<uint64_t> runs_posted{0};    // entries of the batches post() accepted: runs,
    std::atomic<uint64_t> groups_posted{0};  // run groups
    std::atomic<uint64_t> blocks_posted{0};  // and blocks of groups
    std::mutex mu;
    std::vector<transport::PeerId> peers;  // every peer connect*() returned
    std::function<std::vector<std::string>(const std::string&)> ahead_of_notes;  // guarded by mu
  };

  SpyTransport(std::unique_ptr<transport::Transport> inner, std::shared_ptr<Counters> counters)
      : ForwardingTransport(std::move(inner)), counters_(std::move(counters)) {}
  Result<transport::PeerId> connect(std::string_view peer_address) override {
    return Record(inner().connect(peer_address));
  }
  Result<LocalEndpoint> open_endpoint() override {
    ++counters_->endpoints_opened;
    return inner().open_endpoint();
  }
  Result<transport::PeerId> connect_endpoint(std::string_view peer_address,
                                             uint64_t endpoint) override {
    return Record(inner().connect_endpoint(peer_address, endpoint));
  }
  Status notify(transport::PeerId peer, std::string message) override {
    std::vector<std::string> ahead;
    {
      std::lock_guard lock(counters_->mu);
      if (counters_->ahead_of_notes) ahead = counters_->ahead_of_notes(message);
    }
    for (std::string& extra : ahead) (void)inner().notify(peer, std::move(extra));
    Status s = inner().notify(peer, std::move(message));
    if (s.ok()) ++counters_->notifies;
    return s;
  }
  Status post(const transport::Batch& batch, transport::Completion done) override {
    Status s = inner().post(batch, std::move(done));
    if (s.ok()) {
      counters_->runs_posted += batch.runs.size();
      counters_->groups_posted += batch.groups.size();
      counters_->blocks_posted += batch.blocks.size();
    }
    return s;
  }
  int notifies() const { return counters_->notifies.load(); }
  const Counters& counters() const { return *counters_; }
  // As a kvd with a bug: each notification this kvd sends from now on goes behind what `ahead`
  // returns for it (sent first, on the same ordered path, uncounted).
  void SendAheadOfNotes(std::function<std::vector<std::string>(const std::string&)> ahead) {
    std::lock_guard lock(counters_->mu);
    counters_->ahead_of_notes = std::move(ahead);
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
    for (transport::PeerId peer : peers) ok = inner().notify(peer, message).ok() && ok;
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
  std::shared_ptr<Counters> counters_;
};

}  // namespace kv::testing
