// What the cuda_ipc backend registers and imports: the blob its import_remote() receives for a
// registered region (with the host identity it carries), the registration, and the imported
// region. Internal to the backend.
#pragma once

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "base/fd_share.h"
#include "gpu/ipc_memory.h"
#include "transport/transport.h"

namespace kv::transport::cuda_ipc {

// The backend is written in terms of the shared GPU pieces (gpu/).
using namespace ::kv::gpu;  // NOLINT(google-build-using-namespace): backend-private header

constexpr char kMagic[8] = "kvdipc2";
constexpr size_t kHostIdBytes = 48;
constexpr size_t kFdPathBytes = 108;  // sizeof(sockaddr_un::sun_path)
// What a peer's import_remote() receives. Fixed size, so a truncated or padded blob is rejected
// by its length before any field is read.
struct WireDescriptor {
  char magic[8];
  uint32_t share;              // gpu::ShareKind
  uint32_t reserved;           // zero
  cudaIpcMemHandle_t handle;   // kCudaIpc
  uint64_t fd_token;           // kPosixFd: the allocation's fd, served under this token...
  char fd_path[kFdPathBytes];  // ...by the exporter's FdServer at this unix socket
  uint64_t offset;             // of the registered base inside the allocation
  uint64_t length;             // registered bytes
  uint64_t allocation_bytes;   // of the whole allocation (VMM: of its mapping)
  char host_id[kHostIdBytes];
};

// Distinguishes hosts (and reboots of one host): CUDA IPC handles mean nothing elsewhere.
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

class IpcRegistration final : public MemoryRegistration {
 public:
  IpcRegistration(void* base, uint64_t length, MemoryLocation where, std::string packed,
                  std::shared_ptr<kv::FdServer> fd_server = nullptr, uint64_t fd_token = 0)
      : base_(base),
        length_(length),
        where_(where),
        packed_(std::move(packed)),
        fd_server_(std::move(fd_server)),
        fd_token_(fd_token) {}
  ~IpcRegistration() override {
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
  std::shared_ptr<kv::FdServer> fd_server_;  // VMM memory: serves its fd until deregistered
  uint64_t fd_token_;
};

class IpcRemote final : public RemoteMemory {
 public:
  IpcRemote(PeerId peer, std::shared_ptr<gpu::IpcMemory> mapping, uint64_t offset, uint64_t length)
      : peer_(peer), mapping_(std::move(mapping)), offset_(offset), length_(length) {}
  PeerId peer() const override { return peer_; }
  uint64_t length() const override { return length_; }
  char* base() const { return static_cast<char*>(mapping_->base()) + offset_; }

 private:
  PeerId peer_;
  std::shared_ptr<gpu::IpcMemory> mapping_;  // shared by every import of the allocation
  uint64_t offset_;
  uint64_t length_;
};

}  // namespace kv::transport::cuda_ipc
