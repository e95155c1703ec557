// What the host_ipc backend registers and imports: the blob a peer's import_remote() receives for
// a registered region (with the host identity it carries), the registration, and the imported
// region. Internal to the backend (and its tests, which forge descriptors).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "base/shared_memory.h"
#include "transport/same_host_channel.h"
#include "transport/transport.h"

namespace kv::transport::host_ipc {

constexpr char kMagic[8] = "kvdhip1";
// What a peer's import_remote() receives. Fixed size, so a truncated or padded blob is rejected
// by its length before any field is read. kFdPathBytes and kHostIdBytes: same_host_channel.h.
struct WireDescriptor {
  char magic[8];
  uint64_t fd_token;           // the memory object's fd, served under this token...
  char fd_path[kFdPathBytes];  // ...by the exporter's FdServer at this unix socket
  uint32_t reserved;           // zero
  uint64_t offset;             // of the registered base inside the object
  uint64_t length;             // registered bytes
  char host_id[kHostIdBytes];
};

class Registration final : public SameHostRegistration {
  using SameHostRegistration::SameHostRegistration;
};

// A peer's region, mapped here. The mapping is shared with every batch that names it, so it stays
// mapped until the last of them finished even when the RemoteMemory goes first.
class Remote final : public RemoteMemory {
 public:
  Remote(PeerId peer, std::shared_ptr<SharedMemory> mapping)
      : peer_(peer), mapping_(std::move(mapping)) {}
  PeerId peer() const override { return peer_; }
  uint64_t length() const override { return mapping_->size(); }
  char* base() const { return static_cast<char*>(mapping_->data()); }
  const std::shared_ptr<SharedMemory>& mapping() const { return mapping_; }

 private:
  PeerId peer_;
  std::shared_ptr<SharedMemory> mapping_;
};

}  // namespace kv::transport::host_ipc
