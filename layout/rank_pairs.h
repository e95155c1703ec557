// Tensor-parallel rank pairing: which source (prefill) rank feeds which destination (decode) rank,
// and with which KV heads.
//
// A request moves, to every destination rank d and for every global KV head g that d holds, head
// g from exactly one source rank that holds it. Each side spreads its heads as
// KvRegion::global_head() says: split (total_heads >= tp_size: rank r holds [r·H, (r+1)·H)),
// replicated heads (total_heads < tp_size: rank r holds the one head r·total/tp, so tp/total
// ranks hold each head) or a replicated cache (MLA: every rank holds every head). Where several
// source ranks hold g, destination d takes it from holder number d mod (number of holders): the
// destinations spread over the copies round-robin, and a replicated cache's destination d reads
// from source rank d mod tp_size. The heads one source rank sends one destination rank are then
// always one contiguous range, and exactly the heads the two ranks share, or none: a pair that
// moves anything moves all they share, so the planner can plan it whole (layout/plan.h).
//
// Pure functions, no I/O; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "layout/kv_region.h"
#include "base/status.h"

namespace kv {

// How one side spreads its KV heads over its ranks: LayoutSpec's TP fields, without a rank.
struct TpShape {
  int tp_size = 1;
  int64_t total_heads = 1;
  bool replicated = false;  // MLA-style: every rank holds every head
  static TpShape Of(const KvRegion& region);
};

// Source rank `src_rank` sends destination rank `dst_rank` the global heads
// [first_head, first_head + heads), heads > 0.
struct RankPair {
  int src_rank = 0;
  int dst_rank = 0;
  int64_t first_head = 0;
  int64_t heads = 0;
  bool operator==(const RankPair&) const = default;
};

// Every pair that moves something, ordered by destination rank, then source rank. Errors:
// kInvalidArgument for a shape KvRegion would refuse (tp_size or total_heads below 1, a split
// whose total is not a multiple of tp_size, replicated heads whose tp_size is not a multiple of
// the total), kIncompatible when the two sides' total head counts differ.
Result<std::vector<RankPair>> PairRanks(const TpShape& src, const TpShape& dst);

// What the source region's rank sends the destination region's rank (their spec().tp_rank):
// the same pair PairRanks lists for them, or nullopt when the source rank feeds that destination
// nothing. O(1). kIncompatible when the total head counts differ.
Result<std::optional<RankPair>> PairOf(const KvRegion& src, const KvRegion& dst);

}  // namespace kv
