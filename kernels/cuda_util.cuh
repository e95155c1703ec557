// Internal to the kernels' .cu files: CUDA errors as kv::Status, and the warp-wide byte copy that
// plan copy, gather/scatter and token writes share. Not a public header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "base/status.h"

namespace kv::kernels::detail {

inline Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  std::string message = std::string(what) + ": " + cudaGetErrorString(error);
  if (error == cudaErrorMemoryAllocation) return Status::ResourceExhausted(std::move(message));
  if (error == cudaErrorInvalidValue) return Status::InvalidArgument(std::move(message));
  return Status::Internal(std::move(message));
}

// The error of the launch just made (bad configuration, no device), not of the kernel's run.
inline Status LaunchStatus(const char* what) {
  return CudaStatus(cudaGetLastError(), what);
}

// Multiprocessors of the current device.
inline Result<int> SmCount() {
  int device = 0, sms = 0;
  KV_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  KV_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count"));
  return sms;
}

// Copies n bytes with the 32 lanes of a warp: the widest access (16, 8, 4 or 1 bytes) that the
// relative alignment of src and dst allows, a byte head up to that alignment, a byte tail, and
// kUnroll independent loads in flight per lane so one warp keeps enough bytes moving.
template <typename V>
__device__ __forceinline__ void CopyWidth(const unsigned char* src, unsigned char* dst, uint64_t n,
                                          int lane) {
  constexpr int kWidth = sizeof(V);
  constexpr int kUnroll = kWidth >= 8 ? 8 : 16;
  static_assert(kWidth >= 4, "bytes go through WarpCopyBytes");
  uint64_t head = (kWidth - (reinterpret_cast<uintptr_t>(src) & (kWidth - 1))) & (kWidth - 1);
  if (head > n) head = n;
  if (lane < head) dst[lane] = src[lane];
  src += head;
  dst += head;
  n -= head;
  const uint64_t vectors = n / kWidth;
  const V* vs = reinterpret_cast<const V*>(src);
  V* vd = reinterpret_cast<V*>(dst);
  uint64_t i = lane;
  for (; i + 32 * (kUnroll - 1) < vectors; i += 32 * kUnroll) {
    V r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = vs[i + 32 * u];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) vd[i + 32 * u] = r[u];
  }
  for (; i < vectors; i += 32) vd[i] = vs[i];
  for (uint64_t b = vectors * kWidth + lane; b < n; b += 32) dst[b] = src[b];
}

__device__ __forceinline__ void WarpCopyBytes(const unsigned char* src, unsigned char* dst,
                                              uint64_t n, int lane) {
  constexpr int kUnroll = 8;
  uint64_t i = lane;
  for (; i + 32 * (kUnroll - 1) < n; i += 32 * kUnroll) {
    unsigned char r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = src[i + 32 * u];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + 32 * u] = r[u];
  }
  for (; i < n; i += 32) dst[i] = src[i];
}

__device__ __forceinline__ void WarpCopy(const unsigned char* src, unsigned char* dst, uint64_t n,
                                         int lane) {
  const uintptr_t skew = reinterpret_cast<uintptr_t>(src) ^ reinterpret_cast<uintptr_t>(dst);
  if ((skew & 15) == 0 && n >= 64) {
    CopyWidth<uint4>(src, dst, n, lane);
  } else if ((skew & 7) == 0 && n >= 32) {
    CopyWidth<uint2>(src, dst, n, lane);
  } else if ((skew & 3) == 0 && n >= 16) {
    CopyWidth<uint32_t>(src, dst, n, lane);
  } else {
    WarpCopyBytes(src, dst, n, lane);
  }
}

}  // namespace kv::kernels::detail
