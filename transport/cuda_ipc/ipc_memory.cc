#include "transport/cuda_ipc/ipc_memory.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "transport/cuda_ipc/cuda_util.h"

namespace kv::transport::gpu {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaUUID_t) == kDeviceUuidBytes);

// The allocation that holds `ptr`. Resolved through the runtime's driver entry point so the
// library does not link libcuda and CPU-only machines can still load it.
Status AllocationRange(const void* ptr, uintptr_t* alloc_base, uint64_t* alloc_bytes) {
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static GetAddressRange get_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<GetAddressRange>(fn);
  }();
  if (get_range == nullptr) return Status::Unsupported("driver lacks cuMemGetAddressRange");
  CUdeviceptr base = 0;
  size_t bytes = 0;
  if (get_range(&base, &bytes, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS) {
    return Status::InvalidArgument("pointer is not inside a CUDA allocation");
  }
  *alloc_base = static_cast<uintptr_t>(base);
  *alloc_bytes = bytes;
  return Status::Ok();
}

// Every mapping open in this process, by (handle, device) for OpenIpcMemory and by base address
// for ExportDeviceMemory. Entries are weak: the mapping closes with its last user, and a dead
// entry is replaced by the next open.
struct Registry {
  std::mutex mu;
  std::map<std::pair<std::string, int>, std::weak_ptr<IpcMemory>> by_handle;
  std::map<uintptr_t, std::weak_ptr<IpcMemory>> by_base;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: mappings may close during exit
  return *r;
}

// The open mapping holding [ptr, ptr + bytes), if any (caller holds the registry's lock).
std::shared_ptr<IpcMemory> MappingHolding(Registry& r, uintptr_t ptr) {
  auto it = r.by_base.upper_bound(ptr);
  if (it == r.by_base.begin()) return nullptr;
  --it;
  auto mapping = it->second.lock();
  if (!mapping || ptr - it->first >= mapping->bytes()) return nullptr;
  return mapping;
}

}  // namespace

IpcMemory::~IpcMemory() {
  DeviceGuard guard(device_);
  cudaIpcCloseMemHandle(base_);
  cudaGetLastError();  // a failed close (the device already torn down) must not linger
}

Result<std::string> DeviceUuid(int device) {
  cudaDeviceProp props{};
  KV_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties"));
  return std::string(props.uuid.bytes, sizeof(props.uuid.bytes));
}

Result<int> DeviceWithUuid(std::string_view uuid) {
  if (uuid.size() != kDeviceUuidBytes) {
    return Status::InvalidArgument("a device UUID has " + std::to_string(kDeviceUuidBytes) +
                                   " bytes, not " + std::to_string(uuid.size()));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  for (int d = 0; d < count; ++d) {
    auto mine = DeviceUuid(d);
    if (mine.ok() && *mine == uuid) return d;
  }
  return Status::NotFound("the engine's GPU is not visible to this process (" +
                          std::to_string(count) + " devices visible)");
}

Result<IpcExport> ExportDeviceMemory(const void* ptr, uint64_t bytes, int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::Unsupported("no CUDA device is visible to this process");
  }
  if (device < 0 || device >= count) {
    return Status::InvalidArgument("device " + std::to_string(device) + " is not one of the " +
                                   std::to_string(count) + " visible");
  }
  if (ptr == nullptr || bytes == 0) return Status::InvalidArgument("empty device memory range");
  cudaPointerAttributes attrs{};
  if (cudaPointerGetAttributes(&attrs, ptr) != cudaSuccess) {
    cudaGetLastError();
    return Status::InvalidArgument("pointer is not known to CUDA");
  }
  if (attrs.type != cudaMemoryTypeDevice) {
    return Status::InvalidArgument(attrs.type == cudaMemoryTypeManaged
                                       ? "pointer is managed memory, not device memory"
                                       : "pointer is host memory, not device memory");
  }
  if (attrs.device != device) {
    return Status::InvalidArgument("pointer is memory of device " + std::to_string(attrs.device) +
                                   ", not of device " + std::to_string(device));
  }
  IpcExport out;
  KV_ASSIGN_OR_RETURN(out.device_uuid, DeviceUuid(device));
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    if (auto mapping = MappingHolding(r, address)) {
      out.handle = mapping->handle();
      out.offset = address - reinterpret_cast<uintptr_t>(mapping->base());
      out.allocation_bytes = mapping->bytes();
    }
  }
  if (out.handle.empty()) {
    uintptr_t alloc_base = 0;
    KV_RETURN_IF_ERROR(AllocationRange(ptr, &alloc_base, &out.allocation_bytes));
    out.offset = address - alloc_base;
    cudaIpcMemHandle_t handle{};
    DeviceGuard guard(device);
    cudaError_t err = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(alloc_base));
    if (err != cudaSuccess) {
      cudaGetLastError();
      return Status::Unsupported(std::string("allocation cannot be exported through CUDA IPC (") +
                                 cudaGetErrorName(err) +
                                 "): stream-ordered pool and VMM memory need a shareable handle");
    }
    out.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  }
  if (bytes > out.allocation_bytes - out.offset) {
    return Status::InvalidArgument(std::to_string(bytes) + " bytes run past the allocation (" +
                                   std::to_string(out.allocation_bytes - out.offset) +
                                   " bytes left after the pointer)");
  }
  return out;
}

Result<std::shared_ptr<IpcMemory>> OpenIpcMemory(std::string_view handle, int device) {
  if (handle.size() != kIpcHandleBytes) {
    return Status::InvalidArgument("a CUDA IPC handle has " + std::to_string(kIpcHandleBytes) +
                                   " bytes, not " + std::to_string(handle.size()));
  }
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto key = std::make_pair(std::string(handle), device);
  if (auto open = r.by_handle[key].lock()) return open;
  cudaIpcMemHandle_t raw{};
  std::memcpy(&raw, handle.data(), sizeof(raw));
  DeviceGuard guard(device);
  void* base = nullptr;
  cudaError_t err = cudaIpcOpenMemHandle(&base, raw, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();  // the failed open must not surface in an unrelated later call
    return CudaStatus(err, "cudaIpcOpenMemHandle (the exporter must be another, live process)");
  }
  uintptr_t alloc_base = 0;
  uint64_t alloc_bytes = 0;
  Status range = AllocationRange(base, &alloc_base, &alloc_bytes);
  if (!range.ok() || alloc_base != reinterpret_cast<uintptr_t>(base)) {
    cudaIpcCloseMemHandle(base);
    return range.ok() ? Status::Internal("CUDA IPC mapping does not start its allocation")
                      : range.WithContext("CUDA IPC mapping");
  }
  std::shared_ptr<IpcMemory> mapping(new IpcMemory(base, alloc_bytes, device, std::string(handle)));
  r.by_handle[key] = mapping;
  r.by_base[alloc_base] = mapping;
  std::erase_if(r.by_handle, [](const auto& e) { return e.second.expired(); });
  std::erase_if(r.by_base, [](const auto& e) { return e.second.expired(); });
  return mapping;
}

}  // namespace kv::transport::gpu
