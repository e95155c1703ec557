#include "transport/cuda_ipc/run_copier.h"

#include "transport/cuda_ipc/cuda_util.h"

namespace kv::transport::gpu {
namespace {

// Under lazy module loading (the default since CUDA 12.2) a kernel is loaded at its first
// launch, and loading may synchronise the whole context: the first Copy() would then block the
// caller until every stream of the device drains, including the engine's, and would deadlock
// against work that waits for the caller (a post_after() gate the caller is yet to release).
// One real copy here, on a private stream, pays that load while nothing else is waiting on us.
Status LoadCopyKernel(int device, kernels::PlanCopier& kernel) {
  KV_ASSIGN_OR_RETURN(DeviceBuffer scratch, DeviceBuffer::Allocate(device, 32));
  KV_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(device));
  const Run run{0, 16, 16};
  char* base = static_cast<char*>(scratch.data());
  KV_RETURN_IF_ERROR(kernel.Copy(base, base, std::span<const Run>(&run, 1), stream.get()));
  return CudaStatus(cudaStreamSynchronize(stream.get()), "loading the plan copy kernel");
}

}  // namespace

Result<std::unique_ptr<RunCopier>> RunCopier::Create(int device,
                                                     std::optional<kernels::CopyPath> forced) {
  DeviceGuard guard(device);
  KV_ASSIGN_OR_RETURN(auto kernel, kernels::PlanCopier::Create());
  KV_RETURN_IF_ERROR(LoadCopyKernel(device, *kernel));
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
