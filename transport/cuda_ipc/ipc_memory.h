// CUDA device memory shared between processes of one host through CUDA IPC: exporting an
// allocation (the engine's KV cache) and opening another process's allocation (kvd, and the
// cuda_ipc transport for a peer's regions) once per process.
//
// CUDA lets a process open a given handle only once per device context, and refuses to export
// (cudaIpcGetMemHandle) memory it imported. So every open goes through one process-wide cache,
// keyed by (handle, device) and refcounted: the mapping is closed with its last reference. And
// ExportDeviceMemory() exports a pointer inside an opened mapping under its owner's handle and
// offset, so kvd can hand an engine's region on to a peer.
//
// The header is free of CUDA types, so kvd's control plane and the connector use it in every
// build; a build without CUDA gets implementations that return kUnsupported (no_cuda.cc).
// Thread-safety: every function is thread-safe; IpcMemory is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "layout/status.h"

namespace kv::transport::gpu {

inline constexpr size_t kIpcHandleBytes = 64;   // sizeof(cudaIpcMemHandle_t)
inline constexpr size_t kDeviceUuidBytes = 16;  // sizeof(cudaUUID_t)

// What another process needs to open a range of device memory.
struct IpcExport {
  std::string handle;             // kIpcHandleBytes: the whole allocation's cudaIpcMemHandle_t
  uint64_t offset = 0;            // of the exported range inside the allocation
  uint64_t allocation_bytes = 0;  // of the whole allocation
  std::string device_uuid;        // kDeviceUuidBytes: the device the memory lives on
};

// Exports [ptr, ptr + bytes) of CUDA device `device`. kInvalidArgument when ptr is not device
// memory of `device` (host, managed or another device's memory; the message says which) or the
// range runs past its allocation; kUnsupported without CUDA or a visible device, and for memory
// CUDA IPC cannot export (stream-ordered pools, VMM allocations).
Result<IpcExport> ExportDeviceMemory(const void* ptr, uint64_t bytes, int device);

// The UUID of CUDA device `device` of this process.
Result<std::string> DeviceUuid(int device);
// The ordinal in this process of the device with `uuid`: processes may see devices under other
// ordinals (CUDA_VISIBLE_DEVICES). kNotFound when it is not visible here.
Result<int> DeviceWithUuid(std::string_view uuid);

// Another process's allocation, opened in this one. The owner (OpenIpcMemory's callers) keeps it
// alive for as long as device work that names it may run; the last reference closes it.
class IpcMemory {
 public:
  ~IpcMemory();
  IpcMemory(const IpcMemory&) = delete;
  IpcMemory& operator=(const IpcMemory&) = delete;

  void* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }  // of the whole allocation
  int device() const { return device_; }     // the context it was opened in
  const std::string& handle() const { return handle_; }

 private:
  friend Result<std::shared_ptr<IpcMemory>> OpenIpcMemory(std::string_view, int);
  IpcMemory(void* base, uint64_t bytes, int device, std::string handle)
      : base_(base), bytes_(bytes), device_(device), handle_(std::move(handle)) {}

  void* base_;
  uint64_t bytes_;
  int device_;
  std::string handle_;
};

// Opens the allocation `handle` names in device `device`'s context (peer access enabled), or
// returns the mapping already open for (handle, device). kInvalidArgument for a handle that is
// not kIpcHandleBytes long; the CUDA error otherwise (a handle of this very process, a dead
// exporter, a handle from another host).
Result<std::shared_ptr<IpcMemory>> OpenIpcMemory(std::string_view handle, int device);

}  // namespace kv::transport::gpu
