#include "transport/cuda_ipc/run_copier.h"

#include "transport/cuda_ipc/cuda_util.h"

namespace kv::transport::gpu {

Result<std::unique_ptr<RunCopier>> RunCopier::Create(int device,
                                                     std::optional<kernels::CopyPath> forced) {
  DeviceGuard guard(device);
  KV_ASSIGN_OR_RETURN(auto kernel, kernels::PlanCopier::Create());
  return std::unique_ptr<RunCopier>(new RunCopier(std::move(kernel), forced));
}

Status RunCopier::Copy(const void* src_base, void* dst_base, std::span<const Run> runs,
                       kernels::CopyDirection direction, cudaStream_t stream) {
  if (runs.empty()) return Status::Ok();
  last_path_ = forced_ ? *forced_ : kernels::ChooseCopyPath(runs, direction, stream);
  if (last_path_ == kernels::CopyPath::kCopyEngine) {
    return kernels::LaunchBatchCopy(src_base, dst_base, runs, stream);
  }
  return kernel_->Copy(src_base, dst_base, runs, stream);
}

}  // namespace kv::transport::gpu
