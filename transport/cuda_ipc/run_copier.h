// Executes plan runs on a CUDA stream through the kernels' chooser: the plan-copy kernel (one
// launch for the whole run table; small scattered runs) or the copy engine (few large runs).
// The GPU backends use it for direct peer copies, and for gathering runs into / scattering runs
// out of a staging buffer (a gather is a plan whose destination offsets are packed).
//
// Not thread-safe: one RunCopier per thread, or a lock around it.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <span>

#include "kernels/plan_copy.h"
#include "layout/plan.h"
#include "layout/status.h"

namespace kv::transport::gpu {

class RunCopier {
 public:
  // Allocates the kernel's run table on `device` and runs one tiny copy to completion, so that
  // the kernel is loaded here and Copy() never blocks the caller (see run_copier.cc). `forced`
  // overrides the chooser (for tuning and benchmarks); nullopt lets it pick per copy.
  static Result<std::unique_ptr<RunCopier>> Create(
      int device, std::optional<kernels::CopyPath> forced = std::nullopt);

  // Enqueues the copy of every run from src_base + src_offset to dst_base + dst_offset. Runs
  // must already be validated against both buffers.
  Status Copy(const void* src_base, void* dst_base, std::span<const Run> runs,
              kernels::CopyDirection direction, cudaStream_t stream);

  // The path the last Copy() took; for benchmarks and logs.
  kernels::CopyPath last_path() const { return last_path_; }

 private:
  RunCopier(std::unique_ptr<kernels::PlanCopier> kernel, std::optional<kernels::CopyPath> forced)
      : kernel_(std::move(kernel)), forced_(forced) {}
  std::unique_ptr<kernels::PlanCopier> kernel_;
  std::optional<kernels::CopyPath> forced_;
  kernels::CopyPath last_path_ = kernels::CopyPath::kKernel;
};

}  // namespace kv::transport::gpu
