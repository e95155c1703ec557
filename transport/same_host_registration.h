// A region registered with a same-host backend (cuda_ipc, host_ipc): what the backend packed for
// its peers' import_remote(), and the token under which the channel's fd server
// (same_host_channel.h) serves the region's memory object to them, if it does.
//
// Deregistering (destroying it) stops serving the fd: peers that mapped the object keep their
// mappings; new imports get kNotFound from then on. Thread-safety: as MemoryRegistration.
//
// Each backend derives its own final class, so that a batch naming another backend's
// registration is told apart (by dynamic_cast) and refused.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "base/fd_share.h"
#include "transport/transport.h"

namespace kv::transport {

class SameHostRegistration : public MemoryRegistration {
 public:
  // `fd_server` null: no fd is served (a CUDA IPC handle travels in the descriptor itself).
  SameHostRegistration(void* base, uint64_t length, MemoryLocation where, std::string packed,
                       std::shared_ptr<FdServer> fd_server, uint64_t fd_token)
      : base_(base),
        length_(length),
        where_(where),
        packed_(std::move(packed)),
        fd_server_(std::move(fd_server)),
        fd_token_(fd_token) {}
  ~SameHostRegistration() override {
    if (fd_server_) fd_server_->Remove(fd_token_);
  }
  void* base() const override { return base_; }
  uint64_t length() const override { return length_; }
  MemoryLocation location() const override { return where_; }
  std::string packed_descriptor() const override { return packed_; }

 private:
  void* base_;
  uint64_t length_;
  MemoryLocation where_;
  std::string packed_;
  std::shared_ptr<FdServer> fd_server_;  // serves the object's fd until deregistered
  uint64_t fd_token_;
};

}  // namespace kv::transport
