// A stream held on the device until the host releases it: for tests whose mover completes its
// copies through CUDA host functions (staged), which a held host function would block too.
#pragma once

#include <cuda_runtime_api.h>

namespace kv::transport::gputest {

// Enqueues on `stream` a one-thread kernel that returns once `*released` (mapped pinned memory,
// seen through `released_device`) is non-zero, or after 60 s.
cudaError_t LaunchHold(const volatile int* released_device, cudaStream_t stream);

}  // namespace kv::transport::gputest
