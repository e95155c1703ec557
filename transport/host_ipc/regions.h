// What the host_ipc backend registers and imports: the blob a peer's import_remote() receives for
// a registered region (with the host identity it carries), the registration, and the imported
// region. Internal to the backend (and its tests, which forge descriptors).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "base/fd_share.h"
#include "base/shared_memory.h"
#include "transport/transport.h"

namespace kv::transport::host_ipc {

constexpr char kMagic[8] = "kvdhip1";
constexpr size_t kHostIdBytes = 48;
constexpr size_t kFdPathBytes = 108;  // sizeof(sockaddr_un::sun_path)
// What a peer's import_remote() receives. Fixed size, so a truncated or padded blob is rejected
// by its length before any field is read.
struct WireDescriptor {
  char magic[8];
  uint64_t fd_token;           // the memory object's fd, served under this token...
  char fd_path[kFdPathBytes];  // ...by the exporter's FdServer at this unix socket
  uint32_t reserved;           // zero
  uint64_t offset;             // of the registered base inside the object
  uint64_t length;             // registered bytes
  char host_id[kHostIdBytes];
};

// Distinguishes hosts (and reboots of one host): a unix socket path means nothing elsewhere.
inline std::string HostId() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(boot, id);
  if (id.empty()) {
    char name[64] = {};
    gethostname(name, sizeof(name) - 1);
    id = name;
  }
  return id.substr(0, kHostIdBytes - 1);
}

class Registration final : public MemoryRegistration {
 public:
  Registration(void* base, uint64_t length, MemoryLocation where, std::string packed,
               std::shared_ptr<FdServer> fd_server, uint64_t fd_token)
      : base_(base),
        length_(length),
        where_(where),
        packed_(std::move(packed)),
        fd_server_(std::move(fd_server)),
        fd_token_(fd_token) {}
  // Peers that mapped the object keep their mappings; new imports get kNotFound from here on.
  ~Registration() override { fd_server_->Remove(fd_token_); }
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
