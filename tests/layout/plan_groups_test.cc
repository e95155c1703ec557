// Run groups: compression round trips, the TP 1 -> 2 shape, bounds checks.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "layout/kv_region.h"
#include "layout/plan.h"

namespace kv {
namespace {

TEST(RunGroups, GroupRunsExpandsBackToTheRuns) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<kv::Run> runs;
    // Progressions of random length and stride, some broken by a different length.
    while (runs.size() < 300) {
      const uint64_t length = rng() % 3 + 1, count = rng() % 6 + 1;
      const uint64_t src = rng() % 1000, dst = rng() % 1000;
      const uint64_t ss = rng() % 7 - 3, ds = rng() % 9;
      for (uint64_t i = 0; i < count; ++i) runs.push_back({src + i * ss, dst + i * ds, length});
    }
    std::vector<RunGroup> groups{{9, 9, 9, 1, 0, 0}};  // appended behind what is there
    const size_t added = GroupRuns(runs, &groups);
    ASSERT_EQ(added, groups.size() - 1);
    ASSERT_LT(added, runs.size());
    std::vector<kv::Run> back;
    ExpandGroups(std::span(groups).subspan(1), &back);
    ASSERT_EQ(back, runs);
    // Greedy and maximal: a group never could have taken its successor's first run.
    for (size_t g = 2; g < groups.size(); ++g) {
      const RunGroup& a = groups[g - 1];
      const kv::Run next = groups[g].row(0);
      const kv::Run last = a.row(a.count - 1);
      const bool continues = a.count > 1 && next.length == a.length &&
                             next.src_offset - last.src_offset == uint64_t(a.src_stride) &&
                             next.dst_offset - last.dst_offset == uint64_t(a.dst_stride);
      ASSERT_FALSE(continues) << "group " << g - 1;
    }
  }
}

KvRegion Region(int tp, int rank) {
  LayoutSpec s;
  s.order = "LBNHC";
  s.layers = 4;
  s.blocks = 64;
  s.heads = 8 / tp;
  s.total_heads = 8;
  s.tp_size = tp;
  s.tp_rank = rank;
  s.block_size = 16;
  s.content_bytes = 512;
  return KvRegion::Create(s).value();
}

// The case kvd meets: one prefill rank feeding two decode ranks splits every token of a page
// into the rank's 4 heads (2 KiB of the source's 4 KiB), 16 runs per page at constant strides:
// one group per page.
TEST(RunGroups, TpSplitGroupsEachPage) {
  const KvRegion src = Region(1, 0);
  std::vector<int64_t> src_ids(32), dst_ids(32);
  std::mt19937_64 rng(7);
  std::vector<int64_t> ids(64);
  for (int64_t i = 0; i < 64; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  std::copy(ids.begin(), ids.begin() + 32, src_ids.begin());
  std::shuffle(ids.begin(), ids.end(), rng);
  std::copy(ids.begin(), ids.begin() + 32, dst_ids.begin());
  for (int rank = 0; rank < 2; ++rank) {
    const KvRegion dst = Region(2, rank);
    auto plan = LayerPlan::Create(src, dst, {src_ids, dst_ids, 32 * 16}, true);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->runs_per_layer(), 32u * 16);
    EXPECT_EQ(plan->entries_per_layer(), 32u);
    Plan layer;
    ASSERT_TRUE(plan->AppendLayer(3, &layer).ok());
    ASSERT_EQ(layer.groups.size(), 32u);
    for (const RunGroup& g : layer.groups) {
      EXPECT_EQ(g.count, 16u);
      EXPECT_EQ(g.length, 2048u);
      EXPECT_EQ(g.src_stride, 4096);
      EXPECT_EQ(g.dst_stride, 2048);
    }
    // Without groups, the same layer is the 512 runs.
    auto plain = LayerPlan::Create(src, dst, {src_ids, dst_ids, 32 * 16});
    ASSERT_TRUE(plain.ok());
    Plan runs;
    ASSERT_TRUE(plain->AppendLayer(3, &runs).ok());
    EXPECT_TRUE(runs.groups.empty());
    std::vector<kv::Run> rows;
    ExpandGroups(layer.groups, &rows);
    EXPECT_EQ(rows, runs.runs);
  }
  // TP 1 -> 1 with random ids: pages pair up at best, not worth groups.
  auto whole = LayerPlan::Create(src, Region(1, 0), {src_ids, dst_ids, 32 * 16}, true);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->entries_per_layer(), whole->runs_per_layer());
}

TEST(RunGroups, ValidateGroupsBoundsEveryRow) {
  const uint64_t kSrc = 1000, kDst = 2000;
  auto check = [&](RunGroup g) { return ValidateGroups(std::span(&g, 1), kSrc, kDst).code(); };
  EXPECT_EQ(check({0, 0, 100, 10, 100, 211}), Code::kOk);  // last rows end at 1000 and 1999
  EXPECT_EQ(check({0, 0, 100, 10, 101, 211}), Code::kOutOfRange);
  EXPECT_EQ(check({0, 0, 100, 10, 100, 212}), Code::kOutOfRange);
  EXPECT_EQ(check({900, 1900, 100, 10, -100, -200}), Code::kOk);
  EXPECT_EQ(check({900, 1900, 100, 10, -101, -200}), Code::kOutOfRange);  // below 0
  EXPECT_EQ(check({0, 0, 100, 0, 0, 0}), Code::kInvalidArgument);
  EXPECT_EQ(check({0, 0, 1001, 1, 0, 0}), Code::kOutOfRange);
  // Rows that would wrap 64 bits land far outside, not back inside.
  EXPECT_EQ(check({0, 0, 1, ~uint64_t{0}, INT64_MAX, 1}), Code::kOutOfRange);
  EXPECT_EQ(check({0, 0, 1, uint64_t{1} << 62, 4, 1}), Code::kOutOfRange);
  EXPECT_EQ(check({0, 0, 1, 3, 0, 1}), Code::kOk);  // a source row repeated
  // Rows that overlap on the destination are refused: they would race, and a step of 0 would
  // let a group name any number of rows.
  EXPECT_EQ(check({0, 0, 100, 2, 0, 99}), Code::kInvalidArgument);
  EXPECT_EQ(check({100, 200, 100, 2, 0, -99}), Code::kInvalidArgument);
  EXPECT_EQ(check({0, 0, 1, ~uint64_t{0}, 0, 0}), Code::kInvalidArgument);
  EXPECT_EQ(check({0, 0, 0, 5, 0, 0}), Code::kInvalidArgument);
  EXPECT_EQ(check({100, 200, 100, 2, 0, -100}), Code::kOk);
  EXPECT_EQ(check({0, 0, 100, 1, 0, 0}), Code::kOk);  // one row: no step
}

}  // namespace
}  // namespace kv
