// The small host cache the C API tests register, and where its pages lie.
#pragma once

#include "connector/kv_connector.h"

namespace kv::c_api_test {

// 2 layers × 8 blocks × 2 heads × 4 tokens × 16 B, LBNHC: a block is 128 bytes per layer, a
// layer 1024.
inline kv_layout SmallCLayout() {
  kv_layout l{};
  l.order = "LBNHC";
  l.layers = 2;
  l.blocks = 8;
  l.heads = 2;
  l.block_size = 4;
  l.content_bytes = 16;
  l.tp_size = 1;
  return l;
}

// The bytes of (layer, block) in a cache of SmallCLayout().
inline char* SmallPage(void* base, int layer, int block) {
  return static_cast<char*>(base) + layer * 1024 + block * 128;
}

}  // namespace kv::c_api_test
