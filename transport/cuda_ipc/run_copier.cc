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
  Lanes lanes;
  KV_ASSIGN_OR_RETURN(lanes.fork, CudaEvent::Create(device));
  for (int i = 0; i < kEngineLanes; ++i) {
    KV_ASSIGN_OR_RETURN(CudaStream lane, CudaStream::Create(device));
    KV_ASSIGN_OR_RETURN(CudaEvent join, CudaEvent::Create(device));
    lanes.streams.push_back(std::move(lane));
    lanes.joins.push_back(std::move(join));
  }
  return std::unique_ptr<RunCopier>(new RunCopier(std::move(kernel), std::move(lanes), forced));
}

Status RunCopier::Copy(const void* src_base, void* dst_base, std::span<const Run> runs,
                       kernels::CopyDirection direction, cudaStream_t stream) {
  if (runs.empty()) return Status::Ok();
  last_path_ = forced_ ? *forced_ : kernels::ChooseCopyPath(runs, direction, stream);
  if (last_path_ == kernels::CopyPath::kKernel) {
    return kernel_->Copy(src_base, dst_base, runs, stream);
  }
  if (direction == kernels::CopyDirection::kPeer && stream != nullptr) {
    return CopyOnLanes(src_base, dst_base, runs, stream);
  }
  return kernels::LaunchBatchCopy(src_base, dst_base, runs, stream);
}

// Lane i takes a contiguous slice of the runs holding about 1/kEngineLanes of the bytes. The
// events are reused by every copy: cudaStreamWaitEvent binds to the record made before it, so a
// later copy's records do not disturb an earlier copy's waits.
Status RunCopier::CopyOnLanes(const void* src_base, void* dst_base, std::span<const Run> runs,
                              cudaStream_t stream) {
  uint64_t total = 0;
  for (const Run& run : runs) total += run.length;
  KV_RETURN_IF_ERROR(lanes_.fork.Record(stream));
  size_t at = 0;
  uint64_t done = 0;
  for (int lane = 0; lane < kEngineLanes && at < runs.size(); ++lane) {
    const uint64_t share = total / kEngineLanes * (lane + 1);
    size_t end = at;
    while (end < runs.size() && (done < share || lane + 1 == kEngineLanes)) {
      done += runs[end++].length;
    }
    cudaStream_t s = lanes_.streams[lane].get();
    KV_RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(s, lanes_.fork.get(), 0), "cudaStreamWaitEvent"));
    KV_RETURN_IF_ERROR(kernels::LaunchBatchCopy(src_base, dst_base, runs.subspan(at, end - at), s));
    KV_RETURN_IF_ERROR(lanes_.joins[lane].Record(s));
    KV_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(stream, lanes_.joins[lane].get(), 0),
                                  "cudaStreamWaitEvent"));
    at = end;
  }
  return Status::Ok();
}

}  // namespace kv::transport::gpu
