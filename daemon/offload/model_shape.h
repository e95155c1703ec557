// ModelCacheSpec: the layout of a KV cache given a model's numbers (layers, KV heads, head size,
// element bytes, tokens per block), for tools that size or time the pool from them.
#pragma once

#include <cstdint>
#include <string>

#include "layout/kv_region.h"

namespace kv::offload {

struct ModelShape {
  int64_t layers = 32, heads = 8, head_dim = 128, dtype_bytes = 2, block_size = 16;
};

// C packs K and V (2 · head_dim · dtype_bytes), or holds K alone (head_dim · dtype_bytes) when
// `order` has an S axis: either way a block holds the same bytes.
inline LayoutSpec ModelCacheSpec(const std::string& order, const ModelShape& m, int64_t blocks) {
  LayoutSpec s;
  s.order = order;
  s.layers = m.layers;
  s.blocks = blocks;
  s.heads = m.heads;
  s.block_size = m.block_size;
  const bool kv_axis = order.find('S') != std::string::npos;
  s.content_bytes = (kv_axis ? 1 : 2) * m.head_dim * m.dtype_bytes;
  return s;
}

}  // namespace kv::offload
