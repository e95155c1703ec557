// A transport that forwards every call to a real backend: the base of the tests' spies, stallers
// and fault injectors, which override only the calls they change. Thread-safety: that of `inner`.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "transport/transport.h"

namespace kv::testing {

class ForwardingTransport : public transport::Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<transport::Transport> inner)
      : inner_(std::move(inner)) {}

  std::string_view name() const override { return inner_->name(); }
  std::string address() const override { return inner_->address(); }
  bool supports(MemoryKind kind) const override { return inner_->supports(kind); }
  bool takes_run_groups() const override { return inner_->takes_run_groups(); }
  bool takes_group_blocks() const override { return inner_->takes_group_blocks(); }
  Result<std::unique_ptr<transport::MemoryRegistration>> register_memory(
      void* base, uint64_t length, MemoryLocation where) override {
    return inner_->register_memory(base, length, where);
  }
  Result<std::unique_ptr<transport::MemoryRegistration>> register_shared_memory(
      void* base, uint64_t length, MemoryLocation where, const SharedObject& object) override {
    return inner_->register_shared_memory(base, length, where, object);
  }
  Result<std::unique_ptr<transport::MemoryRegistration>> allocate_memory(
      uint64_t length, MemoryLocation where) override {
    return inner_->allocate_memory(length, where);
  }
  Result<transport::PeerId> connect(std::string_view peer_address) override {
    return inner_->connect(peer_address);
  }
  Result<LocalEndpoint> open_endpoint() override { return inner_->open_endpoint(); }
  Result<transport::PeerId> connect_endpoint(std::string_view peer_address,
                                             uint64_t endpoint) override {
    return inner_->connect_endpoint(peer_address, endpoint);
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
  bool checks_write_grants() const override { return inner_->checks_write_grants(); }
  Status guard_writes(const transport::MemoryRegistration& memory) override {
    return inner_->guard_writes(memory);
  }
  Status grant_writes(uint64_t grant, transport::PeerId peer,
                      const transport::MemoryRegistration& memory,
                      std::span<const WriteRange> ranges) override {
    return inner_->grant_writes(grant, peer, memory, ranges);
  }
  void revoke_writes(uint64_t grant) override { inner_->revoke_writes(grant); }

 protected:
  transport::Transport& inner() { return *inner_; }

 private:
  std::unique_ptr<transport::Transport> inner_;
};

}  // namespace kv::testing
