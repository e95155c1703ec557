// What the nccl backend's host tests share (nccl_wire_test.cc, nccl_batch_test.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "layout/kv_region.h"
#include "layout/plan.h"
#include "transport/nccl/wire.h"

namespace kv::transport::nccl {

// Every row of `entries`, in order, as runs: `src_side` gives the sender's view (offsets in
// src_offset), else the receiver's (in dst_offset).
inline std::vector<kv::Run> RowsOf(std::span<const Strided> entries, bool src_side) {
  std::vector<kv::Run> rows;
  for (const Strided& e : entries) {
    for (uint64_t o = 0; o < e.outer_count; ++o) {
      const Strided b = e.block(o);
      for (uint64_t i = 0; i < b.count; ++i) {
        const uint64_t at = b.offset + i * static_cast<uint64_t>(b.stride);
        rows.push_back(src_side ? kv::Run{at, 0, b.length} : kv::Run{0, at, b.length});
      }
    }
  }
  return rows;
}

// A page of 8 heads of 512 B per token; rank `tp_rank` of `tp_size` holds its share of them.
inline KvRegion PageRegion(const std::string& order, int64_t blocks, int tp_size = 1,
                           int tp_rank = 0) {
  LayoutSpec s;
  s.order = order;
  s.layers = 2;
  s.block_size = 16;
  s.blocks = blocks;
  s.heads = 8 / tp_size;
  s.total_heads = 8;
  s.tp_size = tp_size;
  s.tp_rank = tp_rank;
  s.content_bytes = 512;
  return KvRegion::Create(s).value();
}

// Block ids 0..blocks-1 shuffled on each side (kvbench's --block-ids random) for a request of
// 16 tokens a block.
struct RandomBlocks {
  RandomBlocks(int64_t blocks, uint64_t seed) : src(blocks), dst(blocks) {
    std::iota(src.begin(), src.end(), 0);
    std::iota(dst.begin(), dst.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(src.begin(), src.end(), rng);
    std::shuffle(dst.begin(), dst.end(), rng);
  }
  TransferSpec spec() const { return {src, dst, static_cast<int64_t>(src.size()) * 16}; }
  std::vector<int64_t> src, dst;
};

// kvbench's LBNHC -> BLHNC request of `blocks` shuffled blocks (a page's 8 heads land 16 rows
// apart): the conversion the nccl tests plan their groups and blocks of groups from.
struct Conversion {
  Conversion(int64_t blocks, uint64_t seed)
      : src(PageRegion("LBNHC", blocks)), dst(PageRegion("BLHNC", blocks)), ids(blocks, seed) {}
  // Layers [begin, end) planned as `entries` (a LayerPlan), appended to *plan.
  Status Append(PlanEntries entries, int64_t begin, int64_t end, Plan* plan) const {
    KV_ASSIGN_OR_RETURN(LayerPlan layer, LayerPlan::Create(src, dst, ids.spec(), entries));
    return layer.AppendLayers(begin, end, plan);
  }
  KvRegion src, dst;
  RandomBlocks ids;
};

}  // namespace kv::transport::nccl
