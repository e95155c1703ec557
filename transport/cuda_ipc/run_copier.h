// Executes plan runs on a CUDA stream through the kernels' chooser: the plan-copy kernel (one
// launch for the whole run table; small scattered runs) or the copy engine (few large runs).
// The GPU backends use it for direct peer copies, and for gathering runs into / scattering runs
// out of a staging buffer (a gather is a plan whose destination offsets are packed).
//
// Not thread-safe: one RunCopier per thread, or a lock around it.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <span>

#include "kernels/plan_copy.h"
#include "layout/plan.h"
#include "layout/status.h"

namespace kv::transport::gpu {

class RunCopier {
 public:
  // Allocates the kernel's run table on `device`.
  static Result<std::unique_ptr<RunCopier>> Create(int device);

  // Enqueues the copy of every run from src_base + src_offset to dst_base + dst_offset. Runs
  // must already be validated against both buffers.
  Status Copy(const void* src_base, void* dst_base, std::span<const Run> runs,
              kernels::CopyDirection direction, cudaStream_t stream);

  // The path the last Copy() took; for benchmarks and logs.
  kernels::CopyPath last_path() const { return last_path_; }

 private:
  explicit RunCopier(std::unique_ptr<kernels::PlanCopier> kernel) : kernel_(std::move(kernel)) {}
  std::unique_ptr<kernels::PlanCopier> kernel_;
  kernels::CopyPath last_path_ = kernels::CopyPath::kKernel;
};

}  // namespace kv::transport::gpu
