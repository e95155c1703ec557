#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/plan_copy.h"
#include "tests/support/plan_copy_groups.h"

namespace kv::kernels {
namespace {

// Runs with lengths from 1 byte to `max_len`, disjoint destinations in random order.
std::vector<kv::Run> RandomRuns(std::mt19937_64& rng, uint64_t src_bytes, uint64_t* dst_bytes,
                                int count, uint64_t max_len) {
  std::vector<kv::Run> runs;
  std::uniform_int_distribution<uint64_t> len(1, max_len), gap(0, 7);
  uint64_t dst = 0;
  for (int i = 0; i < count; ++i) {
    kv::Run r;
    r.length = len(rng);
    dst += gap(rng);
    r.dst_offset = dst;
    dst += r.length;
    r.src_offset = std::uniform_int_distribution<uint64_t>(0, src_bytes - r.length)(rng);
    runs.push_back(r);
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  *dst_bytes = dst;
  return runs;
}

TEST(PlanCopyRef, MatchesBytewiseDefinition) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const uint64_t src_bytes = 1 << 16;
    uint64_t dst_bytes = 0;
    auto runs = RandomRuns(rng, src_bytes, &dst_bytes, 1 + trial * 10, 1 + trial * 400);
    std::vector<unsigned char> src(src_bytes), dst(dst_bytes, 0xEE), want(dst_bytes, 0xEE);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    for (const kv::Run& r : runs) {
      for (uint64_t i = 0; i < r.length; ++i) want[r.dst_offset + i] = src[r.src_offset + i];
    }
    CopyRunsHost(src.data(), dst.data(), runs);
    ASSERT_EQ(dst, want) << "trial " << trial;
  }
}

TEST(PlanCopyRef, TableHoldsOneDescriptorPerChunk) {
  constexpr uint64_t C = kPlanCopyChunkBytes;
  const std::vector<kv::Run> runs = {
      {0, 0, 1}, {5, 50, 0}, {10, 100, C}, {20, 200, C + 1}, {30, 300, 5 * C - 3}};
  std::vector<PlanCopyChunk> table(PlanCopyChunks(runs));
  ASSERT_EQ(PlanCopyTableBytes(runs.size(), table.size()), table.size() * sizeof(PlanCopyChunk));
  auto chunks = EncodePlanCopyTable(runs, table.data(), table.size() * sizeof(PlanCopyChunk));
  ASSERT_TRUE(chunks.ok()) << chunks.status().ToString();
  ASSERT_EQ(*chunks, 1u + 0u + 1u + 2u + 5u);
  struct Want {
    uint64_t src, dst, length;
  };
  const std::vector<Want> want = {{0, 0, 1},
                                  {10, 100, C},
                                  {20, 200, C},
                                  {20 + C, 200 + C, 1},
                                  {30, 300, C},
                                  {30 + C, 300 + C, C},
                                  {30 + 2 * C, 300 + 2 * C, C},
                                  {30 + 3 * C, 300 + 3 * C, C},
                                  {30 + 4 * C, 300 + 4 * C, C - 3}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(table[i].src_offset, want[i].src) << i;
    EXPECT_EQ(table[i].dst_offset_and_length & (kPlanCopyMaxOffset - 1), want[i].dst) << i;
    EXPECT_EQ((table[i].dst_offset_and_length >> 48) + 1, want[i].length) << i;
  }
  EXPECT_FALSE(
      EncodePlanCopyTable(runs, table.data(), table.size() * sizeof(PlanCopyChunk) - 1).ok());
}

TEST(PlanCopyRef, TableRejectsOffsetsBeyond48Bits) {
  PlanCopyChunk table[2];
  const kv::Run high_dst[] = {{0, kPlanCopyMaxOffset - 8, 16}};
  EXPECT_FALSE(EncodePlanCopyTable(high_dst, table, sizeof table).ok());
  const kv::Run high_src[] = {{kPlanCopyMaxOffset, 0, 1}};
  EXPECT_FALSE(EncodePlanCopyTable(high_src, table, sizeof table).ok());
  const kv::Run highest[] = {{kPlanCopyMaxOffset - 16, kPlanCopyMaxOffset - 16, 16}};
  EXPECT_TRUE(EncodePlanCopyTable(highest, table, sizeof table).ok());
}

// Prefixes encoded one after another (as PlanCopier's pieces are) make the same table as one
// encoding of all runs; each stops before the run that would pass max_chunks.
TEST(PlanCopyRef, PrefixesConcatenateToTheWholeTable) {
  const uint64_t c = kPlanCopyChunkBytes;
  const std::vector<kv::Run> runs = {{0, 0, 3 * c}, {5, 9 * c, 0},      {7, 4 * c, c + 1},
                                     {1, 7 * c, 1}, {2, 20 * c, 5 * c}, {3, 40 * c, c}};
  const uint64_t chunks = PlanCopyChunks(runs);
  ASSERT_EQ(chunks, 3u + 0 + 2 + 1 + 5 + 1);
  std::vector<PlanCopyChunk> whole(chunks), pieces(chunks);
  ASSERT_TRUE(EncodePlanCopyTable(runs, whole.data(), chunks * sizeof(PlanCopyChunk)).ok());
  size_t at = 0;
  uint64_t filled = 0;
  std::vector<size_t> taken;
  while (at < runs.size()) {
    auto prefix = EncodePlanCopyPrefix(std::span(runs).subspan(at), 5, pieces.data() + filled);
    ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
    ASSERT_LE(prefix->chunks, 5u);
    at += prefix->runs;
    filled += prefix->chunks;
    taken.push_back(prefix->runs);
  }
  // Chunks 3 + 0 + 2 | 1 (the run of 5 would pass 5) | 5 | 1.
  EXPECT_EQ(taken, (std::vector<size_t>{3, 1, 1, 1}));
  ASSERT_EQ(filled, chunks);
  for (uint64_t i = 0; i < chunks; ++i) {
    EXPECT_EQ(pieces[i].src_offset, whole[i].src_offset) << i;
    EXPECT_EQ(pieces[i].dst_offset_and_length, whole[i].dst_offset_and_length) << i;
  }
  // A first run larger than the table is refused, not split.
  std::vector<PlanCopyChunk> small(2);
  EXPECT_EQ(EncodePlanCopyPrefix(runs, 2, small.data()).status().code(), Code::kInvalidArgument);
}

// The group table, decoded as the group kernel decodes it, copies what the groups' rows copy;
// every chunk stays within kPlanCopyChunkBytes, and pieces concatenate to the whole table.
TEST(PlanCopyRef, GroupTableMatchesRows) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const uint64_t src_bytes = 1 << 20, dst_bytes = 2 << 20;
    const uint64_t max_len = trial % 4 == 0 ? 100 << 10 : trial % 4 == 1 ? 40 : 4096;
    const auto groups =
        kv::testing::RandomGroups(rng, src_bytes, dst_bytes, max_len, trial % 2 == 0);
    ASSERT_FALSE(groups.empty());
    ASSERT_TRUE(ValidateGroups(groups, src_bytes, dst_bytes).ok());
    std::vector<unsigned char> src(src_bytes);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    std::vector<unsigned char> want(dst_bytes, 0xEE), got(dst_bytes, 0xEE);
    CopyGroupsHost(src.data(), want.data(), groups);
    std::vector<kv::Run> rows;
    ExpandGroups(groups, &rows);
    std::vector<unsigned char> by_runs(dst_bytes, 0xEE);
    CopyRunsHost(src.data(), by_runs.data(), rows);
    ASSERT_EQ(by_runs, want);

    uint64_t chunks = 0;
    for (const RunGroup& g : groups) chunks += PlanCopyGroupChunks(g);
    const uint64_t piece = trial % 3 == 0 ? chunks : std::max<uint64_t>(1, chunks / 5);
    std::vector<PlanCopyGroupChunk> table(chunks + 1);
    uint64_t encoded = 0;
    for (size_t at = 0; at < groups.size();) {
      const uint64_t most = std::max(piece, PlanCopyGroupChunks(groups[at]));
      auto prefix =
          EncodePlanCopyGroupPrefix(std::span(groups).subspan(at), most, table.data() + encoded);
      ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
      ASSERT_GT(prefix->runs, 0u);
      ASSERT_LE(prefix->chunks, most);
      at += prefix->runs;
      encoded += prefix->chunks;
    }
    ASSERT_EQ(encoded, chunks);
    for (uint64_t c = 0; c < chunks; ++c) {
      const uint64_t rows_in = (table[c].src_offset_and_rows >> 48) + 1;
      const uint64_t length = (table[c].dst_offset_and_length >> 48) + 1;
      ASSERT_LE(rows_in * length, kPlanCopyChunkBytes);
    }
    CopyGroupTableHost(src.data(), got.data(), table.data(), chunks);
    ASSERT_EQ(got, want) << "trial " << trial;
  }
}

// The block table, decoded as the block kernel decodes it, copies what the entries' rows copy:
// blocks that pack several to a descriptor and blocks cut as the group table cuts groups (rows
// longer than a chunk included), aligned or not, every stride either way.
TEST(PlanCopyRef, BlockTableMatchesRows) {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 40; ++trial) {
    const uint64_t src_bytes = 1 << 20, dst_bytes = 2 << 20;
    const uint64_t max_len = trial % 4 == 0 ? 100 << 10 : trial % 4 == 1 ? 40 : 4096;
    const auto entries =
        kv::testing::RandomBlocks(rng, src_bytes, dst_bytes, max_len, trial % 2 == 0);
    ASSERT_FALSE(entries.empty());
    std::vector<unsigned char> src(src_bytes);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    std::vector<unsigned char> want(dst_bytes, 0xEE), got(dst_bytes, 0xEE);
    std::vector<RunGroup> blocks;  // the definition: every block a group of its own
    for (const GroupBlocks& e : entries) {
      for (uint64_t o = 0; o < e.outer_count; ++o) blocks.push_back(e.block(o));
    }
    ASSERT_TRUE(ValidateGroups(blocks, src_bytes, dst_bytes).ok());
    CopyGroupsHost(src.data(), want.data(), blocks);
    std::vector<unsigned char> by_entries(dst_bytes, 0xEE);
    CopyBlocksHost(src.data(), by_entries.data(), entries);
    ASSERT_EQ(by_entries, want);

    uint64_t chunks = 0;
    for (const GroupBlocks& e : entries) chunks += PlanCopyBlockChunks(e);
    std::vector<PlanCopyBlockChunk> table(chunks);
    auto written = EncodePlanCopyBlocks(entries, chunks, table.data());
    ASSERT_TRUE(written.ok()) << written.status().ToString();
    ASSERT_EQ(*written, chunks);
    for (const PlanCopyBlockChunk& c : table) {
      const uint64_t rows = (c.src_offset_and_rows >> 48) + 1;
      const uint64_t length = (c.dst_offset_and_length >> 48) + 1;
      ASSERT_GE(c.blocks, 1u);
      ASSERT_LE(c.blocks * rows * length, kPlanCopyBlockChunkBytes);
    }
    CopyBlockTableHost(src.data(), got.data(), table.data(), chunks);
    ASSERT_EQ(got, want) << "trial " << trial;
    EXPECT_FALSE(EncodePlanCopyBlocks(entries, chunks - 1, table.data()).ok());
  }
}

// A page of LBNHC -> BLHNC (8 heads of 16 rows of 512 B) is one descriptor; blocks past 64 KiB
// of one entry take more; offsets at 2^48 are refused.
TEST(PlanCopyRef, BlockTablePacksAPagesHeadsIntoOneDescriptor) {
  GroupBlocks page{{0, 0, 512, 16, 4096, 512}, 8, 512, 8192};
  EXPECT_EQ(PlanCopyBlockChunks(page), 1u);
  page.outer_count = 9;
  EXPECT_EQ(PlanCopyBlockChunks(page), 2u);
  page.outer_count = 0;
  EXPECT_EQ(PlanCopyBlockChunks(page), 0u);
  const GroupBlocks long_rows{{0, 0, 100 << 10, 2, 100 << 10, 100 << 10}, 3, 1 << 20, 1 << 20};
  EXPECT_EQ(PlanCopyBlockChunks(long_rows), 3 * PlanCopyGroupChunks(long_rows.group));
  std::vector<PlanCopyBlockChunk> table(4);
  GroupBlocks far = page;
  far.outer_count = 2;
  far.group.src_offset = kPlanCopyMaxOffset;
  EXPECT_EQ(EncodePlanCopyBlocks(std::span(&far, 1), 4, table.data()).status().code(),
            Code::kInvalidArgument);
}

// Prefixes of whole entries: each the longest that fits, together the whole table.
TEST(PlanCopyRef, BlockPrefixesConcatenateToTheWholeTable) {
  std::mt19937_64 rng(17);
  const auto entries = kv::testing::RandomBlocks(rng, 1 << 20, 2 << 20, 100 << 10, false);
  uint64_t chunks = 0;
  for (const GroupBlocks& e : entries) chunks += PlanCopyBlockChunks(e);
  std::vector<PlanCopyBlockChunk> whole(chunks), pieces(chunks);
  ASSERT_EQ(*EncodePlanCopyBlocks(entries, chunks, whole.data()), chunks);
  size_t at = 0;
  uint64_t written = 0;
  for (uint64_t most = 3; at < entries.size(); most += 2) {
    const uint64_t first = PlanCopyBlockChunks(entries[at]);
    auto prefix = EncodePlanCopyBlockPrefix(std::span(entries).subspan(at), std::max(most, first),
                                            pieces.data() + written);
    ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
    ASSERT_GE(prefix->runs, 1u);
    ASSERT_LE(prefix->chunks, std::max(most, first));
    // Longest: the next entry would not have fit.
    if (at + prefix->runs < entries.size()) {
      EXPECT_GT(prefix->chunks + PlanCopyBlockChunks(entries[at + prefix->runs]),
                std::max(most, first));
    }
    at += prefix->runs;
    written += prefix->chunks;
  }
  ASSERT_EQ(written, chunks);
  EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), chunks * sizeof(PlanCopyBlockChunk)), 0);
  // A first entry larger than the table is refused.
  const GroupBlocks big{{0, 0, 512, 16, 4096, 512}, 16, 512, 8192};  // 2 descriptors
  EXPECT_EQ(EncodePlanCopyBlockPrefix(std::span(&big, 1), 1, pieces.data()).status().code(),
            Code::kInvalidArgument);
}

TEST(PlanCopyRef, GroupTableRejectsTooSmallAndFarOffsets) {
  std::vector<PlanCopyGroupChunk> table(8);
  const RunGroup big{0, 0, 2048, 64, 2048, 4096};  // 4 chunks of 16 rows
  EXPECT_EQ(PlanCopyGroupChunks(big), 4u);
  EXPECT_EQ(EncodePlanCopyGroupPrefix(std::span(&big, 1), 3, table.data()).status().code(),
            Code::kInvalidArgument);
  const RunGroup far{kPlanCopyMaxOffset, 0, 16, 2, 16, 16};
  EXPECT_EQ(EncodePlanCopyGroupPrefix(std::span(&far, 1), 8, table.data()).status().code(),
            Code::kInvalidArgument);
  const RunGroup empty{5, 5, 0, 3, 1, 1};
  auto none = EncodePlanCopyGroupPrefix(std::span(&empty, 1), 8, table.data());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->chunks, 0u);
}

// The group table by its definition, one group after another: rows of up to
// kPlanCopyChunkBytes go kPlanCopyChunkBytes / length to a chunk, longer rows are cut into
// single-row chunks. Returns the chunks of each group alongside.
std::vector<PlanCopyGroupChunk> ReferenceGroupTable(std::span<const RunGroup> groups,
                                                    std::vector<uint64_t>* per_group) {
  constexpr uint64_t C = kPlanCopyChunkBytes;
  std::vector<PlanCopyGroupChunk> table;
  for (const RunGroup& g : groups) {
    const size_t before = table.size();
    for (uint64_t r = 0; g.length > 0 && r < g.count;) {
      const kv::Run row = g.row(r);
      if (g.length > C) {
        for (uint64_t done = 0; done < g.length; done += C) {
          const uint64_t take = std::min(C, g.length - done);
          table.push_back(
              {row.src_offset + done, (row.dst_offset + done) | (take - 1) << 48, 0, 0});
        }
        ++r;
        continue;
      }
      const uint64_t rows = std::min(C / g.length, g.count - r);
      table.push_back({row.src_offset | (rows - 1) << 48, row.dst_offset | (g.length - 1) << 48,
                       g.src_stride, g.dst_stride});
      r += rows;
    }
    per_group->push_back(table.size() - before);
  }
  return table;
}

// The encoder (one chunk without a division for a group that fits one, a division per new
// length otherwise, rows stepped rather than recomputed) makes the reference's table and
// prefixes, around every boundary of rows per chunk.
TEST(PlanCopyRef, GroupTableMatchesTheDefinition) {
  constexpr uint64_t C = kPlanCopyChunkBytes;
  std::mt19937_64 rng(23);
  const uint64_t lengths[] = {1, 3, 16, 2048, 2047, 2049, C / 3, C / 2, C - 1, C, C + 1, 3 * C};
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<RunGroup> groups;
    const uint64_t shared = lengths[rng() % std::size(lengths)];
    for (int i = 0; i < 60; ++i) {
      RunGroup g;
      // Mostly one length, as a batch's groups are, with others mixed in.
      g.length = rng() % 4 ? shared : rng() % 5 == 0 ? 0 : lengths[rng() % std::size(lengths)];
      const uint64_t per = g.length == 0 || g.length > C ? 1 : C / g.length;
      const uint64_t pick = rng() % 6;
      g.count = pick == 0   ? 0
                : pick == 1 ? per
                : pick == 2 ? per + 1
                : pick == 3 ? per * 3
                            : rng() % 40 + 1;
      g.count = std::min<uint64_t>(g.count, 3000);
      g.src_offset = rng() % (uint64_t{1} << 40);
      g.dst_offset = rng() % (uint64_t{1} << 40);
      g.src_stride = static_cast<int64_t>(rng() % 100000) - 50000;
      g.dst_stride = static_cast<int64_t>(rng() % 100000) - 50000;
      groups.push_back(g);
    }
    std::vector<uint64_t> per_group;
    const auto want = ReferenceGroupTable(groups, &per_group);
    for (size_t i = 0; i < groups.size(); ++i) {
      ASSERT_EQ(PlanCopyGroupChunks(groups[i]), per_group[i])
          << "trial " << trial << " group " << i;
    }
    // Whole, then in prefixes of a random size: each takes the groups the reference says fit.
    const uint64_t most = trial % 2 ? want.size() : rng() % 64 + 1;
    std::vector<PlanCopyGroupChunk> got(want.size() + 1);
    uint64_t filled = 0;
    for (size_t at = 0; at < groups.size();) {
      size_t fit = at;
      uint64_t fit_chunks = 0;
      while (fit < groups.size() && fit_chunks + per_group[fit] <= most)
        fit_chunks += per_group[fit++];
      auto prefix =
          EncodePlanCopyGroupPrefix(std::span(groups).subspan(at), most, got.data() + filled);
      if (fit_chunks == 0 && fit < groups.size()) {  // the next group alone is too large
        ASSERT_EQ(prefix.status().code(), Code::kInvalidArgument) << "trial " << trial;
        ASSERT_GT(per_group[fit], most);
        groups[fit].count = 0;  // leave it out of the rest
        per_group[fit] = 0;
        continue;
      }
      ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
      ASSERT_EQ(prefix->runs, fit - at) << "trial " << trial << " at " << at;
      ASSERT_EQ(prefix->chunks, fit_chunks);
      at = fit;
      filled += fit_chunks;
    }
    std::vector<uint64_t> unused;
    const auto kept = ReferenceGroupTable(groups, &unused);
    ASSERT_EQ(filled, kept.size());
    for (uint64_t c = 0; c < filled; ++c) {
      ASSERT_EQ(got[c].src_offset_and_rows, kept[c].src_offset_and_rows)
          << "trial " << trial << " chunk " << c;
      ASSERT_EQ(got[c].dst_offset_and_length, kept[c].dst_offset_and_length) << c;
      ASSERT_EQ(got[c].src_stride, kept[c].src_stride) << c;
      ASSERT_EQ(got[c].dst_stride, kept[c].dst_stride) << c;
    }
  }
}

TEST(PlanCopyRef, ChooserPrefersCopyEngineForLargeRuns) {
  int dummy_stream = 0;
  void* stream = &dummy_stream;
  const std::vector<kv::Run> small(1000, kv::Run{0, 0, 16 << 10});
  const std::vector<kv::Run> large(8, kv::Run{0, 0, 4 << 20});
  const std::vector<kv::Run> medium(64, kv::Run{0, 0, 512 << 10});
  EXPECT_EQ(ChooseCopyPath(small, CopyDirection::kDeviceToDevice, stream), CopyPath::kKernel);
  EXPECT_EQ(ChooseCopyPath(large, CopyDirection::kDeviceToDevice, stream), CopyPath::kCopyEngine);
  EXPECT_EQ(ChooseCopyPath(medium, CopyDirection::kDeviceToDevice, stream), CopyPath::kKernel);
  EXPECT_EQ(ChooseCopyPath(medium, CopyDirection::kDeviceToHost, stream), CopyPath::kCopyEngine);
  EXPECT_EQ(ChooseCopyPath(large, CopyDirection::kDeviceToHost, nullptr), CopyPath::kKernel);
}

}  // namespace
}  // namespace kv::kernels
