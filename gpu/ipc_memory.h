// CUDA device memory shared between processes of one host: exporting an allocation (the engine's
// KV cache) and opening another process's allocation (kvd, and the cuda_ipc transport for a
// peer's regions). cudaMalloc memory travels as a cudaIpcMemHandle; memory of the CUDA VMM API
// (cuMemCreate + cuMemMap: PyTorch's expandable segments, engines' own allocators), which
// cudaIpcGetMemHandle refuses, travels as the POSIX file descriptor of its allocation
// (cuMemExportToShareableHandle), passed over a unix socket with SCM_RIGHTS (the connector's
// frames to kvd: transport/fd_passing.h; kvd to a peer: base/fd_share.h).
//
// CUDA lets a process open a given handle only once per device context, and refuses to export
// (cudaIpcGetMemHandle) memory it imported. So every open goes through one process-wide cache,
// keyed by (handle, device) and refcounted: the mapping is closed with its last reference. And
// ExportDeviceMemory() exports a pointer inside an opened mapping under its owner's handle and
// offset, so kvd can hand an engine's region on to a peer (a VMM mapping: a duplicate of the fd it
// was opened from).
//
// The header is free of CUDA types, so kvd's control plane and the connector use it in every
// build; a build without CUDA gets implementations that return kUnsupported (no_cuda.cc).
// Thread-safety: every function is thread-safe; IpcMemory is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "base/unique_fd.h"

namespace kv::gpu {

inline constexpr size_t kIpcHandleBytes = 64;   // sizeof(cudaIpcMemHandle_t)
inline constexpr size_t kDeviceUuidBytes = 16;  // sizeof(cudaUUID_t)

// How an exported allocation is opened by another process.
enum class ShareKind {
  kCudaIpc,  // cudaMalloc memory: `handle` is its cudaIpcMemHandle_t
  kPosixFd,  // a VMM allocation: `fd` is its CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR handle
};

// What another process needs to open a range of device memory.
struct IpcExport {
  ShareKind kind = ShareKind::kCudaIpc;
  std::string handle;             // kCudaIpc: kIpcHandleBytes, the cudaIpcMemHandle_t
  UniqueFd fd;                    // kPosixFd: the allocation's shareable handle
  uint64_t offset = 0;            // of the exported range inside the allocation (VMM: its mapping)
  uint64_t allocation_bytes = 0;  // of the whole allocation (VMM: the mapping holding ptr)
  std::string device_uuid;        // kDeviceUuidBytes: the device the memory lives on
};

// Exports [ptr, ptr + bytes) of CUDA device `device`. kInvalidArgument when ptr is not device
// memory of `device` (host, managed or another device's memory; the message says which) or the
// range runs past its allocation (for VMM memory: past the one cuMemMap'ed allocation holding
// ptr); kUnsupported without CUDA or a visible device, for stream-ordered pool memory, and for a
// VMM allocation created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its
// requestedHandleTypes (the message names what the engine must change).
Result<IpcExport> ExportDeviceMemory(const void* ptr, uint64_t bytes, int device);

// The UUID of CUDA device `device` of this process.
Result<std::string> DeviceUuid(int device);
// The ordinal in this process of the device with `uuid`: processes may see devices under other
// ordinals (CUDA_VISIBLE_DEVICES). kNotFound when it is not visible here.
Result<int> DeviceWithUuid(std::string_view uuid);

// Whether contexts on CUDA device `device` are shared through MPS (cudaDevAttrMpsEnabled).
// Without MPS the GPU runs one process's kernels at a time: kvd's copy kernels (cuda_ipc, nccl)
// then get only the time slices of kvd's own context (benchmarks/pd_gpu.md, sixth session).
// kUnsupported without CUDA, kInvalidArgument for a device that is not visible.
Result<bool> SharedThroughMps(int device);

// Another process's allocation, opened in this one. The owner (OpenIpcMemory's callers) keeps it
// alive for as long as device work that names it may run; the last reference closes it (a VMM
// mapping: unmapped, its allocation handle released, its address range freed, its fd closed).
class IpcMemory {
 public:
  ~IpcMemory();
  IpcMemory(const IpcMemory&) = delete;
  IpcMemory& operator=(const IpcMemory&) = delete;

  void* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }  // of the whole allocation
  int device() const { return device_; }     // the context it was opened in
  ShareKind kind() const { return vmm_fd_.valid() ? ShareKind::kPosixFd : ShareKind::kCudaIpc; }
  const std::string& handle() const { return handle_; }  // kCudaIpc only
  const UniqueFd& fd() const { return vmm_fd_; }         // kPosixFd only

 private:
  friend Result<std::shared_ptr<IpcMemory>> OpenIpcMemory(std::string_view, int);
  friend Result<std::shared_ptr<IpcMemory>> OpenVmmMemory(UniqueFd, uint64_t, int, int);
  IpcMemory(void* base, uint64_t bytes, int device, std::string handle)
      : base_(base), bytes_(bytes), device_(device), handle_(std::move(handle)) {}
  IpcMemory(void* base, uint64_t bytes, int device, UniqueFd fd, uint64_t vmm_handle)
      : base_(base),
        bytes_(bytes),
        device_(device),
        vmm_fd_(std::move(fd)),
        vmm_handle_(vmm_handle) {}

  void* base_;
  uint64_t bytes_;
  int device_;
  std::string handle_;
  UniqueFd vmm_fd_;
  uint64_t vmm_handle_ = 0;  // CUmemGenericAllocationHandle of the imported VMM allocation
};

// Opens the allocation `handle` names in device `device`'s context (peer access enabled), or
// returns the mapping already open for (handle, device). kInvalidArgument for a handle that is
// not kIpcHandleBytes long; the CUDA error otherwise (a handle of this very process, a dead
// exporter, a handle from another host).
Result<std::shared_ptr<IpcMemory>> OpenIpcMemory(std::string_view handle, int device);

// Opens the first `bytes` of the VMM allocation whose POSIX fd handle is `fd` (taken over; closed
// with the mapping, or on failure): imports it, reserves an address range, maps it and grants
// read/write access to its own device and every device with peer access to it. `device` is the
// one whose copies will reach it (kUnsupported when it cannot); `owner_device`, when >= 0, the
// device the allocation must live on. The driver refuses a `bytes` larger than the allocation, so
// the mapping never reaches past it; kInvalidArgument for a `bytes` that is not a multiple of the
// allocation granularity, for an fd that is not a CUDA shareable handle, and for another owner.
Result<std::shared_ptr<IpcMemory>> OpenVmmMemory(UniqueFd fd, uint64_t bytes, int device,
                                                 int owner_device = -1);

}  // namespace kv::gpu
