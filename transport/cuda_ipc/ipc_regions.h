// What the cuda_ipc backend registers and imports: the blob its import_remote() receives for a
// registered region (with the host identity it carries), the registration, and the imported
// region. Internal to the backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "gpu/ipc_memory.h"
#include "transport/same_host_channel.h"
#include "transport/transport.h"

namespace kv::transport::cuda_ipc {

// The backend is written in terms of the shared GPU pieces (gpu/).
using namespace ::kv::gpu;  // NOLINT(google-build-using-namespace): backend-private header

constexpr char kMagic[8] = "kvdipc2";
// What a peer's import_remote() receives. Fixed size, so a truncated or padded blob is rejected
// by its length before any field is read. kFdPathBytes and kHostIdBytes: same_host_channel.h.
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

// VMM memory: its fd is served by the channel's fd server; CUDA IPC memory: none (null).
class IpcRegistration final : public SameHostRegistration {
  using SameHostRegistration::SameHostRegistration;
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
