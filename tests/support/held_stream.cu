#include "tests/support/held_stream.h"

namespace kv::transport::gputest {
namespace {

__global__ void HoldKernel(const volatile int* released, unsigned long long max_ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (*released == 0 && now - start < max_ns);
}

}  // namespace

cudaError_t LaunchHold(const volatile int* released_device, cudaStream_t stream) {
  HoldKernel<<<1, 1, 0, stream>>>(released_device, 60ull * 1000 * 1000 * 1000);
  return cudaGetLastError();
}

}  // namespace kv::transport::gputest
