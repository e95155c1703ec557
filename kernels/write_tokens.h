// Writing new tokens into pages: the contract of vLLM's reshape_and_cache_flash.
//
// K and V of T tokens, each laid out [T, H, D] (heads contiguous, D elements each; the token
// stride may be larger than H·D, as for a slice of a fused QKV tensor), go to the pages of one
// layer at slot ids: token t lands in block slots[t] / block_size at offset
// slots[t] % block_size. A negative slot skips the token (padding). Addressed only through the
// PagedKv strides, so any order, packed-C and S layouts alike. fp16 and bf16 are copied bit for
// bit; no conversion happens.
//
// Slots past the cache (≥ blocks·block_size) are kOutOfRange on the host; the kernel cannot see
// them before launch and skips them. Two tokens with the same slot race; the caller must not.
#pragma once

#include <cstdint>

#include "kernels/strided_kv.h"
#include "base/status.h"

namespace kv::kernels {

struct NewTokens {
  const void* key = nullptr;       // [tokens, heads, head_dim] elements of kv.dtype
  const void* value = nullptr;     // same shape
  const int64_t* slots = nullptr;  // [tokens]
  int64_t tokens = 0;
  int64_t key_token_stride = 0;    // elements between tokens; 0 means heads·head_dim
  int64_t value_token_stride = 0;  // likewise
};

Status WriteTokensHost(const PagedKv& kv, void* layer_base, const NewTokens& tokens);

// All pointers device-resident. Asynchronous on `stream`.
Status LaunchWriteTokens(const PagedKv& kv, void* layer_base, const NewTokens& tokens,
                         void* stream);

}  // namespace kv::kernels
