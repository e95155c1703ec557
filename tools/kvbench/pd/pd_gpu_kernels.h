// The CUDA kernels of the P/D simulator's GPU engines (pd_gpu.h): K/V and queries generated
// from connector/pd_pattern.h, the byte check of a loaded layer, guard-block counting and the
// stand-in for a layer's forward pass. Every launch is asynchronous on `stream` and returns the
// launch's error only; pointers are device memory of the stream's device. Built only with CUDA.
#pragma once

#include <cstdint>

#include "kernels/strided_kv.h"
#include "base/status.h"

namespace kv::connector::gpu {

// Which (request, layer, heads) a kernel generates or checks: global heads [head0, head0 +
// kv.heads) of the rank, `tokens` tokens.
struct PatternSlice {
  uint64_t seed = 0;
  int64_t layer = 0;
  int64_t head0 = 0;
  int64_t tokens = 0;
};

// K and V of the slice as [tokens, kv.heads, kv.head_dim] bf16: pattern::FiniteBf16 of
// pattern::Element of each row.
Status LaunchGenerateKv(const kernels::PagedKv& kv, const PatternSlice& slice, uint16_t* key,
                        uint16_t* value, void* stream);

// The decode query of (seed, layer) for query heads [q_head0, q_head0 + q_heads), [q_heads,
// head_dim] bf16.
Status LaunchGenerateQuery(uint64_t seed, int64_t layer, int64_t q_head0, int64_t q_heads,
                           int64_t head_dim, uint16_t* query, void* stream);

// Adds to *mismatches the elements of K and V of the slice that differ from the pattern, token
// t read at block block_table[t / kv.block_size] of the layer at `layer_base`.
Status LaunchCheckKv(const kernels::PagedKv& kv, const void* layer_base, const int32_t* block_table,
                     const PatternSlice& slice, unsigned long long* mismatches, void* stream);

// Adds to *count the non-zero K/V bytes of blocks [first_block, kv.blocks) of every layer.
Status LaunchCountNonZero(const kernels::StridedKv& kv, const kernels::PagedKv& layer,
                          const void* base, int64_t first_block, unsigned long long* count,
                          void* stream);

// Occupies the stream for `nanoseconds` (one thread: the time of a forward pass, not its load).
Status LaunchWait(int64_t nanoseconds, void* stream);

}  // namespace kv::connector::gpu
