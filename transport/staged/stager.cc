#include "transport/staged/stager.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#if KV_STAGED_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "transport/cuda_ipc/cuda_util.h"
#include "transport/cuda_ipc/run_copier.h"
#endif

namespace kv::transport::staged {
namespace {

constexpr size_t kAlign = 4096;

// A slot whose memory is the inner transport's allocation, a heap block or CUDA pinned memory.
class OwnedSlot final : public Slot {
 public:
  enum class Memory { kInner, kHeap, kCudaHost };
  OwnedSlot(char* data, uint64_t bytes, Memory memory)
      : data_(data), bytes_(bytes), memory_(memory) {}
  ~OwnedSlot() override {
    registration_.reset();  // deregisters first; frees kInner memory
#if KV_STAGED_HAVE_CUDA
    if (memory_ == Memory::kCudaHost) (void)cudaFreeHost(data_);
#endif
    if (memory_ == Memory::kHeap) std::free(data_);
  }
  char* data() const override {
    return data_;
  }
  uint64_t bytes() const override {
    return bytes_;
  }
  bool pinned() const override {
    return memory_ == Memory::kCudaHost;
  }
  const MemoryRegistration& registration() const override {
    return *registration_;
  }

  // Set after construction, so that a failed registration still frees the memory.
  std::unique_ptr<MemoryRegistration> registration_;

 private:
  char* data_;
  uint64_t bytes_;
  Memory memory_;
};

// Unregisters a CUDA-registered inner allocation, then lets the registration free it.
class InnerPinnedSlot final : public Slot {
 public:
  explicit InnerPinnedSlot(std::unique_ptr<MemoryRegistration> r) : r_(std::move(r)) {}
  ~InnerPinnedSlot() override {
#if KV_STAGED_HAVE_CUDA
    (void)cudaHostUnregister(r_->base());
#endif
  }
  char* data() const override {
    return static_cast<char*>(r_->base());
  }
  uint64_t bytes() const override {
    return r_->length();
  }
  bool pinned() const override {
    return true;
  }
  const MemoryRegistration& registration() const override {
    return *r_;
  }

 private:
  std::unique_ptr<MemoryRegistration> r_;
};

Result<std::unique_ptr<Slot>> RegisterOwned(Transport& inner, char* data, uint64_t bytes,
                                            OwnedSlot::Memory memory) {
  auto slot = std::make_unique<OwnedSlot>(data, bytes, memory);
  KV_ASSIGN_OR_RETURN(slot->registration_,
                      inner.register_memory(data, bytes, MemoryLocation::Host()));
  return std::unique_ptr<Slot>(std::move(slot));
}

Result<std::unique_ptr<Slot>> HeapSlot(Transport& inner, uint64_t bytes) {
  void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (p == nullptr)
    return Status::ResourceExhausted("no memory for a staging slot of " + std::to_string(bytes));
  return RegisterOwned(inner, static_cast<char*>(p), bytes, OwnedSlot::Memory::kHeap);
}

class HostStager : public Stager {
 public:
  bool cuda() const override { return false; }

  Result<std::unique_ptr<Slot>> AllocateSlot(Transport& inner, uint64_t bytes,
                                             bool receive) override {
    if (receive) {
      auto allocated = inner.allocate_memory(bytes, MemoryLocation::Host());
      if (allocated.ok()) {
        auto slot = std::make_unique<OwnedSlot>(static_cast<char*>((*allocated)->base()), bytes,
                                                OwnedSlot::Memory::kInner);
        slot->registration_ = std::move(*allocated);
        return std::unique_ptr<Slot>(std::move(slot));
      }
      if (allocated.status().code() != Code::kUnsupported) return allocated.status();
    }
    return HeapSlot(inner, bytes);
  }

  Status Copy(const void* src, void* dst, std::span<const Run> runs, MemoryLocation region,
              bool to_region, CopyDone done) override {
    (void)to_region;
    if (region.kind != MemoryKind::kHost)
      return Status::Unsupported("this build stages host memory only (no CUDA device)");
    for (const Run& r : runs) {
      std::memcpy(static_cast<char*>(dst) + r.dst_offset,
                  static_cast<const char*>(src) + r.src_offset, r.length);
    }
    done(Status::Ok());
    return Status::Ok();
  }
};

#if KV_STAGED_HAVE_CUDA

void CUDART_CB CallDone(void* user) {
  auto* done = static_cast<CopyDone*>(user);
  (*done)(Status::Ok());
  delete done;
}

class CudaStager final : public HostStager {
 public:
  ~CudaStager() override {
    for (auto& [key, lane] : lanes_) (void)cudaStreamSynchronize(lane.stream.get());
  }
  bool cuda() const override { return true; }

  Result<std::unique_ptr<Slot>> AllocateSlot(Transport& inner, uint64_t bytes,
                                             bool receive) override {
    if (receive) {
      auto allocated = inner.allocate_memory(bytes, MemoryLocation::Host());
      if (allocated.ok()) {
        void* base = (*allocated)->base();
        if (cudaHostRegister(base, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped) ==
            cudaSuccess)
          return std::unique_ptr<Slot>(new InnerPinnedSlot(std::move(*allocated)));
        (void)cudaGetLastError();  // not sticky; fall back to CUDA's own pinned memory
      } else if (allocated.status().code() != Code::kUnsupported) {
        return allocated.status();
      }
    }
    void* p = nullptr;
    KV_RETURN_IF_ERROR(
        gpu::CudaStatus(cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped),
                        "cudaHostAlloc of a staging slot"));
    return RegisterOwned(inner, static_cast<char*>(p), bytes, OwnedSlot::Memory::kCudaHost);
  }

  Status Copy(const void* src, void* dst, std::span<const Run> runs, MemoryLocation region,
              bool to_region, CopyDone done) override {
    if (region.kind == MemoryKind::kHost)
      return HostStager::Copy(src, dst, runs, region, to_region, std::move(done));
    KV_ASSIGN_OR_RETURN(Lane * lane, LaneFor(region.device, to_region));
    gpu::DeviceGuard guard(region.device);
    KV_RETURN_IF_ERROR(lane->copier->Copy(
        src, dst, runs,
        to_region ? kernels::CopyDirection::kHostToDevice : kernels::CopyDirection::kDeviceToHost,
        lane->stream.get()));
    auto* heap_done = new CopyDone(std::move(done));
    Status launched = gpu::CudaStatus(cudaLaunchHostFunc(lane->stream.get(), &CallDone, heap_done),
                                      "cudaLaunchHostFunc after a staging copy");
    if (!launched.ok()) delete heap_done;
    return launched;
  }

 private:
  struct Lane {
    gpu::CudaStream stream;
    std::unique_ptr<gpu::RunCopier> copier;
  };

  Result<Lane*> LaneFor(int device, bool to_region) {
    auto key = std::make_pair(device, to_region);
    auto it = lanes_.find(key);
    if (it != lanes_.end()) return &it->second;
    Lane lane;
    KV_ASSIGN_OR_RETURN(lane.stream, gpu::CudaStream::Create(device));
    KV_ASSIGN_OR_RETURN(lane.copier, gpu::RunCopier::Create(device));
    return &lanes_.emplace(key, std::move(lane)).first->second;
  }

  std::map<std::pair<int, bool>, Lane> lanes_;
};

#endif  // KV_STAGED_HAVE_CUDA

}  // namespace

bool BuiltWithCuda() {
#if KV_STAGED_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Stager> Stager::Create() {
#if KV_STAGED_HAVE_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
    return std::make_unique<CudaStager>();
  (void)cudaGetLastError();
#endif
  return std::make_unique<HostStager>();
}

}  // namespace kv::transport::staged
