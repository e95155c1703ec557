// A byte-by-byte reference for the planner's contract, written from plan.h's words alone: it
// enumerates every copied byte as a (destination, source) pair and counts the maximal stretches
// that are contiguous on both sides. Only small cases: the work is O(bytes log bytes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "layout/kv_region.h"
#include "layout/plan.h"

namespace kv::testing {

// (destination offset, source offset) of one byte.
using BytePair = std::pair<uint64_t, uint64_t>;

// Local head holding global head g, from vLLM's rule, or -1.
inline int64_t HeldLocally(const LayoutSpec& s, int64_t g) {
  const int64_t total = s.total_heads;
  if (s.replicated) return g < s.heads ? g : -1;
  if (total >= s.tp_size) {
    const int64_t first = s.tp_rank * s.heads;
    return g >= first && g < first + s.heads ? g - first : -1;
  }
  return g == s.tp_rank * total / s.tp_size ? 0 : -1;
}

// Address of logical content byte c of (layer, block, local head, slot).
inline uint64_t ByteAddress(const KvRegion& r, int64_t l, int64_t b, int64_t h, int64_t n,
                            int64_t c) {
  const int64_t content = r.spec().content_bytes;
  if (r.has_kv_axis()) return r.offset(l, b, h, n, c / content) + c % content;
  return r.offset(l, b, h, n) + c;
}

// Every byte the transfer copies, sorted by destination.
inline std::vector<BytePair> ReferenceBytes(const KvRegion& src, const KvRegion& dst,
                                            const std::vector<int64_t>& src_blocks,
                                            const std::vector<int64_t>& dst_blocks, int64_t tokens,
                                            int64_t layer_begin, int64_t layer_end) {
  std::vector<BytePair> bytes;
  const int64_t ns = src.spec().block_size, nd = dst.spec().block_size;
  const int64_t total = src.spec().total_heads;
  for (int64_t l = layer_begin; l < layer_end; ++l) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t g = 0; g < total; ++g) {
        const int64_t hs = HeldLocally(src.spec(), g), hd = HeldLocally(dst.spec(), g);
        if (hs < 0 || hd < 0) continue;
        for (int64_t c = 0; c < src.logical_content_bytes(); ++c) {
          bytes.emplace_back(ByteAddress(dst, l, dst_blocks[t / nd], hd, t % nd, c),
                             ByteAddress(src, l, src_blocks[t / ns], hs, t % ns, c));
        }
      }
    }
  }
  std::sort(bytes.begin(), bytes.end());
  return bytes;
}

// Number of maximal stretches (d, s), (d+1, s+1), ... in bytes sorted by destination.
inline size_t CountStretches(const std::vector<BytePair>& bytes) {
  size_t stretches = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i == 0 || bytes[i].first != bytes[i - 1].first + 1 ||
        bytes[i].second != bytes[i - 1].second + 1)
      ++stretches;
  }
  return stretches;
}

// The bytes a plan copies, sorted by destination.
inline std::vector<BytePair> PlanBytes(const Plan& plan) {
  std::vector<BytePair> bytes;
  for (const Run& r : plan.runs)
    for (uint64_t i = 0; i < r.length; ++i) bytes.emplace_back(r.dst_offset + i, r.src_offset + i);
  std::sort(bytes.begin(), bytes.end());
  return bytes;
}

}  // namespace kv::testing
