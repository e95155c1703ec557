// Run groups: compression round trips, the TP 1 -> 2 shape, bounds checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
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

// ValidateGroups decides most groups in 64-bit arithmetic and falls back to 128 bits where that
// could wrap; these sit on both sides of the switch and of the bounds.
TEST(RunGroups, ValidateGroupsAgreesAcrossTheWideFallback) {
  constexpr uint64_t kMax = ~uint64_t{0};
  constexpr uint64_t kTop = uint64_t{1} << 63;
  auto check = [](RunGroup g, uint64_t src_bytes, uint64_t dst_bytes) {
    return ValidateGroups(std::span(&g, 1), src_bytes, dst_bytes).code();
  };
  // The 64-bit path's limits (count - 1 below 2^30, steps below 2^32 in magnitude, the length
  // below 2^62), each met and passed by one, and first offsets around 2^62, with the rows
  // fitting and then one byte over.
  constexpr uint64_t k62 = uint64_t{1} << 62, k30 = uint64_t{1} << 30, k32 = uint64_t{1} << 32;
  for (uint64_t first : {k62 - 1, k62}) {
    EXPECT_EQ(check({first, first, 8, 2, 8, 8}, first + 16, first + 16), Code::kOk) << first;
    EXPECT_EQ(check({first, first, 8, 2, 8, 8}, first + 15, first + 16), Code::kOutOfRange);
    EXPECT_EQ(check({first, first, 8, 2, 8, 8}, first + 16, first + 15), Code::kOutOfRange);
    EXPECT_EQ(check({first, first, 8, 2, -8, -8}, first + 8, first + 8), Code::kOk);
  }
  for (uint64_t count : {k30, k30 + 1, k30 + 2}) {
    const uint64_t end = (count - 1) * 16 + 8;
    EXPECT_EQ(check({0, 0, 8, count, 16, 16}, end, end), Code::kOk) << count;
    EXPECT_EQ(check({0, 0, 8, count, 16, 16}, end - 1, end), Code::kOutOfRange) << count;
    EXPECT_EQ(check({0, 0, 8, count, 16, 16}, end, end - 1), Code::kOutOfRange) << count;
    EXPECT_EQ(check({end - 8, end - 8, 8, count, -16, -16}, end, end), Code::kOk) << count;
    EXPECT_EQ(check({end - 9, end - 8, 8, count, -16, -16}, end, end), Code::kOutOfRange);
  }
  for (uint64_t step : {k32 - 1, k32, k32 + 1}) {
    const int64_t up = static_cast<int64_t>(step), down = -up;
    const uint64_t end = 3 * step + 8;
    EXPECT_EQ(check({0, 0, 8, 4, up, up}, end, end), Code::kOk) << step;
    EXPECT_EQ(check({0, 0, 8, 4, up, up}, end - 1, end), Code::kOutOfRange) << step;
    EXPECT_EQ(check({0, 0, 8, 4, up, up}, end, end - 1), Code::kOutOfRange) << step;
    EXPECT_EQ(check({end - 8, end - 8, 8, 4, down, down}, end, end), Code::kOk) << step;
    EXPECT_EQ(check({end - 9, end - 8, 8, 4, down, down}, end, end), Code::kOutOfRange);
    EXPECT_EQ(check({0, end - 9, 8, 4, up, down}, end, end), Code::kOutOfRange);
  }
  for (uint64_t length : {k62 - 1, k62, k62 + 1}) {
    EXPECT_EQ(check({0, 0, length, 1, 0, 0}, length, length), Code::kOk) << length;
    EXPECT_EQ(check({1, 0, length, 1, 0, 0}, length, length), Code::kOutOfRange) << length;
    EXPECT_EQ(check({0, 0, length, 1, 0, 0}, length, length - 1), Code::kOutOfRange) << length;
    EXPECT_EQ(check({0, 0, length, 2, 0, static_cast<int64_t>(length)}, length, 2 * length),
              Code::kOk)
        << length;
    EXPECT_EQ(check({0, 0, length, 2, 0, static_cast<int64_t>(length - 1)}, kMax, kMax),
              Code::kInvalidArgument);
  }
  // The last row ends exactly at the end, then one byte past it, on either side.
  EXPECT_EQ(check({0, 0, 8, 3, 46, 8}, 100, 100), Code::kOk);
  EXPECT_EQ(check({0, 0, 8, 3, 47, 8}, 100, 100), Code::kOutOfRange);
  EXPECT_EQ(check({0, 0, 8, 3, 8, 46}, 100, 100), Code::kOk);
  EXPECT_EQ(check({0, 0, 8, 3, 8, 47}, 100, 100), Code::kOutOfRange);
  // Buffers of 2^64 - 1 bytes: offsets past 2^63 leave int64, so the wide path decides.
  EXPECT_EQ(check({kMax - 8, kMax - 8, 8, 1, 0, 0}, kMax, kMax), Code::kOk);
  EXPECT_EQ(check({kMax - 7, 0, 8, 1, 0, 0}, kMax, kMax), Code::kOutOfRange);
  EXPECT_EQ(check({kTop - 16, 0, 8, 2, 8, 8}, kMax, kMax), Code::kOk);  // last row at 2^63 - 8
  EXPECT_EQ(check({kTop - 16, 0, 8, 3, 8, 8}, kMax, kMax), Code::kOk);  // last row at 2^63
  EXPECT_EQ(check({kTop, 0, 8, 2, -8, 8}, kMax, kMax), Code::kOk);      // first at 2^63
  EXPECT_EQ(check({kTop - 8, 0, 8, 2, INT64_MAX, 8}, kMax, kMax), Code::kOk);  // ends at 2^64-1
  EXPECT_EQ(check({kTop - 8, 0, 8, 2, INT64_MAX, 8}, kMax - 1, kMax), Code::kOutOfRange);
  EXPECT_EQ(check({kTop - 7, 0, 8, 2, INT64_MAX, 8}, kMax, kMax), Code::kOutOfRange);
  // Strides near 2^63: one row more and (count - 1)·stride leaves int64.
  EXPECT_EQ(check({0, 0, 1, 2, INT64_MAX, 1}, kMax, kMax), Code::kOk);
  EXPECT_EQ(check({0, 0, 1, 3, INT64_MAX, 1}, kMax, kMax), Code::kOk);  // ends at 2^64 - 1
  EXPECT_EQ(check({0, 0, 2, 3, INT64_MAX, 2}, kMax, kMax), Code::kOutOfRange);
  EXPECT_EQ(check({kMax - 1, 0, 1, 2, INT64_MIN, 1}, kMax, kMax), Code::kOk);
  EXPECT_EQ(check({kTop - 1, 0, 1, 2, INT64_MIN, 1}, kMax, kMax), Code::kOutOfRange);
  EXPECT_EQ(check({0, 0, 1, 2, 1, INT64_MIN}, kMax, kMax), Code::kOutOfRange);
  EXPECT_EQ(check({0, kTop, 1, 2, 1, INT64_MIN}, kMax, kMax), Code::kOk);
  // Counts of 2^63 and more.
  EXPECT_EQ(check({0, 0, 1, kTop, 0, 1}, kMax, kTop), Code::kOk);
  EXPECT_EQ(check({0, 0, 1, kTop, 0, 1}, kMax, kTop - 1), Code::kOutOfRange);
  EXPECT_EQ(check({0, 0, 1, kTop + 1, 0, 1}, kMax, kTop), Code::kOutOfRange);
  EXPECT_EQ(check({0, 0, 1, kTop + 1, 0, 1}, kMax, kTop + 1), Code::kOk);
  EXPECT_EQ(check({0, 0, 1, kMax, 0, -1}, kMax, kMax), Code::kOutOfRange);
}

// Groups of one shape share their bounds, computed once; a group that leaves them, or one of
// another shape between them, is still the one named.
TEST(RunGroups, ValidateGroupsNamesTheFirstBadGroupAmongOneShape) {
  std::vector<RunGroup> groups;
  for (uint64_t p = 0; p < 100; ++p) groups.push_back({p * 4096, p * 2048, 2048, 16, 4096, 2048});
  const uint64_t src_bytes = 99 * 4096 + 15 * 4096 + 2048, dst_bytes = 99 * 2048 + 15 * 2048 + 2048;
  ASSERT_TRUE(ValidateGroups(groups, src_bytes, dst_bytes).ok());
  EXPECT_EQ(ValidateGroups(groups, src_bytes - 1, dst_bytes).code(), Code::kOutOfRange);
  EXPECT_EQ(ValidateGroups(groups, src_bytes, dst_bytes - 1).code(), Code::kOutOfRange);
  groups[40] = {0, 0, 100, 3, 100, 100};  // another shape, fine
  groups[57].dst_offset = dst_bytes - 15 * 2048 - 2048 + 1;
  Status s = ValidateGroups(groups, src_bytes, dst_bytes);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.ToString().find("run group 57 "), std::string::npos) << s.ToString();
  groups[57].dst_offset -= 1;
  EXPECT_TRUE(ValidateGroups(groups, src_bytes, dst_bytes).ok());
  groups[41].count = 0;  // right after the other shape
  s = ValidateGroups(groups, src_bytes, dst_bytes);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.ToString().find("run group 41 "), std::string::npos) << s.ToString();
  groups[41].count = 16;
  groups[3].src_stride = -4096;  // its rows now reach below 0
  s = ValidateGroups(groups, src_bytes, dst_bytes);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.ToString().find("run group 3 "), std::string::npos) << s.ToString();
  EXPECT_TRUE(ValidateGroups({}, 0, 0).ok());
}

// Random groups close to the bounds, checked against the definition row by row in 128 bits; the
// first bad group of a list is the one named.
TEST(RunGroups, ValidateGroupsMatchesTheDefinition) {
  __extension__ typedef __int128 Wide;
  auto fits = [](uint64_t offset, int64_t stride, uint64_t count, uint64_t length, uint64_t bytes) {
    for (uint64_t r : {uint64_t{0}, count - 1}) {
      const Wide at = static_cast<Wide>(offset) + static_cast<Wide>(r) * stride;
      if (at < 0 || at + static_cast<Wide>(length) > static_cast<Wide>(bytes)) return false;
    }
    return true;
  };
  auto expected = [&](const RunGroup& g, uint64_t src_bytes, uint64_t dst_bytes) {
    if (g.count == 0) return Code::kInvalidArgument;
    const Wide step = g.dst_stride < 0 ? -static_cast<Wide>(g.dst_stride) : g.dst_stride;
    if (g.count > 1 && step < static_cast<Wide>(std::max<uint64_t>(g.length, 1)))
      return Code::kInvalidArgument;
    const bool ok = fits(g.src_offset, g.src_stride, g.count, g.length, src_bytes) &&
                    fits(g.dst_offset, g.dst_stride, g.count, g.length, dst_bytes);
    return ok ? Code::kOk : Code::kOutOfRange;
  };
  std::mt19937_64 rng(17);
  auto near = [&](uint64_t v) { return v + (rng() % 5) - 2; };
  const uint64_t scales[] = {uint64_t{1} << 20, uint64_t{1} << 34, uint64_t{1} << 40,
                             uint64_t{1} << 62, uint64_t{1} << 63, ~uint64_t{0}};
  int oks = 0, bad = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const uint64_t bytes = scales[rng() % std::size(scales)];
    const uint64_t src_bytes = bytes - rng() % 3, dst_bytes = bytes - rng() % 3;
    RunGroup g;
    g.length = rng() % 3 == 0 ? rng() % 4 : rng() % 4096 + 1;
    const uint64_t counts[] = {2, uint64_t{1} << 30, uint64_t{1} << 63};
    g.count = rng() % 4 == 0 ? near(counts[rng() % 3]) : rng() % 64 + 1;
    // Each side walks from near one end of its buffer, by a step that takes its last row to
    // near the other end (or half way, or nowhere on the source), forwards or backwards.
    auto side = [&](uint64_t bytes_of_side, uint64_t share, uint64_t* offset, int64_t* stride) {
      const uint64_t room = bytes_of_side - g.length;
      const uint64_t reach = g.count > 1 ? room / (g.count - 1) : room;
      const uint64_t magnitude = near(std::min(reach, uint64_t{1} << 63) / 2 * share);
      const bool back = rng() % 2;
      *stride = static_cast<int64_t>(back ? uint64_t{0} - magnitude : magnitude);
      *offset = back ? near(room) : near(0);
    };
    side(src_bytes, rng() % 3, &g.src_offset, &g.src_stride);
    side(dst_bytes, 2, &g.dst_offset, &g.dst_stride);
    const RunGroup fine{0, 0, 1, 1, 0, 0};
    const RunGroup list[] = {fine, g, fine};
    const Status s = ValidateGroups(list, src_bytes, dst_bytes);
    ASSERT_EQ(s.code(), expected(g, src_bytes, dst_bytes))
        << "trial " << trial << ": " << g.count << " rows of " << g.length << " from "
        << g.src_offset << " step " << g.src_stride << " -> " << g.dst_offset << " step "
        << g.dst_stride << " in " << src_bytes << ", " << dst_bytes;
    if (s.ok()) {
      ++oks;
    } else {
      ++bad;
      EXPECT_NE(s.ToString().find("run group 1 "), std::string::npos) << s.ToString();
    }
  }
  // Both answers are common, so the boundary is exercised from both sides.
  EXPECT_GT(oks, 2000);
  EXPECT_GT(bad, 2000);
}

}  // namespace
}  // namespace kv
