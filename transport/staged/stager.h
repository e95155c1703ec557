// The staged transport's local half: staging slots (host memory registered with the inner
// transport) and the copies between a region and a slot.
//
// Host regions are copied with memcpy on the calling thread. GPU regions (builds with CUDA) go
// through the kernels' run copier (transport/cuda_ipc/run_copier.h: the plan-copy kernel for
// small scattered runs, the copy engine for large ones), on one stream per device and direction
// (gathers and scatters overlap), so slots are pinned and mapped whenever CUDA has a device.
//
// Not thread-safe: the staged transport calls it from its worker thread only. The destructor
// waits for the copies in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "layout/kv_region.h"
#include "layout/plan.h"
#include "layout/status.h"
#include "transport/transport.h"

namespace kv::transport::staged {

// A staging slot. Destroying it deregisters it from the inner transport, then frees it; the
// inner transport must outlive it, and no copy or batch may use it any more.
class Slot {
 public:
  virtual ~Slot() = default;
  virtual char* data() const = 0;
  virtual uint64_t bytes() const = 0;
  // Page-locked and mapped for CUDA: GPU regions can be copied to and from it.
  virtual bool pinned() const = 0;
  virtual const MemoryRegistration& registration() const = 0;
};

using CopyDone = std::function<void(Status)>;

// Whether this build can stage GPU regions at all (it has CUDA); whether this machine can is
// Stager::cuda().
bool BuiltWithCuda();

class Stager {
 public:
  // Initialises CUDA (in builds with it): call it after forking any child that uses CUDA.
  static std::unique_ptr<Stager> Create();
  virtual ~Stager() = default;

  // Whether GPU regions can be staged (a build with CUDA and at least one device).
  virtual bool cuda() const = 0;

  // A slot of `bytes`. A receive slot comes from inner.allocate_memory() where the backend has
  // an allocator (UCX: a shared-memory segment a same-host peer writes straight into), a send
  // slot from register_memory(). Pinned when cuda().
  virtual Result<std::unique_ptr<Slot>> AllocateSlot(Transport& inner, uint64_t bytes,
                                                     bool receive) = 0;

  // Copies every run from src to dst, one of which is a slot and the other a region living at
  // `region`; `to_region` says which way. Runs must be validated against both. `done` runs
  // exactly once when the bytes are in place: before Copy returns for host regions, on a CUDA
  // callback thread for GPU ones (it must not block or call CUDA). An error return means the
  // copy was not started and `done` will not run.
  virtual Status Copy(const void* src, void* dst, std::span<const Run> runs, MemoryLocation region,
                      bool to_region, CopyDone done) = 0;
};

}  // namespace kv::transport::staged
