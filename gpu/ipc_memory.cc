#include "gpu/ipc_memory.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "gpu/cuda_util.h"

namespace kv::gpu {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaUUID_t) == kDeviceUuidBytes);

// The driver entry points this file uses, resolved through the runtime so the library does not
// link libcuda and CPU-only machines can still load it. A null entry: the driver lacks it.
struct Driver {
  decltype(&::cuMemGetAddressRange) get_address_range = nullptr;
  decltype(&::cuPointerGetAttribute) pointer_attribute = nullptr;
  decltype(&::cuMemRetainAllocationHandle) retain = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) properties = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) free_range = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;

  bool has_vmm() const {
    return retain && release && properties && granularity && export_handle && import_handle &&
           reserve && free_range && map && unmap && set_access;
  }
};

template <typename Fn>
void Resolve(const char* name, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    fn = nullptr;
  }
  *out = reinterpret_cast<Fn>(fn);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    Resolve("cuMemGetAddressRange", &r.get_address_range);
    Resolve("cuPointerGetAttribute", &r.pointer_attribute);
    Resolve("cuMemRetainAllocationHandle", &r.retain);
    Resolve("cuMemRelease", &r.release);
    Resolve("cuMemGetAllocationPropertiesFromHandle", &r.properties);
    Resolve("cuMemGetAllocationGranularity", &r.granularity);
    Resolve("cuMemExportToShareableHandle", &r.export_handle);
    Resolve("cuMemImportFromShareableHandle", &r.import_handle);
    Resolve("cuMemAddressReserve", &r.reserve);
    Resolve("cuMemAddressFree", &r.free_range);
    Resolve("cuMemMap", &r.map);
    Resolve("cuMemUnmap", &r.unmap);
    Resolve("cuMemSetAccess", &r.set_access);
    Resolve("cuGetErrorName", &r.error_name);
    return r;
  }();
  return d;
}

Status DriverStatus(CUresult result, std::string_view what) {
  if (result == CUDA_SUCCESS) return Status::Ok();
  const char* name = nullptr;
  if (driver().error_name == nullptr || driver().error_name(result, &name) != CUDA_SUCCESS) {
    name = nullptr;
  }
  return Status::IoError(std::string(what) + ": " +
                         (name != nullptr ? name : "CUresult " + std::to_string(result)));
}

// The allocation that holds `ptr`; for VMM memory the cuMemMap'ed range holding it.
Status AllocationRange(const void* ptr, uintptr_t* alloc_base, uint64_t* alloc_bytes) {
  if (driver().get_address_range == nullptr) {
    return Status::Unsupported("driver lacks cuMemGetAddressRange");
  }
  CUdeviceptr base = 0;
  size_t bytes = 0;
  const CUresult result =
      driver().get_address_range(&base, &bytes, reinterpret_cast<CUdeviceptr>(ptr));
  if (result != CUDA_SUCCESS) {
    return Status::InvalidArgument("pointer is not inside a CUDA allocation kvd can share (" +
                                   DriverStatus(result, "cuMemGetAddressRange").message() +
                                   "); PyTorch's expandable segments are not shareable yet: set "
                                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False");
  }
  *alloc_base = static_cast<uintptr_t>(base);
  *alloc_bytes = bytes;
  return Status::Ok();
}

// Whether cudaIpcGetMemHandle can export the allocation holding `ptr`. A driver that cannot say
// gets the benefit of the doubt: cudaIpcGetMemHandle then reports its own error.
bool LegacyIpcCapable(const void* ptr) {
  if (driver().pointer_attribute == nullptr) return true;
  uint64_t capable = 0;  // a boolean of the driver's choosing width: zeroed, any bit set is true
  if (driver().pointer_attribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                 reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS) {
    return true;
  }
  return capable != 0;
}

// Releases a CUmemGenericAllocationHandle on every path out of a scope.
class AllocationHandle {
 public:
  AllocationHandle() = default;
  ~AllocationHandle() {
    if (handle_ != 0) driver().release(handle_);
  }
  AllocationHandle(const AllocationHandle&) = delete;
  AllocationHandle& operator=(const AllocationHandle&) = delete;
  CUmemGenericAllocationHandle* out() { return &handle_; }
  CUmemGenericAllocationHandle get() const { return handle_; }
  CUmemGenericAllocationHandle release() { return std::exchange(handle_, 0); }

 private:
  CUmemGenericAllocationHandle handle_ = 0;
};

// The POSIX fd handle of the VMM allocation mapped at `ptr` (device memory of the current
// device that cudaIpcGetMemHandle refuses).
Result<UniqueFd> ExportVmm(const void* ptr) {
  const Driver& d = driver();
  if (!d.has_vmm()) return Status::Unsupported("the CUDA driver lacks the VMM API");
  AllocationHandle handle;
  if (d.retain(handle.out(), const_cast<void*>(ptr)) != CUDA_SUCCESS) {
    return Status::Unsupported(
        "allocation cannot be exported: cudaIpcGetMemHandle refuses it and it is no VMM "
        "allocation (stream-ordered pool memory, e.g. cudaMallocAsync, is not supported); "
        "allocate the KV cache with cudaMalloc, or with cuMemCreate requesting "
        "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR");
  }
  CUmemAllocationProp prop{};
  KV_RETURN_IF_ERROR(
      DriverStatus(d.properties(&prop, handle.get()), "cuMemGetAllocationPropertiesFromHandle"));
  if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return Status::Unsupported(
        "VMM allocation (cuMemCreate) was created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR "
        "in CUmemAllocationProp::requestedHandleTypes, so no other process can open it: the "
        "engine must request that handle type when it creates the KV cache's allocation");
  }
  int fd = -1;
  KV_RETURN_IF_ERROR(
      DriverStatus(d.export_handle(&fd, handle.get(), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                   "cuMemExportToShareableHandle"));
  return UniqueFd(fd);
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
  if (vmm_fd_.valid()) {
    const Driver& d = driver();
    const auto base = reinterpret_cast<CUdeviceptr>(base_);
    d.unmap(base, bytes_);
    d.free_range(base, bytes_);
    d.release(vmm_handle_);
  } else {
    cudaIpcCloseMemHandle(base_);
  }
  cudaGetLastError();  // a failed close (the device already torn down) must not linger
}

Result<std::string> DeviceUuid(int device) {
  cudaDeviceProp props{};
  KV_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties"));
  return std::string(props.uuid.bytes, sizeof(props.uuid.bytes));
}

namespace {

// kUnsupported without a visible device; kInvalidArgument for an ordinal not among them.
Status CheckVisibleDevice(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::Unsupported("no CUDA device is visible to this process");
  }
  if (device < 0 || device >= count) {
    return Status::InvalidArgument("device " + std::to_string(device) + " is not one of the " +
                                   std::to_string(count) + " visible");
  }
  return Status::Ok();
}

}  // namespace

Result<bool> SharedThroughMps(int device) {
  KV_RETURN_IF_ERROR(CheckVisibleDevice(device));
  int shared = 0;
  KV_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&shared, cudaDevAttrMpsEnabled, device),
                                "cudaDeviceGetAttribute(MpsEnabled)"));
  return shared != 0;
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
  KV_RETURN_IF_ERROR(CheckVisibleDevice(device));
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
      out.kind = mapping->kind();
      if (out.kind == ShareKind::kPosixFd) {
        KV_ASSIGN_OR_RETURN(out.fd, mapping->fd().Dup());
      } else {
        out.handle = mapping->handle();
      }
      out.offset = address - reinterpret_cast<uintptr_t>(mapping->base());
      out.allocation_bytes = mapping->bytes();
    }
  }
  if (out.handle.empty() && !out.fd.valid()) {
    // The driver calls below need the device's context current on this thread: an engine whose
    // CUDA runtime is not kvd's (PyTorch's own copy of it) may never have made it so for ours.
    DeviceGuard guard(device);
    uintptr_t alloc_base = 0;
    KV_RETURN_IF_ERROR(AllocationRange(ptr, &alloc_base, &out.allocation_bytes));
    out.offset = address - alloc_base;
    if (LegacyIpcCapable(ptr)) {
      cudaIpcMemHandle_t handle{};
      cudaError_t err = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(alloc_base));
      if (err != cudaSuccess) {
        cudaGetLastError();
        return Status::Unsupported(std::string("allocation cannot be exported through CUDA IPC (") +
                                   cudaGetErrorName(err) + ")");
      }
      out.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    } else {
      KV_ASSIGN_OR_RETURN(out.fd, ExportVmm(ptr));
      out.kind = ShareKind::kPosixFd;
    }
  }
  if (bytes > out.allocation_bytes - out.offset) {
    return Status::InvalidArgument(
        std::to_string(bytes) + " bytes run past the allocation (" +
        std::to_string(out.allocation_bytes - out.offset) + " bytes left after the pointer" +
        (out.kind == ShareKind::kPosixFd
             ? " in its VMM mapping: a region must lie in one cuMemMap'ed allocation)"
             : ")"));
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

Result<std::shared_ptr<IpcMemory>> OpenVmmMemory(UniqueFd fd, uint64_t bytes, int device,
                                                 int owner_device) {
  const Driver& d = driver();
  if (!d.has_vmm()) return Status::Unsupported("the CUDA driver lacks the VMM API");
  if (!fd.valid() || bytes == 0) {
    return Status::InvalidArgument("a VMM region needs its allocation's fd and a size");
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return Status::InvalidArgument("device " + std::to_string(device) + " is not visible");
  }
  DeviceGuard guard(device);
  AllocationHandle handle;
  if (d.import_handle(handle.out(), reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS) {
    return Status::InvalidArgument(
        "cuMemImportFromShareableHandle refused the fd: not the POSIX fd handle of a CUDA VMM "
        "allocation");
  }
  CUmemAllocationProp prop{};
  KV_RETURN_IF_ERROR(
      DriverStatus(d.properties(&prop, handle.get()), "cuMemGetAllocationPropertiesFromHandle"));
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id < 0 ||
      prop.location.id >= count) {
    return Status::InvalidArgument("the VMM allocation is not memory of a visible device");
  }
  const int owner = prop.location.id;
  if (owner_device >= 0 && owner != owner_device) {
    return Status::InvalidArgument("the VMM allocation lives on device " + std::to_string(owner) +
                                   ", not on device " + std::to_string(owner_device));
  }
  size_t granularity = 0;
  KV_RETURN_IF_ERROR(
      DriverStatus(d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                   "cuMemGetAllocationGranularity"));
  if (granularity == 0 || bytes % granularity != 0) {
    return Status::InvalidArgument("a VMM mapping of " + std::to_string(bytes) +
                                   " bytes is not a multiple of the allocation granularity (" +
                                   std::to_string(granularity) + " bytes)");
  }
  CUdeviceptr base = 0;
  KV_RETURN_IF_ERROR(
      DriverStatus(d.reserve(&base, bytes, granularity, 0, 0), "cuMemAddressReserve"));
  // cuMemMap refuses a size past the allocation's end: the driver, not the engine's claim,
  // bounds the mapping.
  if (CUresult mapped = d.map(base, bytes, 0, handle.get(), 0); mapped != CUDA_SUCCESS) {
    d.free_range(base, bytes);
    return DriverStatus(mapped, "cuMemMap of the engine's VMM allocation (is it smaller than the " +
                                    std::to_string(bytes) + " bytes it claims?)");
  }
  // Every device that may copy to or from it: its own, and those with peer access to it (the
  // cuda_ipc transport's copies run on kvd's device, not necessarily the owner).
  std::vector<CUmemAccessDesc> access;
  bool reaches = false;
  for (int other = 0; other < count; ++other) {
    int can = other == owner ? 1 : 0;
    if (other != owner && cudaDeviceCanAccessPeer(&can, other, owner) != cudaSuccess) {
      cudaGetLastError();
      can = 0;
    }
    if (can == 0) continue;
    reaches |= other == device;
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = other;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access.push_back(desc);
  }
  if (!reaches) {
    d.unmap(base, bytes);
    d.free_range(base, bytes);
    return Status::Unsupported("device " + std::to_string(device) +
                               " has no peer access to the VMM allocation on device " +
                               std::to_string(owner));
  }
  if (CUresult granted = d.set_access(base, bytes, access.data(), access.size());
      granted != CUDA_SUCCESS) {
    d.unmap(base, bytes);
    d.free_range(base, bytes);
    return DriverStatus(granted, "cuMemSetAccess");
  }
  void* mapped_base = reinterpret_cast<void*>(base);
  std::shared_ptr<IpcMemory> mapping(
      new IpcMemory(mapped_base, bytes, device, std::move(fd), handle.release()));
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.by_base[reinterpret_cast<uintptr_t>(mapped_base)] = mapping;
  std::erase_if(r.by_base, [](const auto& e) { return e.second.expired(); });
  return mapping;
}

}  // namespace kv::gpu
