// Random run groups, and entries of repeated groups, for the plan-copy tests: disjoint on the
// destination, any strides (zero and negative included) on the source.
#pragma once

#include <algorithm>
#include <random>
#include <vector>

#include "layout/plan.h"

namespace kv::testing {

// Groups inside [0, src_bytes) and [0, dst_bytes): each takes a span of the destination of its
// own, rows `length` apart or more (so rows never overlap there), forwards or backwards. With
// `aligned`, offsets, strides and lengths are multiples of 16. Shuffled.
inline std::vector<RunGroup> RandomGroups(std::mt19937_64& rng, uint64_t src_bytes,
                                          uint64_t dst_bytes, uint64_t max_len, bool aligned) {
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  const uint64_t unit = aligned ? 16 : 1;
  std::vector<RunGroup> groups;
  for (uint64_t at = pick(0, 40) * unit;;) {
    RunGroup g;
    g.length = std::max<uint64_t>(1, pick(1, max_len) / unit) * unit;
    g.count = pick(1, 3) == 1 ? 1 : pick(2, 40);
    const uint64_t dst_step = g.length + pick(0, 3) * unit;
    if (at + g.length > dst_bytes) break;
    g.count = std::min(g.count, (dst_bytes - at - g.length) / dst_step + 1);
    const uint64_t span = dst_step * (g.count - 1) + g.length;
    const bool back = pick(0, 1) == 1;
    g.dst_offset = back ? at + span - g.length : at;
    g.dst_stride = back ? -static_cast<int64_t>(dst_step) : static_cast<int64_t>(dst_step);
    // The source: any stride whose rows fit, from repeating one row to spreading over it all.
    const uint64_t room = src_bytes - g.length;
    const uint64_t src_step = g.count == 1 ? 0 : pick(0, room / (g.count - 1)) / unit * unit;
    const uint64_t src_span = src_step * (g.count - 1);
    const uint64_t first = pick(0, (room - src_span) / unit) * unit;
    const bool src_back = pick(0, 1) == 1;
    g.src_offset = src_back ? first + src_span : first;
    g.src_stride = src_back ? -static_cast<int64_t>(src_step) : static_cast<int64_t>(src_step);
    groups.push_back(g);
    at += span + pick(0, 40) * unit;
  }
  std::shuffle(groups.begin(), groups.end(), rng);
  return groups;
}

// Entries of repeated groups inside [0, src_bytes) and [0, dst_bytes): each takes a span of the
// destination of its own, rows `length` apart or more and blocks a block's extent apart or more
// (so nothing overlaps there), each stride forwards or backwards; one block, or several. With
// `aligned`, offsets, strides and lengths are multiples of 16. Shuffled.
inline std::vector<GroupBlocks> RandomBlocks(std::mt19937_64& rng, uint64_t src_bytes,
                                             uint64_t dst_bytes, uint64_t max_len, bool aligned) {
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  auto signed_step = [&](uint64_t step, bool back) {
    return back ? -static_cast<int64_t>(step) : static_cast<int64_t>(step);
  };
  const uint64_t unit = aligned ? 16 : 1;
  std::vector<GroupBlocks> entries;
  for (uint64_t at = pick(0, 40) * unit;;) {
    GroupBlocks e;
    RunGroup& g = e.group;
    g.length = std::max<uint64_t>(1, pick(1, max_len) / unit) * unit;
    g.count = pick(1, 3) == 1 ? 1 : pick(2, 24);
    e.outer_count = pick(1, 3) == 1 ? 1 : pick(2, 9);
    const uint64_t step = g.length + pick(0, 3) * unit;
    uint64_t span = step * (g.count - 1) + g.length;  // a block on the destination
    uint64_t outer_step = span + pick(0, 3) * unit;
    uint64_t extent = outer_step * (e.outer_count - 1) + span;
    if (at + extent > dst_bytes) {  // one row, once, or nothing more fits
      g.count = e.outer_count = 1;
      span = outer_step = extent = g.length;
      if (at + extent > dst_bytes) break;
    }
    const bool back = pick(0, 1) == 1, outer_back = pick(0, 1) == 1;
    g.dst_stride = signed_step(step, back);
    e.dst_outer_stride = signed_step(outer_step, outer_back);
    g.dst_offset = at + (back ? span - g.length : 0) + (outer_back ? extent - span : 0);
    // The source: any strides whose rows fit, from repeating one row to spreading over it all.
    const uint64_t room = src_bytes - g.length;
    const uint64_t src_step = g.count == 1 ? 0 : pick(0, room / 2 / (g.count - 1)) / unit * unit;
    const uint64_t src_span = src_step * (g.count - 1);
    const uint64_t src_outer =
        e.outer_count == 1 ? 0 : pick(0, (room - src_span) / (e.outer_count - 1)) / unit * unit;
    const uint64_t src_outer_span = src_outer * (e.outer_count - 1);
    const uint64_t first = pick(0, (room - src_span - src_outer_span) / unit) * unit;
    const bool src_back = pick(0, 1) == 1, src_outer_back = pick(0, 1) == 1;
    g.src_stride = signed_step(src_step, src_back);
    e.src_outer_stride = signed_step(src_outer, src_outer_back);
    g.src_offset = first + (src_back ? src_span : 0) + (src_outer_back ? src_outer_span : 0);
    entries.push_back(e);
    at += extent + pick(0, 40) * unit;
  }
  std::shuffle(entries.begin(), entries.end(), rng);
  return entries;
}

}  // namespace kv::testing
