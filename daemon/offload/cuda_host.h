// The few CUDA runtime calls the pool needs, behind a plain C++ interface so that callers carry
// no #ifdef: builds without CUDA link cuda_host_stub.cc, which reports no device.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace kv::offload {

// Whether this process sees at least one CUDA device (false in builds without CUDA, and on
// machines without a driver or a device).
bool CudaDevicePresent();

// Page-locks [base, base + bytes) for DMA from every device and maps it for kernels: under
// unified addressing the host pointer itself is valid on the device (cudaHostRegister, portable).
// kUnsupported without CUDA; kUnavailable with the driver's message when registration fails.
Status CudaHostRegister(void* base, uint64_t bytes);
// Undoes CudaHostRegister(base, ...). Never fails: an error here only leaks the registration.
void CudaHostUnregister(void* base);

}  // namespace kv::offload
