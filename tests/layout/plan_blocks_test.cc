// Blocks of run groups: joining round trips, LayerPlan's blocks for LBNHC -> BLHNC, bounds checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "layout/kv_region.h"
#include "layout/plan.h"

namespace kv {
namespace {

std::vector<RunGroup> Expanded(const std::vector<GroupBlocks>& blocks) {
  std::vector<RunGroup> groups;
  ExpandBlocks(blocks, &groups);
  return groups;
}

TEST(GroupBlocksTest, JoinGroupsExpandsBackAndKeepsBlocksApart) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<RunGroup> groups;
    // Stretches of one shape at a random step (some overlapping on the destination), broken by
    // another shape; each group's own rows apart on the destination, as ValidateGroups asks.
    while (groups.size() < 200) {
      const uint64_t length = rng() % 3 + 1, count = rng() % 4 + 1, blocks = rng() % 5 + 1;
      const int64_t ss = static_cast<int64_t>(rng() % 9) - 4;
      const int64_t ds = static_cast<int64_t>(length + rng() % 4) * (rng() % 2 ? 1 : -1);
      const int64_t outer_s = static_cast<int64_t>(rng() % 99) - 49;
      const int64_t outer_d = static_cast<int64_t>(rng() % 60) - 20;
      const uint64_t src = rng() % 1000 + 1000, dst = rng() % 1000 + 1000;
      for (uint64_t o = 0; o < blocks; ++o) {
        groups.push_back({src + o * static_cast<uint64_t>(outer_s),
                          dst + o * static_cast<uint64_t>(outer_d), length, count, ss, ds});
      }
    }
    std::vector<GroupBlocks> blocks{{{9, 9, 9, 1, 0, 0}, 1, 0, 0}};  // appended behind it
    const size_t added = JoinGroups(groups, &blocks);
    ASSERT_EQ(added, blocks.size() - 1);
    blocks.erase(blocks.begin());
    ASSERT_EQ(Expanded(blocks), groups);
    for (const GroupBlocks& b : blocks) {
      if (b.outer_count < 2) continue;
      // No two rows of an entry meet on the destination.
      std::vector<std::pair<uint64_t, uint64_t>> spans;
      for (uint64_t o = 0; o < b.outer_count; ++o) {
        const RunGroup g = b.block(o);
        for (uint64_t i = 0; i < g.count; ++i) {
          spans.push_back({g.row(i).dst_offset, g.row(i).dst_offset + g.length});
        }
      }
      std::sort(spans.begin(), spans.end());
      for (size_t i = 1; i < spans.size(); ++i) ASSERT_LE(spans[i - 1].second, spans[i].first);
    }
  }
}

TEST(GroupBlocksTest, GroupsOfOneShapeAtOneStepBecomeOneEntry) {
  // 8 heads of 16 rows of 512 B: source rows 4 KiB apart, heads 512 B apart; destination rows
  // contiguous, heads 8 KiB apart (an LBNHC page converted to BLHNC).
  std::vector<RunGroup> groups;
  for (uint64_t h = 0; h < 8; ++h) groups.push_back({h * 512, h * 8192, 512, 16, 4096, 512});
  std::vector<GroupBlocks> blocks;
  ASSERT_EQ(JoinGroups(groups, &blocks), 1u);
  EXPECT_EQ(blocks[0], (GroupBlocks{groups[0], 8, 512, 8192}));
  // Heads 4 KiB apart on the destination would overlap (a block spans 8 KiB there): no join.
  for (uint64_t h = 0; h < 8; ++h) groups[h].dst_offset = h * 4096;
  blocks.clear();
  EXPECT_EQ(JoinGroups(groups, &blocks), 8u);
}

LayoutSpec PageSpec(const char* order, int64_t blocks) {
  LayoutSpec s;
  s.order = order;
  s.layers = 4;
  s.blocks = blocks;
  s.heads = 8;
  s.total_heads = 8;
  s.block_size = 16;
  s.content_bytes = 512;
  return s;
}

// kvbench's LBNHC -> BLHNC shape with random block ids: one entry per page instead of one per
// head, whose groups in order are the groups the plan held before, on every layer.
TEST(GroupBlocksTest, LayerPlanJoinsAPagesHeadsIntoOneEntry) {
  const int64_t pages = 32;
  const KvRegion src = KvRegion::Create(PageSpec("LBNHC", 2 * pages)).value();
  const KvRegion dst = KvRegion::Create(PageSpec("BLHNC", 2 * pages)).value();
  std::vector<int64_t> ids(2 * pages), src_ids(pages), dst_ids(pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(5);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::copy(ids.begin(), ids.begin() + pages, src_ids.begin());
  std::shuffle(ids.begin(), ids.end(), rng);
  std::copy(ids.begin(), ids.begin() + pages, dst_ids.begin());
  const TransferSpec spec{src_ids, dst_ids, pages * 16};
  auto grouped = LayerPlan::Create(src, dst, spec, PlanEntries::kGroups);
  auto blocked = LayerPlan::Create(src, dst, spec, PlanEntries::kGroupBlocks);
  ASSERT_TRUE(grouped.ok() && blocked.ok());
  EXPECT_EQ(grouped->entries_per_layer(), static_cast<size_t>(pages) * 8);
  EXPECT_EQ(blocked->entries_per_layer(), static_cast<size_t>(pages));
  EXPECT_EQ(blocked->runs_per_layer(), grouped->runs_per_layer());
  for (int64_t layer = 0; layer < 4; ++layer) {
    Plan g, b;
    ASSERT_TRUE(grouped->AppendLayer(layer, &g).ok());
    ASSERT_TRUE(blocked->AppendLayer(layer, &b).ok());
    EXPECT_TRUE(b.groups.empty() && b.runs.empty());
    EXPECT_EQ(Expanded(b.blocks), g.groups) << "layer " << layer;
    EXPECT_EQ(b.bytes, g.bytes);
    EXPECT_EQ(b.group_rows, g.group_rows);
    EXPECT_TRUE(ValidateBlocks(b.blocks, src.span_bytes(), dst.span_bytes()).ok());
  }
  // A range of layers is each layer in order, and a bad range leaves the plan as it was.
  Plan range, each;
  ASSERT_TRUE(blocked->AppendLayers(1, 4, &range).ok());
  for (int64_t layer = 1; layer < 4; ++layer) ASSERT_TRUE(blocked->AppendLayer(layer, &each).ok());
  EXPECT_EQ(range.blocks, each.blocks);
  EXPECT_EQ(range.bytes, each.bytes);
  EXPECT_EQ(range.group_rows, each.group_rows);
  for (auto [begin, end] :
       std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {3, 1}, {-1, 2}, {0, 1 << 20}}) {
    const Status bad = blocked->AppendLayers(begin, end, &range);
    EXPECT_EQ(bad.code(), Code::kOutOfRange) << begin << ", " << end;
  }
  EXPECT_EQ(range.blocks, each.blocks);
  EXPECT_EQ(range.bytes, each.bytes);
  // LBNHC -> LBNHC with random ids has nothing to join: the plan stays as it was.
  auto same = LayerPlan::Create(src, src, spec, PlanEntries::kGroupBlocks);
  auto plain = LayerPlan::Create(src, src, spec, PlanEntries::kGroups);
  ASSERT_TRUE(same.ok() && plain.ok());
  Plan a, b;
  ASSERT_TRUE(same->AppendLayer(2, &a).ok());
  ASSERT_TRUE(plain->AppendLayer(2, &b).ok());
  EXPECT_TRUE(a.blocks.empty());
  EXPECT_EQ(a.runs, b.runs);
  EXPECT_EQ(a.groups, b.groups);
}

// One layer, block ids in order on both sides: a page's last row (head 7's last token) runs on
// into the next page's first on both sides, so the plan's runs cross pages and blocks of a
// page's heads would split them. The planner makes no such block: the rows stay the runs.
TEST(GroupBlocksTest, NoBlockSplitsARun) {
  LayoutSpec a = PageSpec("LBNHC", 8), b = PageSpec("BLHNC", 8);
  a.layers = b.layers = 1;
  const KvRegion src = KvRegion::Create(a).value(), dst = KvRegion::Create(b).value();
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), 0);
  const TransferSpec spec{ids, ids, 8 * 16};
  auto runs = PlanTransfer(src, dst, spec);
  auto blocked = LayerPlan::Create(src, dst, spec, PlanEntries::kGroupBlocks);
  ASSERT_TRUE(runs.ok() && blocked.ok());
  Plan p;
  ASSERT_TRUE(blocked->AppendLayer(0, &p).ok());
  std::vector<RunGroup> groups = p.groups;
  ExpandBlocks(p.blocks, &groups);
  std::vector<kv::Run> rows = p.runs;
  ExpandGroups(groups, &rows);
  EXPECT_EQ(rows, runs->runs);
  EXPECT_EQ(p.run_count(), runs->run_count());
  // The runs that cross pages are 1 KiB: head 7's last row and the next page's first.
  EXPECT_TRUE(
      std::any_of(rows.begin(), rows.end(), [](const kv::Run& r) { return r.length == 1024; }));
}

TEST(GroupBlocksTest, ValidateBlocksBoundsEveryRowOfEveryBlock) {
  const RunGroup head{0, 0, 512, 16, 4096, 512};  // 16 rows: 61,952 B of source, 8 KiB of dest
  // 8 blocks: source up to 3,584 + 61,952, destination up to 57,344 + 8,192 = 65,536.
  const GroupBlocks page{head, 8, 512, 8192};
  EXPECT_TRUE(ValidateBlocks(std::span(&page, 1), 65536, 65536).ok());
  EXPECT_EQ(ValidateBlocks(std::span(&page, 1), 65536, 65535).code(), Code::kOutOfRange);
  EXPECT_EQ(ValidateBlocks(std::span(&page, 1), 65535, 65536).code(), Code::kOutOfRange);
  // Blocks stepping down from the top: the same bytes.
  const GroupBlocks down{{3584, 57344, 512, 16, 4096, 512}, 8, -512, -8192};
  EXPECT_TRUE(ValidateBlocks(std::span(&down, 1), 65536, 65536).ok());
  const GroupBlocks below{{3584, 57343, 512, 16, 4096, 512}, 8, -512, -8192};
  EXPECT_EQ(ValidateBlocks(std::span(&below, 1), 65536, 65536).code(), Code::kOutOfRange);
  // Blocks overlapping on the destination, none at all, and counts past any region.
  const GroupBlocks overlapping{head, 8, 512, 4096};
  EXPECT_EQ(ValidateBlocks(std::span(&overlapping, 1), 1 << 20, 1 << 20).code(),
            Code::kInvalidArgument);
  const GroupBlocks none{head, 0, 512, 8192};
  EXPECT_EQ(ValidateBlocks(std::span(&none, 1), 1 << 20, 1 << 20).code(), Code::kInvalidArgument);
  const GroupBlocks huge{head, uint64_t{1} << 63, 512, INT64_MIN};
  EXPECT_EQ(ValidateBlocks(std::span(&huge, 1), 1 << 20, 1 << 20).code(), Code::kInvalidArgument);
  // A block's own group is checked as ValidateGroups checks it.
  const GroupBlocks rows_overlap{{0, 0, 512, 16, 4096, 256}, 2, 512, 1 << 16};
  EXPECT_EQ(ValidateBlocks(std::span(&rows_overlap, 1), 1 << 20, 1 << 20).code(),
            Code::kInvalidArgument);
  // Far blocks whose last one wraps past 2^64 on the destination.
  const GroupBlocks wraps{head, 3, 512, INT64_MAX};
  EXPECT_EQ(ValidateBlocks(std::span(&wraps, 1), 1 << 20, UINT64_MAX).code(), Code::kOutOfRange);
}

// Every row of random entries is inside the bounds exactly when ValidateBlocks says so.
TEST(GroupBlocksTest, ValidateBlocksMatchesTheDefinition) {
  std::mt19937_64 rng(13);
  int good = 0, bad = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const uint64_t length = rng() % 8 + 1, count = rng() % 4 + 1, outer = rng() % 4 + 1;
    const int64_t stride = static_cast<int64_t>(rng() % 40) - 20;
    const int64_t dst_stride = static_cast<int64_t>(length + rng() % 4) * (rng() % 2 ? 1 : -1);
    const uint64_t extent = (count - 1) * static_cast<uint64_t>(std::abs(dst_stride)) + length;
    const int64_t outer_s = static_cast<int64_t>(rng() % 200) - 100;
    const int64_t outer_d = static_cast<int64_t>(extent + rng() % 40) * (rng() % 2 ? 1 : -1);
    const GroupBlocks b{
        {rng() % 300, rng() % 300, length, count, stride, dst_stride}, outer, outer_s, outer_d};
    const uint64_t src_bytes = 200 + rng() % 200, dst_bytes = 200 + rng() % 200;
    bool inside = true;
    for (uint64_t o = 0; o < outer; ++o) {
      const RunGroup g = b.block(o);
      for (uint64_t i = 0; i < count; ++i) {
        const kv::Run r = g.row(i);
        // Offsets below zero wrap to huge values and fail the test as they should.
        inside = inside && r.src_offset + length <= src_bytes && r.src_offset < src_bytes &&
                 r.dst_offset + length <= dst_bytes && r.dst_offset < dst_bytes;
      }
    }
    const Status s = ValidateBlocks(std::span(&b, 1), src_bytes, dst_bytes);
    ASSERT_EQ(s.ok(), inside) << trial << ": " << s.ToString();
    (inside ? good : bad)++;
  }
  EXPECT_GT(good, 500);
  EXPECT_GT(bad, 500);
}

}  // namespace
}  // namespace kv
