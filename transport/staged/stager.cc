#include "transport/staged/stager.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#if KV_STAGED_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda_util.h"
#include "gpu/run_copier.h"
#endif

namespace kv::transport::staged {
namespace {

constexpr size_t kAlign = 4096;

}  // namespace

void CopyHostRuns(const char* src, char* dst, std::span<const Run> runs) {
  for (const Run& r : runs) std::memcpy(dst + r.dst_offset, src + r.src_offset, r.length);
}

bool BuiltWithCuda() {
#if KV_STAGED_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Slot::Slot(std::unique_ptr<MemoryRegistration> registration, void* heap)
    : registration_(std::move(registration)), heap_(heap) {}

Slot::~Slot() {
#if KV_STAGED_HAVE_CUDA
  if (pinned_) (void)cudaHostUnregister(registration_->base());
#endif
  registration_.reset();  // frees an inner allocation
  std::free(heap_);
}

#if KV_STAGED_HAVE_CUDA

struct Stager::Cuda {
  struct Lane {
    gpu::CudaStream stream;
    std::unique_ptr<gpu::RunCopier> copier;
  };
  std::map<std::pair<int, bool>, Lane> lanes;  // (device, to_region)

  ~Cuda() {
    for (auto& [key, lane] : lanes) (void)cudaStreamSynchronize(lane.stream.get());
  }

  Result<Lane*> LaneFor(int device, bool to_region) {
    auto key = std::make_pair(device, to_region);
    auto it = lanes.find(key);
    if (it != lanes.end()) return &it->second;
    Lane lane;
    KV_ASSIGN_OR_RETURN(lane.stream, gpu::CudaStream::Create(device));
    KV_ASSIGN_OR_RETURN(lane.copier, gpu::RunCopier::Create(device));
    return &lanes.emplace(key, std::move(lane)).first->second;
  }

  static void CUDART_CB CallDone(void* user) {
    auto* done = static_cast<CopyDone*>(user);
    (*done)(Status::Ok());
    delete done;
  }

  static Status Pin(Slot& slot) {
    return gpu::CudaStatus(cudaHostRegister(slot.data(), slot.bytes(),
                                            cudaHostRegisterPortable | cudaHostRegisterMapped),
                           "cudaHostRegister of a staging slot");
  }
};

#else

struct Stager::Cuda {};

#endif  // KV_STAGED_HAVE_CUDA

Stager::Stager() = default;
Stager::~Stager() = default;  // ~Cuda waits for its streams

Result<std::unique_ptr<Slot>> Stager::AllocateSlot(Transport& inner, uint64_t bytes, bool receive) {
  if (receive) {
    auto allocated = inner.allocate_memory(bytes, MemoryLocation::Host());
    if (allocated.ok()) return std::make_unique<Slot>(std::move(*allocated), nullptr);
    if (allocated.status().code() != Code::kUnsupported) return allocated.status();
  }
  void* heap = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (heap == nullptr)
    return Status::ResourceExhausted("no memory for a staging slot of " + std::to_string(bytes));
  auto registration = inner.register_memory(heap, bytes, MemoryLocation::Host());
  if (!registration.ok()) {
    std::free(heap);
    return registration.status();
  }
  return std::make_unique<Slot>(std::move(*registration), heap);
}

void Stager::Warm(int device) {
#if KV_STAGED_HAVE_CUDA
  if (!cuda_) cuda_ = std::make_unique<Cuda>();
  for (bool to_region : {false, true}) (void)cuda_->LaneFor(device, to_region);
#else
  (void)device;
#endif
}

Status Stager::Copy(Slot& slot, char* region_base, MemoryLocation region, bool to_region,
                    std::span<const Run> runs, CopyDone done) {
  const char* src = to_region ? slot.data() : region_base;
  char* dst = to_region ? region_base : slot.data();
  if (region.kind == MemoryKind::kHost) {
    CopyHostRuns(src, dst, runs);
    done(Status::Ok());
    return Status::Ok();
  }
#if KV_STAGED_HAVE_CUDA
  if (!cuda_) cuda_ = std::make_unique<Cuda>();
  if (!slot.pinned_) {
    KV_RETURN_IF_ERROR(Cuda::Pin(slot));
    slot.pinned_ = true;
  }
  KV_ASSIGN_OR_RETURN(Cuda::Lane * lane, cuda_->LaneFor(region.device, to_region));
  gpu::DeviceGuard guard(region.device);
  KV_RETURN_IF_ERROR(lane->copier->Copy(
      src, dst, runs,
      to_region ? kernels::CopyDirection::kHostToDevice : kernels::CopyDirection::kDeviceToHost,
      lane->stream.get()));
  auto* heap_done = new CopyDone(std::move(done));
  Status launched =
      gpu::CudaStatus(cudaLaunchHostFunc(lane->stream.get(), &Cuda::CallDone, heap_done),
                      "cudaLaunchHostFunc after a staging copy");
  if (!launched.ok()) delete heap_done;
  return launched;
#else
  return Status::Unsupported("this build has no CUDA to stage GPU memory");
#endif
}

}  // namespace kv::transport::staged
