// Builds without CUDA: no device, nothing to pin.
#include "daemon/offload/cuda_host.h"

namespace kv::offload {

bool CudaDevicePresent() {
  return false;
}

Status CudaHostRegister(void*, uint64_t) {
  return Status::Unsupported("this build of kvd has no CUDA support");
}

void CudaHostUnregister(void*) {}

}  // namespace kv::offload
