#include "tools/kvbench/pd/pd_ceiling.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "layout/plan.h"
#include "layout/rank_pairs.h"

namespace kv::connector {
namespace {

using Clock = std::chrono::steady_clock;

// One pair of caches and the runs between them.
struct Copies {
  const char* src = nullptr;
  char* dst = nullptr;
  Plan plan;
};

}  // namespace

Result<CopyCeiling> MeasureCopyCeiling(std::span<const KvCache> prefill,
                                       std::span<const KvCache> decode,
                                       std::span<const std::vector<int64_t>> prefill_blocks,
                                       std::span<const std::vector<int64_t>> decode_blocks,
                                       int64_t tokens) {
  if (prefill_blocks.size() != decode_blocks.size())
    return Status::InvalidArgument("the copy ceiling needs as many prefill as decode block lists");
  std::vector<Copies> copies;
  CopyCeiling out;
  for (const KvCache& d : decode) {
    const KvRegion dst = RegionOf(d);
    for (const KvCache& p : prefill) {
      const KvRegion src = RegionOf(p);
      KV_ASSIGN_OR_RETURN(std::optional<RankPair> pair, PairOf(src, dst));
      if (!pair) continue;
      Copies c{static_cast<const char*>(p.base), static_cast<char*>(d.base), {}};
      for (size_t j = 0; j < prefill_blocks.size(); ++j) {
        TransferSpec spec{prefill_blocks[j], decode_blocks[j], tokens};
        KV_RETURN_IF_ERROR(PlanTransfer(src, dst, spec, &c.plan));
      }
      out.bytes += c.plan.bytes;
      out.runs += c.plan.runs.size();
      copies.push_back(std::move(c));
    }
  }
  if (out.bytes == 0) return out;
  auto round = [&] {
    const auto start = Clock::now();
    for (const Copies& c : copies) {
      for (const Run& r : c.plan.runs)
        std::memcpy(c.dst + r.dst_offset, c.src + r.src_offset, r.length);
    }
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  (void)round();  // warm-up: page tables, TLB
  std::vector<double> gbps;
  double spent = 0;
  while (gbps.size() < 3 || spent < 0.25) {
    const double seconds = round();
    spent += seconds;
    gbps.push_back(seconds > 0 ? static_cast<double>(out.bytes) / seconds / 1e9 : 0);
    if (gbps.size() >= 1000) break;
  }
  std::sort(gbps.begin(), gbps.end());
  out.gbps = gbps[gbps.size() / 2];
  out.rounds = static_cast<int>(gbps.size());
  return out;
}

}  // namespace kv::connector
