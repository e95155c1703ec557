// PageMover: executes the copies of the offload pool, one queue per memory the engine pages
// live in (host memory, or one CUDA device).
//
// A CopyJob is a list of phases, each a table of planned runs (layout/plan.h) from src_base to
// dst_base. Phases exist so a load can report each layer as soon as its bytes landed ("per-layer
// waits"); a store is one phase. Jobs run in submission order.
//
// A job starts as soon as it is submitted: a copy that must wait for an engine's kernels is
// submitted only once they are done (OffloadPool's gate), never made to wait on the device, where
// an engine that died mid-layer would leave the mover's stream blocked for good.
//
// Threading: Submit() is thread-safe and never waits for the GPU: it only enqueues. on_phase and
// done run on the mover's own thread, in order, and must not block; done runs exactly once per
// accepted job. Destruction finishes every accepted job first.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "layout/plan.h"
#include "base/status.h"

namespace kv::offload {

struct CopyJob {
  const std::byte* src_base = nullptr;
  std::byte* dst_base = nullptr;

  std::vector<std::vector<Run>> phases;        // checked against both buffers by the caller
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

// Which engine copies GPU pages to and from the pool. The plan-copy kernel is as fast as the copy
// engine on an idle GPU but needs SMs: beside a model that fills every SM it starves
// (benchmarks/offload.md), while the copy engine (cudaMemcpyBatchAsync) keeps its bandwidth and
// leaves the SMs to the model. Every pool copy crosses PCIe, so kAuto takes the copy engine
// unless the phase's runs are so small (mean under kOffloadCopyEngineMinRun) that its
// per-descriptor cost dominates; then the kernel.
enum class DeviceCopy : uint8_t { kAuto, kKernel, kCopyEngine };
inline constexpr uint64_t kOffloadCopyEngineMinRun = 16 << 10;
// "auto", "kernel", "copy-engine"; kInvalidArgument naming the value otherwise.
Result<DeviceCopy> ParseDeviceCopy(std::string_view name);

struct CudaMoverOptions {
  DeviceCopy how = DeviceCopy::kAuto;
  // Copy-engine phases go to the driver in batches of this many runs, so the engine starts on
  // the first batch while the driver takes in the next (benchmarks/offload.md).
  int dma_slice_runs = 512;
  // A phase that has not landed this long after the previous one did fails its job with
  // kTimeout, and the mover refuses further jobs (its stream is stuck): the copy may still land
  // later, so the caller must not reuse what it was writing (see OffloadPool).
  std::chrono::milliseconds timeout{30000};
};

// Copies on a private non-blocking stream of `device`; a completion thread polls one pooled event
// per phase, with `options.timeout` as its deadline. kUnsupported in builds without CUDA;
// kUnavailable when the device cannot be used; kInvalidArgument for bad options.
Result<std::unique_ptr<PageMover>> CreateCudaPageMover(int device, const CudaMoverOptions& options);

}  // namespace kv::offload
