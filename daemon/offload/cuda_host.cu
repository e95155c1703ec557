#include <cuda_runtime.h>

#include <string>

#include "daemon/offload/cuda_host.h"

namespace kv::offload {

bool CudaDevicePresent() {
  int count = 0;
  // A machine without a driver answers with an error, which means "no device" here.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

Status CudaHostRegister(void* base, uint64_t bytes) {
  cudaError_t err =
      cudaHostRegister(base, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable("cudaHostRegister of " + std::to_string(bytes) +
                               " bytes failed: " + cudaGetErrorString(err));
  }
  return Status::Ok();
}

void CudaHostUnregister(void* base) {
  if (cudaHostUnregister(base) != cudaSuccess) cudaGetLastError();
}

}  // namespace kv::offload
