// libFuzzer target: the transfer planner's inputs (layout/plan.h, layout/rank_pairs.h), as a
// peer's hello and Want hand them to kvd: two layouts (any order, sizes, padded strides, TP rank,
// size and heads), block id lists, a token count and a layer range. For what the planner accepts
// it checks what the headers promise:
//  - PairRanks: pairs ordered by destination then source, each moving heads > 0 that both ranks
//    hold, every head of every destination rank from exactly one source; PairOf agrees.
//  - PlanTransfer: runs in ascending, non-overlapping destination order, inside both regions'
//    spans (ValidateRuns), bytes their sum; on small cases exactly the bytes of the byte-by-byte
//    reference (tests/support/plan_reference.h) in the minimum number of runs.
//  - LayerPlan, with and without groups: each layer's expansion is PlanTransfer's [l, l+1).
//  - GroupRuns/ExpandGroups give the runs back; ValidateGroups/ValidateRuns on arbitrary runs
//    and groups: accepted ones lie inside the bounds.
// A broken promise aborts (a crash for libFuzzer), as do ASan and UBSan reports.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "layout/kv_region.h"
#include "layout/plan.h"
#include "layout/rank_pairs.h"
#include "tests/support/plan_reference.h"

namespace {

#define FUZZ_CHECK(cond)                                                                      \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: planner promise broken: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

kv::LayoutSpec MakeSpec(FuzzedDataProvider& in) {
  kv::LayoutSpec s;
  std::string axes = "LBHN";
  for (size_t i = axes.size(); i > 1; --i) {  // a permutation of L, B, H, N
    std::swap(axes[i - 1], axes[in.ConsumeIntegralInRange<size_t>(0, i - 1)]);
  }
  if (in.ConsumeBool()) axes.insert(in.ConsumeIntegralInRange<size_t>(0, axes.size()), "S");
  if (in.ConsumeIntegralInRange(0, 7) == 0) axes.erase(axes.find('L'), 1);  // legacy, L implied
  s.order = axes + "C";
  if (in.ConsumeIntegralInRange(0, 31) == 0) s.order = in.ConsumeRandomLengthString(8);
  s.layers = in.ConsumeIntegralInRange<int64_t>(0, 5);
  s.blocks = in.ConsumeIntegralInRange<int64_t>(0, 17);
  s.heads = in.ConsumeIntegralInRange<int64_t>(0, 5);
  s.block_size = in.ConsumeIntegralInRange<int64_t>(0, 33);
  s.content_bytes = in.ConsumeIntegralInRange<int64_t>(0, 40);
  if (in.ConsumeBool()) {
    for (auto& stride : s.strides) {
      stride = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int64_t>(-1, 1 << 20);
    }
  }
  s.tp_size = in.ConsumeIntegralInRange(0, 9);
  s.tp_rank = in.ConsumeIntegralInRange(-1, 9);
  s.total_heads = in.ConsumeIntegralInRange<int64_t>(0, 17);
  s.replicated = in.ConsumeIntegralInRange(0, 3) == 0;
  if (in.ConsumeIntegralInRange(0, 7) == 0) {
    s.region_bytes = in.ConsumeIntegralInRange<int64_t>(-1, 1 << 22);
  }
  return s;
}

std::vector<int64_t> MakeBlocks(FuzzedDataProvider& in, int64_t blocks) {
  std::vector<int64_t> ids(in.ConsumeIntegralInRange<size_t>(0, 40));
  for (auto& id : ids) id = in.ConsumeIntegralInRange<int64_t>(-1, blocks);  // blocks: outside
  return ids;
}

void CheckPairs(const kv::KvRegion& src, const kv::KvRegion& dst) {
  const kv::TpShape s = kv::TpShape::Of(src), d = kv::TpShape::Of(dst);
  auto pairs = kv::PairRanks(s, d);
  if (!pairs.ok()) return;
  for (size_t i = 1; i < pairs->size(); ++i) {
    const auto& a = (*pairs)[i - 1];
    const auto& b = (*pairs)[i];
    FUZZ_CHECK(a.dst_rank < b.dst_rank || (a.dst_rank == b.dst_rank && a.src_rank < b.src_rank));
  }
  // Every destination rank's heads come from exactly one source each (replicated heads and
  // caches: the destination holds [first, first + count) of the global heads).
  for (int rank = 0; rank < d.tp_size; ++rank) {
    int64_t first = 0, count = d.total_heads;
    if (!d.replicated) {
      if (d.total_heads >= d.tp_size) {
        count = d.total_heads / d.tp_size;
        first = rank * count;
      } else {
        first = int64_t{rank} * d.total_heads / d.tp_size;
        count = 1;
      }
    }
    std::vector<int> cover(static_cast<size_t>(count), 0);
    for (const auto& p : *pairs) {
      if (p.dst_rank != rank) continue;
      FUZZ_CHECK(p.heads > 0 && p.src_rank >= 0 && p.src_rank < s.tp_size);
      for (int64_t g = p.first_head; g < p.first_head + p.heads; ++g) {
        FUZZ_CHECK(g >= first && g < first + count);
        ++cover[static_cast<size_t>(g - first)];
      }
    }
    for (int c : cover) FUZZ_CHECK(c == 1);
  }
  auto one = kv::PairOf(src, dst);
  FUZZ_CHECK(one.ok());
  const auto listed = std::find_if(pairs->begin(), pairs->end(), [&](const kv::RankPair& p) {
    return p.src_rank == src.spec().tp_rank && p.dst_rank == dst.spec().tp_rank;
  });
  FUZZ_CHECK(one->has_value() == (listed != pairs->end()));
  if (one->has_value()) FUZZ_CHECK(**one == *listed);
}

void CheckPlan(const kv::KvRegion& src, const kv::KvRegion& dst, const kv::TransferSpec& spec,
               const kv::Plan& plan) {
  FUZZ_CHECK(plan.groups.empty() && plan.group_rows == 0);
  FUZZ_CHECK(kv::ValidateRuns(plan.runs, src.span_bytes(), dst.span_bytes()).ok());
  uint64_t bytes = 0;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    FUZZ_CHECK(plan.runs[i].length > 0);
    bytes += plan.runs[i].length;
    if (i > 0) {
      const auto& prev = plan.runs[i - 1];
      FUZZ_CHECK(prev.dst_offset + prev.length <= plan.runs[i].dst_offset);
    }
  }
  FUZZ_CHECK(bytes == plan.bytes);
  std::vector<kv::RunGroup> groups;
  kv::GroupRuns(plan.runs, &groups);
  std::vector<kv::Run> expanded;
  kv::ExpandGroups(groups, &expanded);
  FUZZ_CHECK(expanded == plan.runs);
  FUZZ_CHECK(kv::ValidateGroups(groups, src.span_bytes(), dst.span_bytes()).ok());
  if (plan.bytes > (1u << 16)) return;
  const int64_t layers = src.spec().layers;
  const int64_t end = spec.layer_end < 0 ? layers : spec.layer_end;
  const std::vector<int64_t> sb(spec.src_blocks.begin(), spec.src_blocks.end());
  const std::vector<int64_t> db(spec.dst_blocks.begin(), spec.dst_blocks.end());
  const auto want =
      kv::testing::ReferenceBytes(src, dst, sb, db, spec.tokens, spec.layer_begin, end);
  FUZZ_CHECK(kv::testing::PlanBytes(plan) == want);
  FUZZ_CHECK(plan.runs.size() == kv::testing::CountStretches(want));
}

void CheckLayerPlans(const kv::KvRegion& src, const kv::KvRegion& dst,
                     const kv::TransferSpec& spec) {
  for (kv::PlanEntries entries :
       {kv::PlanEntries::kRuns, kv::PlanEntries::kGroups, kv::PlanEntries::kGroupBlocks}) {
    auto layer_plan = kv::LayerPlan::Create(src, dst, spec, entries);
    FUZZ_CHECK(layer_plan.ok());
    for (int64_t l = 0; l < src.spec().layers; ++l) {
      kv::Plan mine;
      FUZZ_CHECK(layer_plan->AppendLayer(l, &mine).ok());
      kv::TransferSpec one = spec;
      one.layer_begin = l;
      one.layer_end = l + 1;
      auto theirs = kv::PlanTransfer(src, dst, one);
      FUZZ_CHECK(theirs.ok());
      FUZZ_CHECK(entries == kv::PlanEntries::kGroupBlocks || mine.blocks.empty());
      FUZZ_CHECK(mine.groups.empty() || mine.blocks.empty());  // a layer is one or the other
      std::vector<kv::RunGroup> groups = mine.groups;
      kv::ExpandBlocks(mine.blocks, &groups);
      std::vector<kv::Run> rows = mine.runs;
      kv::ExpandGroups(groups, &rows);
      FUZZ_CHECK(rows == theirs->runs);
      FUZZ_CHECK(mine.bytes == theirs->bytes && mine.run_count() == theirs->run_count());
      FUZZ_CHECK(kv::ValidateGroups(mine.groups, src.span_bytes(), dst.span_bytes()).ok());
      FUZZ_CHECK(kv::ValidateBlocks(mine.blocks, src.span_bytes(), dst.span_bytes()).ok());
    }
    kv::Plan outside;
    FUZZ_CHECK(!layer_plan->AppendLayer(src.spec().layers, &outside).ok());
    FUZZ_CHECK(outside.runs.empty() && outside.groups.empty() && outside.blocks.empty());
  }
}

// Runs and groups as a peer could send them: accepted ones must lie inside the bounds.
void CheckValidators(FuzzedDataProvider& in) {
  const uint64_t src_bytes = in.ConsumeIntegral<uint64_t>() >> in.ConsumeIntegralInRange(0, 63);
  const uint64_t dst_bytes = in.ConsumeIntegral<uint64_t>() >> in.ConsumeIntegralInRange(0, 63);
  std::vector<kv::Run> runs(in.ConsumeIntegralInRange<size_t>(0, 4));
  for (auto& r : runs) {
    r = {in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint64_t>(),
         in.ConsumeIntegral<uint64_t>()};
  }
  auto inside = [&](const kv::Run& r) {
    return r.length <= src_bytes && r.src_offset <= src_bytes - r.length && r.length <= dst_bytes &&
           r.dst_offset <= dst_bytes - r.length;
  };
  if (kv::ValidateRuns(runs, src_bytes, dst_bytes).ok()) {
    for (const auto& r : runs) FUZZ_CHECK(inside(r));
  }
  std::vector<kv::RunGroup> groups(in.ConsumeIntegralInRange<size_t>(0, 3));
  for (auto& g : groups) {
    g = {in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint64_t>(),
         in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint64_t>(),
         in.ConsumeIntegral<int64_t>(),  in.ConsumeIntegral<int64_t>()};
  }
  if (kv::ValidateGroups(groups, src_bytes, dst_bytes).ok()) {
    for (const auto& g : groups) {
      FUZZ_CHECK(g.count > 0);
      FUZZ_CHECK(inside(g.row(0)) && inside(g.row(g.count - 1)));
      if (g.count <= 64) {
        for (uint64_t i = 0; i < g.count; ++i) FUZZ_CHECK(inside(g.row(i)));
      }
    }
  }
  // Blocks of those groups: every row of every block inside, blocks clear of each other.
  std::vector<kv::GroupBlocks> blocks;
  for (const auto& g : groups) {
    blocks.push_back({g, in.ConsumeIntegral<uint64_t>() >> in.ConsumeIntegralInRange(0, 63),
                      in.ConsumeIntegral<int64_t>(), in.ConsumeIntegral<int64_t>()});
  }
  if (kv::ValidateBlocks(blocks, src_bytes, dst_bytes).ok()) {
    for (const auto& b : blocks) {
      FUZZ_CHECK(b.outer_count > 0 && b.group.count > 0);
      for (uint64_t o : {uint64_t{0}, b.outer_count - 1}) {
        const kv::RunGroup g = b.block(o);
        FUZZ_CHECK(inside(g.row(0)) && inside(g.row(g.count - 1)));
      }
      if (b.outer_count * b.group.count <= 64 && b.outer_count <= 64 && b.group.count <= 64) {
        for (uint64_t o = 0; o < b.outer_count; ++o) {
          for (uint64_t i = 0; i < b.group.count; ++i) FUZZ_CHECK(inside(b.block(o).row(i)));
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeIntegralInRange(0, 15) == 0) {
    CheckValidators(in);
    return 0;
  }
  const kv::LayoutSpec src_spec = MakeSpec(in);
  const kv::LayoutSpec dst_spec = MakeSpec(in);
  auto src = kv::KvRegion::Create(src_spec);
  auto dst = kv::KvRegion::Create(dst_spec);
  if (!src.ok() || !dst.ok()) return 0;
  FUZZ_CHECK(kv::KvRegion::Create(src->spec()).ok());  // a region's spec() makes it again
  CheckPairs(*src, *dst);
  const std::vector<int64_t> src_blocks = MakeBlocks(in, src->spec().blocks);
  const std::vector<int64_t> dst_blocks = MakeBlocks(in, dst->spec().blocks);
  kv::TransferSpec spec;
  spec.src_blocks = src_blocks;
  spec.dst_blocks = dst_blocks;
  spec.tokens = in.ConsumeIntegralInRange<int64_t>(-1, 200);
  spec.layer_begin = in.ConsumeIntegralInRange<int64_t>(-1, 5);
  spec.layer_end = in.ConsumeIntegralInRange<int64_t>(-1, 6);
  auto plan = kv::PlanTransfer(*src, *dst, spec);
  if (!plan.ok()) return 0;
  CheckPlan(*src, *dst, spec, *plan);
  kv::Plan appended;
  appended.runs.push_back({});  // PlanTransfer appends after what is there, never joining
  appended.bytes = 0;
  FUZZ_CHECK(kv::PlanTransfer(*src, *dst, spec, &appended).ok());
  FUZZ_CHECK(appended.runs.size() == plan->runs.size() + 1 && appended.bytes == plan->bytes);
  FUZZ_CHECK(std::equal(plan->runs.begin(), plan->runs.end(), appended.runs.begin() + 1));
  CheckLayerPlans(*src, *dst, spec);
  return 0;
}
