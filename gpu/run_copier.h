// Executes plan runs on a CUDA stream through the kernels' chooser: the plan-copy kernel (one
// launch for the whole run table; small scattered runs) or the copy engine (few large runs).
// The GPU backends use it for direct peer copies, and for gathering runs into / scattering runs
// out of a staging buffer (a gather is a plan whose destination offsets are packed).
//
// Peer copies by the copy engine go in pieces of at most 2 MiB; copies of 64 MiB or more are also
// spread over kEngineLanes streams of the copier's own, forked from and joined back into the
// caller's stream on the device (benchmarks/gpu.md, run 3), so the copy is still ordered on the
// caller's stream like any other work there.
//
// Not thread-safe: one RunCopier per thread, or a lock around it.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "gpu/cuda_util.h"
#include "kernels/plan_copy.h"
#include "layout/plan.h"

namespace kv::gpu {

class RunCopier {
 public:
  static constexpr int kEngineLanes = 4;

  // Allocates the kernel's run table and the engine lanes on `device` and runs one tiny copy to
  // completion, so that the kernel is loaded here and Copy() never blocks the caller (see
  // run_copier.cc). `forced` overrides the chooser (for tuning and benchmarks); nullopt lets it
  // pick per copy.
  static Result<std::unique_ptr<RunCopier>> Create(
      int device, std::optional<kernels::CopyPath> forced = std::nullopt);

  // Enqueues the copy of every run from src_base + src_offset to dst_base + dst_offset. Runs
  // must already be validated against both buffers. `stream` must belong to `device`.
  Status Copy(const void* src_base, void* dst_base, std::span<const Run> runs,
              kernels::CopyDirection direction, cudaStream_t stream);

  // The same for the rows of `groups`: the group kernel, or, where the chooser (or `forced`)
  // takes the copy engine for rows this long, the rows expanded into Copy().
  Status CopyGroups(const void* src_base, void* dst_base, std::span<const RunGroup> groups,
                    kernels::CopyDirection direction, cudaStream_t stream);
  // The same for block entries (layout/plan.h GroupBlocks): the block kernel, or the rows
  // expanded into Copy() where the copy engine is taken.
  Status CopyBlocks(const void* src_base, void* dst_base, std::span<const GroupBlocks> entries,
                    kernels::CopyDirection direction, cudaStream_t stream);

  // The path the last Copy() took; for benchmarks and logs.
  kernels::CopyPath last_path() const { return last_path_; }

 private:
  // The path for rows of `bytes` in all: `forced_`, else the chooser's for their mean length;
  // recorded as last_path_.
  kernels::CopyPath ChoosePath(uint64_t bytes, uint64_t rows, kernels::CopyDirection direction,
                               cudaStream_t stream);
  struct Lanes {
    std::vector<CudaStream> streams;
    CudaEvent fork;
    std::vector<CudaEvent> joins;
  };
  RunCopier(std::unique_ptr<kernels::PlanCopier> kernel, Lanes lanes,
            std::optional<kernels::CopyPath> forced)
      : kernel_(std::move(kernel)), lanes_(std::move(lanes)), forced_(forced) {}
  Status CopyOnLanes(const void* src_base, void* dst_base, std::span<const Run> runs,
                     cudaStream_t stream);

  std::unique_ptr<kernels::PlanCopier> kernel_;
  Lanes lanes_;
  std::optional<kernels::CopyPath> forced_;
  kernels::CopyPath last_path_ = kernels::CopyPath::kKernel;
  std::vector<Run> lane_runs_;    // CopyOnLanes' scratch
  std::vector<Run> rows_;         // CopyGroups' and CopyBlocks' scratch for the copy engine
  std::vector<RunGroup> groups_;  // CopyBlocks' scratch for the copy engine
};

}  // namespace kv::gpu
