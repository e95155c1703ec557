#include "gpu/ipc_event.h"

#include <cstring>

namespace kv::gpu {

Result<CudaEvent> CreateShareableEvent(int device) {
  return CudaEvent::Create(device, /*interprocess=*/true);
}

Result<std::string> ExportEvent(const CudaEvent& event) {
  cudaIpcEventHandle_t handle{};
  cudaError_t err = cudaIpcGetEventHandle(&handle, event.get());
  if (err == cudaErrorInvalidResourceHandle || err == cudaErrorInvalidValue) {
    return Status::InvalidArgument(
        "event cannot be exported: create it with CreateShareableEvent (interprocess, no timing)");
  }
  KV_RETURN_IF_ERROR(CudaStatus(err, "cudaIpcGetEventHandle"));
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

Result<CudaEvent> ImportEvent(std::string_view handle, int device) {
  if (handle.size() != sizeof(cudaIpcEventHandle_t)) {
    return Status::InvalidArgument("event handle has " + std::to_string(handle.size()) +
                                   " bytes, expected " +
                                   std::to_string(sizeof(cudaIpcEventHandle_t)));
  }
  cudaIpcEventHandle_t raw{};
  std::memcpy(&raw, handle.data(), sizeof(raw));
  DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  KV_RETURN_IF_ERROR(CudaStatus(cudaIpcOpenEventHandle(&event, raw), "cudaIpcOpenEventHandle"));
  return CudaEvent::Adopt(event, device);
}

Status StreamWaitEvent(cudaStream_t stream, const CudaEvent& event) {
  return CudaStatus(cudaStreamWaitEvent(stream, event.get(), 0), "cudaStreamWaitEvent");
}

}  // namespace kv::gpu
