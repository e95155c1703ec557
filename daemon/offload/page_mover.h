// PageMover: executes the copies of the offload pool, one queue per memory the engine pages
// live in (host memory, or one CUDA device).
//
// A CopyJob is a list of phases, each a table of planned runs (layout/plan.h) from src_base to
// dst_base. Phases exist so a load can report each layer as soon as its bytes landed ("per-layer
// waits"); a store is one phase. Jobs run in submission order.
//
// Threading: Submit() is thread-safe. on_phase and done run on the mover's own thread, in
// order, and must not block; done runs exactly once per accepted job. Destruction finishes every
// accepted job first.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "layout/plan.h"
#include "layout/status.h"

namespace kv::offload {

struct CopyJob {
  const std::byte* src_base = nullptr;
  std::byte* dst_base = nullptr;
  std::vector<std::vector<Run>> phases;  // checked against both buffers by the caller
  // A cudaEvent_t the engine recorded after the kernels that write (store) or last read (load)
  // these pages; the copy is ordered after it on the mover's stream. Null: no wait. Host movers
  // ignore it.
  void* ready_event = nullptr;
  std::function<void(size_t phase)> on_phase;  // may be empty
  std::function<void(Status)> done;
};

class PageMover {
 public:
  virtual ~PageMover() = default;
  virtual Status Submit(CopyJob job) = 0;
};

// memcpy of every run on a worker thread (kernels::CopyRunsHost).
std::unique_ptr<PageMover> CreateHostPageMover();

// Which engine copies GPU pages to and from the pool. kAuto follows kernels::ChooseCopyPath per
// phase (the plan-copy kernel for small runs, the copy engine for large ones). The kernel is
// fastest on an idle GPU but needs SMs: beside a model that fills every SM it starves
// (benchmarks/offload.md), where kCopyEngine (cudaMemcpyBatchAsync) keeps its bandwidth.
enum class DeviceCopy : uint8_t { kAuto, kKernel, kCopyEngine };
// "auto", "kernel", "copy-engine"; kInvalidArgument naming the value otherwise.
Result<DeviceCopy> ParseDeviceCopy(std::string_view name);

// Copies on a private non-blocking stream of `device`, by `how`; a completion thread waits on
// one event per phase. kUnsupported in builds without CUDA; kUnavailable when the device cannot
// be used.
Result<std::unique_ptr<PageMover>> CreateCudaPageMover(int device, DeviceCopy how);

}  // namespace kv::offload
