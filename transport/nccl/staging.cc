#include "transport/nccl/staging.h"

namespace kv::transport::nccl {

Result<std::unique_ptr<StagingPipeline>> StagingPipeline::Create(int device, uint64_t slot_bytes) {
  auto p = std::make_unique<StagingPipeline>();
  KV_ASSIGN_OR_RETURN(p->copy_stream, gpu::CudaStream::Create(device));
  KV_ASSIGN_OR_RETURN(p->nccl_stream, gpu::CudaStream::Create(device));
  KV_ASSIGN_OR_RETURN(p->copier, gpu::RunCopier::Create(device));
  for (Slot& slot : p->slots) {
    KV_ASSIGN_OR_RETURN(slot.buffer, gpu::DeviceBuffer::Allocate(device, slot_bytes));
    KV_ASSIGN_OR_RETURN(slot.filled, gpu::CudaEvent::Create(device));
    KV_ASSIGN_OR_RETURN(slot.drained, gpu::CudaEvent::Create(device));
  }
  return p;
}

uint64_t ChunkLength(const std::vector<Run>& chunk) {
  uint64_t n = 0;
  for (const Run& r : chunk) n += r.length;
  return n;
}

Status WaitOn(cudaStream_t stream, const gpu::CudaEvent& event) {
  return gpu::CudaStatus(cudaStreamWaitEvent(stream, event.get(), 0), "cudaStreamWaitEvent");
}

}  // namespace kv::transport::nccl
