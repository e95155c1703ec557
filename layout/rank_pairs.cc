#include "layout/rank_pairs.h"

#include <algorithm>
#include <string>

namespace kv {
namespace {

struct Range {
  int64_t first = 0;
  int64_t count = 0;
};

// The global heads rank `rank` holds (KvRegion::global_head()).
Range HeadsOf(const TpShape& s, int rank) {
  if (s.replicated) return {0, s.total_heads};
  if (s.total_heads >= s.tp_size) {
    const int64_t per_rank = s.total_heads / s.tp_size;
    return {rank * per_rank, per_rank};
  }
  return {int64_t{rank} * s.total_heads / s.tp_size, 1};
}

// The ranks that hold global head g, a contiguous range in every case.
Range HoldersOf(const TpShape& s, int64_t g) {
  if (s.replicated) return {0, s.tp_size};
  if (s.total_heads >= s.tp_size) return {g / (s.total_heads / s.tp_size), 1};
  const int64_t copies = s.tp_size / s.total_heads;
  return {g * copies, copies};
}

Status CheckShape(const TpShape& s, const char* side) {
  const std::string what = std::string(side) + " TP shape (tp_size " + std::to_string(s.tp_size) +
                           ", total_heads " + std::to_string(s.total_heads) + ")";
  if (s.tp_size < 1 || s.total_heads < 1) return Status::InvalidArgument(what + ": below 1");
  if (s.replicated) return Status::Ok();
  if (s.total_heads >= s.tp_size ? s.total_heads % s.tp_size != 0
                                 : s.tp_size % s.total_heads != 0) {
    return Status::InvalidArgument(what + ": one count must be a multiple of the other");
  }
  return Status::Ok();
}

Status CheckTotals(const TpShape& src, const TpShape& dst) {
  if (src.total_heads == dst.total_heads) return Status::Ok();
  return Status::Incompatible("different total head counts: source " +
                              std::to_string(src.total_heads) + ", destination " +
                              std::to_string(dst.total_heads));
}

// The heads src_rank sends dst_rank: those both hold of which src_rank is the chosen holder. The
// choice depends on the head only through its holder range, which is one range for every head
// src_rank holds (a split rank is the only holder of each; a replicated-heads rank holds one
// head; a replicated cache's holders are all ranks), so the result is all shared heads or none.
std::optional<RankPair> Pair(const TpShape& src, int src_rank, const TpShape& dst, int dst_rank) {
  const Range s = HeadsOf(src, src_rank);
  const Range d = HeadsOf(dst, dst_rank);
  const int64_t first = std::max(s.first, d.first);
  const int64_t end = std::min(s.first + s.count, d.first + d.count);
  if (first >= end) return std::nullopt;
  const Range holders = HoldersOf(src, first);
  if (holders.first + dst_rank % holders.count != src_rank) return std::nullopt;
  return RankPair{src_rank, dst_rank, first, end - first};
}

}  // namespace

TpShape TpShape::Of(const KvRegion& region) {
  return {region.spec().tp_size, region.total_heads(), region.spec().replicated};
}

Result<std::vector<RankPair>> PairRanks(const TpShape& src, const TpShape& dst) {
  KV_RETURN_IF_ERROR(CheckShape(src, "source"));
  KV_RETURN_IF_ERROR(CheckShape(dst, "destination"));
  KV_RETURN_IF_ERROR(CheckTotals(src, dst));
  std::vector<RankPair> pairs;
  for (int d = 0; d < dst.tp_size; ++d) {
    for (int s = 0; s < src.tp_size; ++s) {
      if (auto pair = Pair(src, s, dst, d)) pairs.push_back(*pair);
    }
  }
  return pairs;
}

Result<std::optional<RankPair>> PairOf(const KvRegion& src, const KvRegion& dst) {
  const TpShape s = TpShape::Of(src), d = TpShape::Of(dst);
  KV_RETURN_IF_ERROR(CheckTotals(s, d));
  return Pair(s, src.spec().tp_rank, d, dst.spec().tp_rank);
}

}  // namespace kv
