// Gather and scatter: pack the pages (or head slices of pages) of a block list into one
// contiguous staging buffer, and unpack them back. NCCL transfers and host staging use these.
//
// The staging buffer is dense in the order [block i][layer][head][token][plane][C], where i
// indexes `blocks`, layers are [layer_begin, layer_end) and heads [head_begin, head_end). So the
// bytes of one block are contiguous in staging whatever the cache's physical order.
//
// Block ids out of [0, kv.blocks) are an error on the host (kOutOfRange, nothing copied). On the
// device the ids are not visible to the launcher: the kernel skips out-of-range ids, leaving
// their staging bytes untouched; validate ids on the host before launching.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/strided_kv.h"
#include "base/status.h"

namespace kv::kernels {

struct PageSlice {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // -1: every layer
  int64_t head_begin = 0;
  int64_t head_end = -1;  // -1: every head
};

// The slice with -1s resolved; kInvalidArgument when a range is empty or outside the cache.
Result<PageSlice> ResolveSlice(const StridedKv& kv, const PageSlice& slice);
// Bytes of staging that `num_blocks` blocks of `slice` take. kInvalidArgument as ResolveSlice.
Result<uint64_t> StagingBytes(const StridedKv& kv, const PageSlice& slice, int64_t num_blocks);

// CPU references: the contract.
Status GatherHost(const StridedKv& kv, const void* base, std::span<const int64_t> blocks,
                  const PageSlice& slice, void* staging);
Status ScatterHost(const StridedKv& kv, void* base, std::span<const int64_t> blocks,
                   const PageSlice& slice, const void* staging);

// The kernels: `device_blocks` holds num_blocks ids in device memory. Asynchronous on stream.
Status LaunchGather(const StridedKv& kv, const void* base, const int64_t* device_blocks,
                    int64_t num_blocks, const PageSlice& slice, void* staging, void* stream);
Status LaunchScatter(const StridedKv& kv, void* base, const int64_t* device_blocks,
                     int64_t num_blocks, const PageSlice& slice, const void* staging, void* stream);

}  // namespace kv::kernels
