#include <cstring>
#include <string>

#include "kernels/write_tokens.h"

namespace kv::kernels {

Status WriteTokensHost(const PagedKv& kv, void* layer_base, const NewTokens& tokens) {
  if (tokens.tokens < 0) return Status::InvalidArgument("negative token count");
  if (tokens.tokens > 0 && (!tokens.key || !tokens.value || !tokens.slots)) {
    return Status::InvalidArgument("key, value and slots must be set");
  }
  const int64_t row = kv.heads * kv.head_dim;
  const int64_t key_stride = tokens.key_token_stride ? tokens.key_token_stride : row;
  const int64_t value_stride = tokens.value_token_stride ? tokens.value_token_stride : row;
  const int64_t capacity = kv.blocks * kv.block_size;
  for (int64_t t = 0; t < tokens.tokens; ++t) {
    if (tokens.slots[t] >= capacity) {
      return Status::OutOfRange("slot " + std::to_string(tokens.slots[t]) + " of token " +
                                std::to_string(t) + " outside the cache's " +
                                std::to_string(capacity) + " slots");
    }
  }
  auto* cache = static_cast<unsigned char*>(layer_base);
  const auto* key = static_cast<const unsigned char*>(tokens.key);
  const auto* value = static_cast<const unsigned char*>(tokens.value);
  const int64_t head_bytes = kv.head_dim * kDTypeBytes;
  for (int64_t t = 0; t < tokens.tokens; ++t) {
    const int64_t slot = tokens.slots[t];
    if (slot < 0) continue;
    const int64_t block = slot / kv.block_size, offset = slot % kv.block_size;
    for (int64_t h = 0; h < kv.heads; ++h) {
      unsigned char* at = cache + kv.token_offset(block, h, offset);
      std::memcpy(at + kv.k_offset, key + (t * key_stride + h * kv.head_dim) * kDTypeBytes,
                  head_bytes);
      std::memcpy(at + kv.v_offset, value + (t * value_stride + h * kv.head_dim) * kDTypeBytes,
                  head_bytes);
    }
  }
  return Status::Ok();
}

}  // namespace kv::kernels
