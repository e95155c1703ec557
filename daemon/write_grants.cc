#include "daemon/write_grants.h"

#include <algorithm>
#include <atomic>

#include "transport/intervals.h"

namespace kv::daemon {

std::vector<transport::Transport::WriteRange> BlockWriteRanges(const KvRegion& layout,
                                                               std::span<const int64_t> blocks) {
  // The axes outside B in the physical order (outermost first), and the extent of one block
  // inside them: its last byte + 1 from its first.
  const std::string& order = layout.order();
  std::vector<Axis> outer;
  uint64_t extent = 1;
  bool inside = false;
  for (char name : order) {
    const auto axis = AxisFromName(name);
    if (!axis) continue;
    if (*axis == Axis::kB) {
      inside = true;
      continue;
    }
    if (inside) {
      extent += static_cast<uint64_t>((layout.size(*axis) - 1) * layout.stride(*axis));
    } else if (layout.size(*axis) > 1) {
      outer.push_back(*axis);
    }
  }
  // The blocks in ascending order, so that each outer index's spans come out sorted, and where
  // the outer axes are outermost in memory too (the usual layer-first and blocks-first caches)
  // all of them: SortAndMerge then merges in one pass instead of sorting layers x blocks spans.
  // Each Want's grant is made before it leaves: for 4 layers x 256 random blocks this and the
  // transport's grant took 67 us of the 135 the decode kvd spent on a wave's first Want on the
  // dev VM, 30 since (benchmarks/pd.md, "start-up hops").
  std::vector<int64_t> sorted(blocks.begin(), blocks.end());
  std::sort(sorted.begin(), sorted.end());
  size_t outer_count = 1;
  for (Axis axis : outer) outer_count *= static_cast<size_t>(layout.size(axis));
  std::vector<transport::Interval> spans;
  spans.reserve(outer_count * sorted.size());
  std::vector<int64_t> index(outer.size(), 0);
  while (true) {
    uint64_t base = 0;
    for (size_t i = 0; i < outer.size(); ++i) {
      base += static_cast<uint64_t>(index[i] * layout.stride(outer[i]));
    }
    for (int64_t b : sorted) {
      const uint64_t at = base + static_cast<uint64_t>(b * layout.stride(Axis::kB));
      spans.emplace_back(at, at + extent);
    }
    // The next index of the outer axes, innermost fastest.
    size_t i = outer.size();
    while (i > 0 && ++index[i - 1] == layout.size(outer[i - 1])) index[--i] = 0;
    if (i == 0) break;
  }
  transport::SortAndMerge(spans);
  std::vector<transport::Transport::WriteRange> ranges;
  ranges.reserve(spans.size());
  for (const auto& [first, end] : spans) ranges.push_back({first, end - first});
  return ranges;
}

Result<uint64_t> GrantLoadWrites(transport::Transport& transport, transport::PeerId peer,
                                 const std::map<int, LoadRank>& ranks) {
  if (!transport.checks_write_grants()) return uint64_t{0};
  static std::atomic<uint64_t> next{1};
  const uint64_t grant = next++;
  for (const auto& [r, rank] : ranks) {
    for (const auto& region : rank.regions) {
      if (region->where.kind != MemoryKind::kHost || !region->registration) continue;
      const auto ranges = BlockWriteRanges(region->layout, rank.blocks);
      Status s = transport.grant_writes(grant, peer, *region->registration, ranges);
      if (!s.ok()) {
        transport.revoke_writes(grant);
        return s.WithContext("granting the source writes into rank " + std::to_string(r));
      }
    }
  }
  return grant;
}

}  // namespace kv::daemon
