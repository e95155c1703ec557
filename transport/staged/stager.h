// The staged transport's local half: staging slots (host memory registered with the inner
// transport) and the copies between a region and a slot.
//
// Host regions are copied with memcpy on the calling thread. GPU regions (builds with CUDA) go
// through the kernels' run copier (transport/cuda_ipc/run_copier.h: the plan-copy kernel for
// small scattered runs, the copy engine for large ones), on one stream per device and direction
// (gathers and scatters overlap). A slot is page-locked and mapped for CUDA (cudaHostRegister)
// the first time a GPU region is copied through it, so a process that stages host memory only
// never initialises CUDA (it may still fork children that use CUDA).
//
// Not thread-safe: the staged transport calls it from its worker thread only. The destructor
// waits for the copies in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "base/status.h"
#include "layout/kv_region.h"
#include "layout/plan.h"
#include "transport/transport.h"

namespace kv::transport::staged {

// Whether this build can stage GPU regions at all (it has CUDA).
bool BuiltWithCuda();

// A staging slot. Destroying it unpins it, deregisters it from the inner transport and frees it;
// the inner transport must outlive it, and no copy or batch may still use it.
class Slot {
 public:
  Slot(std::unique_ptr<MemoryRegistration> registration, void* heap);
  ~Slot();
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

  char* data() const { return static_cast<char*>(registration_->base()); }
  uint64_t bytes() const { return registration_->length(); }
  const MemoryRegistration& registration() const { return *registration_; }

 private:
  friend class Stager;
  std::unique_ptr<MemoryRegistration> registration_;
  void* heap_;  // ours to free, or null when the inner transport allocated the memory
  bool pinned_ = false;
};

using CopyDone = std::function<void(Status)>;

// The host half of Stager::Copy: memcpy of every run, src + src_offset to dst + dst_offset.
// Thread-safe (it touches nothing but the bytes).
void CopyHostRuns(const char* src, char* dst, std::span<const Run> runs);

class Stager {
 public:
  Stager();
  ~Stager();
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // A slot of `bytes`. A receive slot comes from inner.allocate_memory() where the backend has
  // an allocator (UCX: a shared-memory segment a same-host peer writes straight into), a send
  // slot (or a receive slot without one) from the heap and register_memory().
  Result<std::unique_ptr<Slot>> AllocateSlot(Transport& inner, uint64_t bytes, bool receive);

  // Copies every run between `slot` and a region living at `region`: region → slot (a gather)
  // or slot → region when `to_region` (a scatter). `region_base` is the region's base; runs are
  // relative to the source and destination bases and must be validated against both. `done`
  // runs exactly once when the bytes are in place: before Copy returns for host regions, on a
  // CUDA callback thread for GPU ones (it must not block or call CUDA). An error return means
  // the copy was not started and `done` will not run.
  Status Copy(Slot& slot, char* region_base, MemoryLocation region, bool to_region,
              std::span<const Run> runs, CopyDone done);

  // Creates the streams and copiers for a device now, so that the first copy does not load
  // the copy kernel (which may wait for the whole device) on the worker thread at the worst
  // moment.
  void Warm(int device);

 private:
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;  // streams and copiers, created at the first GPU copy
};

}  // namespace kv::transport::staged
