// Random KV cache layouts for kernel tests: every physical order vLLM uses, random sizes and
// random padding on the strides, so kernels are checked against the layout model rather than
// against one order.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "kernels/strided_kv.h"

namespace kv::kernels::testing {

struct RandomLayout {
  std::string order;  // with L, e.g. "LBNHC" or "LSBNHC"
  StridedKv kv;
};

// Orders outermost first. S-orders are vLLM's legacy (2, B, N, H, D) and (B, 2, N, H, D) tensors
// with L prepended.
inline const char* const kOrders[] = {"LBNHC", "LBHNC", "LHBNC",  "BLHNC",
                                      "BLNHC", "BHLNC", "LSBNHC", "LBSNHC"};

// Dense strides from `order`, each axis padded by a random multiple of `pad_quantum` bytes
// (0 to 3 quanta) when `padded`. C is innermost and contiguous.
inline RandomLayout MakeLayout(const std::string& order, int64_t layers, int64_t blocks,
                               int64_t heads, int64_t block_size, int64_t content_bytes,
                               std::mt19937_64& rng, bool padded, int64_t pad_quantum = 16) {
  RandomLayout out;
  out.order = order;
  StridedKv& kv = out.kv;
  kv.layers = layers;
  kv.blocks = blocks;
  kv.heads = heads;
  kv.block_size = block_size;
  kv.planes = order.find('S') != std::string::npos ? 2 : 1;
  kv.content_bytes = content_bytes;
  std::uniform_int_distribution<int64_t> pad(0, 3);
  int64_t inner = content_bytes;  // bytes spanned by everything inside the current axis
  for (int i = static_cast<int>(order.size()) - 2; i >= 0; --i) {
    const int64_t stride = inner + (padded ? pad(rng) * pad_quantum : 0);
    int64_t size = 0;
    switch (order[i]) {
      case 'L':
        kv.layer_stride = stride;
        size = layers;
        break;
      case 'B':
        kv.block_stride = stride;
        size = blocks;
        break;
      case 'H':
        kv.head_stride = stride;
        size = heads;
        break;
      case 'N':
        kv.token_stride = stride;
        size = block_size;
        break;
      case 'S':
        kv.plane_stride = stride;
        size = 2;
        break;
    }
    inner = stride * size;
  }
  kv.span_bytes = static_cast<uint64_t>(inner);
  return out;
}

inline RandomLayout RandomLayoutOf(std::mt19937_64& rng, int64_t content_bytes_packed,
                                   bool padded) {
  std::uniform_int_distribution<int> pick(0, 7);
  std::uniform_int_distribution<int64_t> small(1, 4);
  const std::string order = kOrders[pick(rng)];
  const bool planes = order.find('S') != std::string::npos;
  return MakeLayout(order, small(rng), 3 + small(rng) * 2, small(rng), 1 << small(rng),
                    planes ? content_bytes_packed / 2 : content_bytes_packed, rng, padded);
}

}  // namespace kv::kernels::testing
