// The token-writing kernel (reshape_and_cache_flash's contract). Contract: write_tokens.h.
#include "kernels/cuda_util.cuh"
#include "kernels/write_tokens.h"

namespace kv::kernels {
namespace {

constexpr int kThreads = 256;

// One warp per (token, head): K and V of the head, head_dim·2 bytes each.
__global__ void __launch_bounds__(kThreads)
    WriteTokensKernel(PagedKv kv, unsigned char* cache, const unsigned char* key,
                      const unsigned char* value, const int64_t* slots, int64_t tokens,
                      int64_t key_stride, int64_t value_stride) {
  const int lane = threadIdx.x & 31;
  const int64_t item = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (item >= tokens * kv.heads) return;
  const int64_t t = item / kv.heads, h = item % kv.heads;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= kv.blocks * kv.block_size) return;
  unsigned char* at = cache + kv.token_offset(slot / kv.block_size, h, slot % kv.block_size);
  const int64_t bytes = kv.head_dim * kDTypeBytes;
  detail::WarpCopy(key + (t * key_stride + h * kv.head_dim) * kDTypeBytes, at + kv.k_offset, bytes,
                   lane);
  detail::WarpCopy(value + (t * value_stride + h * kv.head_dim) * kDTypeBytes, at + kv.v_offset,
                   bytes, lane);
}

}  // namespace

Status LaunchWriteTokens(const PagedKv& kv, void* layer_base, const NewTokens& tokens,
                         void* stream) {
  if (tokens.tokens < 0) return Status::InvalidArgument("negative token count");
  if (tokens.tokens == 0) return Status::Ok();
  if (!tokens.key || !tokens.value || !tokens.slots) {
    return Status::InvalidArgument("key, value and slots must be set");
  }
  const int64_t row = kv.heads * kv.head_dim;
  const int64_t items = tokens.tokens * kv.heads;
  const int64_t ctas = (items + kThreads / 32 - 1) / (kThreads / 32);
  // The grid's x limit; past it the cast below would launch a smaller grid and skip tokens.
  if (ctas > INT32_MAX) return Status::Unsupported("write-tokens launch of over 2^31 CTAs");
  WriteTokensKernel<<<static_cast<unsigned>(ctas), kThreads, 0,
                      static_cast<cudaStream_t>(stream)>>>(
      kv, static_cast<unsigned char*>(layer_base), static_cast<const unsigned char*>(tokens.key),
      static_cast<const unsigned char*>(tokens.value), tokens.slots, tokens.tokens,
      tokens.key_token_stride ? tokens.key_token_stride : row,
      tokens.value_token_stride ? tokens.value_token_stride : row);
  return detail::LaunchStatus("write-tokens kernel");
}

}  // namespace kv::kernels
