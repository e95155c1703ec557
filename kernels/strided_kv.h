// How kernels see a KV cache: sizes and byte strides per axis, nothing else.
//
// A StridedKv is the plain-data image of a KvRegion (layout/kv_region.h) that can be passed by
// value into a CUDA kernel. Because every kernel addresses memory only through these strides,
// one kernel serves every physical order (LBNHC, BLHNC, LHBNC, SBNHC, ...) and any padding.
// PagedKv is one layer of it seen through the virtual K/V split: where K and V of a
// (block, head, token) start, relative to the layer's base address.
//
// Both are values without ownership; they never point at memory. Thread-safe to share.
#pragma once

#include <cstdint>

#include "layout/kv_region.h"
#include "base/status.h"

#if defined(__CUDACC__)
#define KV_HOST_DEVICE __host__ __device__
#else
#define KV_HOST_DEVICE
#endif

namespace kv::kernels {

// Element type of K, V, queries and outputs. Both are two bytes; they differ only in arithmetic.
enum class DType : uint8_t { kFloat16 = 0, kBFloat16 = 1 };
inline constexpr int64_t kDTypeBytes = 2;
const char* DTypeName(DType dtype);

struct StridedKv {
  int64_t layers = 0;
  int64_t blocks = 0;
  int64_t heads = 0;
  int64_t block_size = 0;     // tokens per block (N)
  int64_t planes = 1;         // the S axis: 2 when K and V are separate planes, else 1
  int64_t content_bytes = 0;  // C: contiguous bytes of one (l, b, h, n, s)
  int64_t layer_stride = 0;   // byte strides
  int64_t block_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;
  int64_t plane_stride = 0;
  uint64_t span_bytes = 0;  // bytes from the base that hold every element

  KV_HOST_DEVICE uint64_t offset(int64_t l, int64_t b, int64_t h, int64_t n, int64_t s) const {
    return static_cast<uint64_t>(l * layer_stride + b * block_stride + h * head_stride +
                                 n * token_stride + s * plane_stride);
  }
};

// The kernel view of `region`. The region is already validated by KvRegion::Create.
StridedKv DescribeRegion(const KvRegion& region);

// Checks what KvRegion::Create would: positive sizes, non-negative strides, span covering every
// element. Used where a StridedKv is built by hand (tests, benchmarks) rather than from a region.
Status ValidateStridedKv(const StridedKv& kv);

// One layer of a cache, K and V found through the virtual split.
struct PagedKv {
  int64_t blocks = 0;
  int64_t heads = 0;
  int64_t block_size = 0;
  int64_t head_dim = 0;  // elements of K (== of V) per head-token
  int64_t block_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;
  int64_t k_offset = 0;  // bytes from the layer base to K of (0, 0, 0)
  int64_t v_offset = 0;  // bytes from the layer base to V of (0, 0, 0)
  DType dtype = DType::kFloat16;
  uint64_t layer_span_bytes = 0;  // bytes from the layer base that the view may touch

  KV_HOST_DEVICE int64_t token_offset(int64_t b, int64_t h, int64_t n) const {
    return b * block_stride + h * head_stride + n * token_stride;
  }
};

// K and V of every layer as halves of C (packed: C = 2·head_dim·2 bytes) or as the two planes
// (S axis: C = head_dim·2 bytes). kInvalidArgument when C matches neither for `head_dim`.
// The layer base for layer l is `region_base + l * kv.layer_stride`.
Result<PagedKv> SplitKv(const StridedKv& kv, int64_t head_dim, DType dtype);

}  // namespace kv::kernels
