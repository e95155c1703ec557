// A random paged decode-attention problem on the host, shared by the CPU and GPU tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/decode_attention.h"
#include "kernels/half.h"
#include "tests/support/random_layout.h"

namespace kv::kernels::testing {

struct AttentionProblem {
  RandomLayout layout;
  PagedKv paged;
  int64_t layer = 0;
  std::vector<unsigned char> cache;  // the whole region; values in [-1, 1]
  std::vector<uint16_t> query;
  std::vector<int32_t> block_table;
  std::vector<int32_t> seq_lens;
  DecodeAttentionArgs args;  // pointers into this object's vectors (not out)

  const unsigned char* layer_base() const { return cache.data() + layer * layout.kv.layer_stride; }
};

// seq_lens drawn from [0, max_len]; the first sequence always has max_len tokens. Blocks of each
// sequence are distinct random blocks of the cache.
inline AttentionProblem MakeAttentionProblem(std::mt19937_64& rng, const std::string& order,
                                             int64_t head_dim, int64_t kv_heads, int64_t group,
                                             int64_t block_size, int64_t num_seqs, int64_t max_len,
                                             DType dtype, bool padded) {
  AttentionProblem p;
  const int64_t blocks_per_seq = (max_len + block_size - 1) / block_size;
  const int64_t blocks = std::max<int64_t>(blocks_per_seq * 2, 4);
  const bool planes = order.find('S') != std::string::npos;
  const int64_t c = (planes ? 1 : 2) * head_dim * kDTypeBytes;
  p.layout = MakeLayout(order, 2, blocks, kv_heads, block_size, c, rng, padded);
  p.paged = *SplitKv(p.layout.kv, head_dim, dtype);
  p.layer = 1;
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  p.cache.resize(p.layout.kv.span_bytes);
  for (size_t i = 0; i + 1 < p.cache.size(); i += 2) StoreElement(&p.cache[i], dtype, value(rng));
  const int64_t q_heads = kv_heads * group;
  p.query.resize(num_seqs * q_heads * head_dim);
  for (auto& e : p.query) StoreElement(&e, dtype, value(rng));
  p.block_table.resize(num_seqs * blocks_per_seq);
  std::vector<int32_t> ids(blocks);
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t b = 0; b < blocks; ++b) ids[b] = static_cast<int32_t>(b);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int64_t b = 0; b < blocks_per_seq; ++b) p.block_table[s * blocks_per_seq + b] = ids[b];
    p.seq_lens.push_back(s == 0 ? max_len : static_cast<int32_t>(rng() % (max_len + 1)));
  }
  p.args.query = p.query.data();
  p.args.block_table = p.block_table.data();
  p.args.block_table_stride = blocks_per_seq;
  p.args.seq_lens = p.seq_lens.data();
  p.args.num_seqs = num_seqs;
  p.args.num_q_heads = q_heads;
  p.args.max_seq_len = max_len;
  p.args.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return p;
}

}  // namespace kv::kernels::testing
