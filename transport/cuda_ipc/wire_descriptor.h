// The blob cuda_ipc's import_remote() receives for a registered region, and the host identity
// it carries. Internal to the cuda_ipc backend.
#pragma once

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace kv::transport::gpu {

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

}  // namespace kv::transport::gpu
