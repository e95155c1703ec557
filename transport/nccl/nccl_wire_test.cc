// The nccl backend's batch schedule and its announcement, on the host: which ranges skip the
// staging (both sides derive it from the lengths alone, so it must be a pure function of them),
// that the threshold and a put's run groups survive the wire, that a peer's rows are checked,
// and that rows gathered into chunks and scattered from them land where the groups say. Beside
// the backend, whose internals it tests (registered in tests/gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/plan_copy.h"
#include "layout/kv_region.h"
#include "transport/nccl/chunk_tables.h"
#include "transport/nccl/wire.h"
#include "transport/nccl/wire_test_util.h"

namespace kv::transport::nccl {
namespace {

TEST(NcclWireTest, LongRangesGoDirectInPiecesAndTheRestStaysStagedInOrder) {
  const std::vector<Range> ranges = {{0, 100}, {1000, 250}, {5000, 0}, {9000, 99}, {20000, 500}};
  const DirectSplit split = SplitDirect(ranges, /*direct_bytes=*/100, /*piece_bytes=*/200);
  ASSERT_EQ(split.staged.size(), 1u);
  EXPECT_EQ(split.staged[0].offset, 9000u);
  EXPECT_EQ(split.staged[0].length, 99u);
  const std::vector<Range> direct = {{0, 100},     {1000, 200},  {1200, 50},
                                     {20000, 200}, {20200, 200}, {20400, 100}};
  ASSERT_EQ(split.direct.size(), direct.size());
  for (size_t i = 0; i < direct.size(); ++i) {
    EXPECT_EQ(split.direct[i].offset, direct[i].offset) << i;
    EXPECT_EQ(split.direct[i].length, direct[i].length) << i;
  }
}

TEST(NcclWireTest, ZeroThresholdStagesEverythingButEmptyRanges) {
  const std::vector<Range> ranges = {{0, 1ull << 40}, {7, 0}, {9, 3}};
  const DirectSplit split = SplitDirect(ranges, 0, 64);
  EXPECT_TRUE(split.direct.empty());
  ASSERT_EQ(split.staged.size(), 2u);
  EXPECT_EQ(split.staged[1].offset, 9u);
}

TEST(NcclWireTest, ALanesCommInitSaysHowItLaunches) {
  for (bool blocking : {false, true}) {
    const CommInitMsg msg{std::string(128, 'u'), blocking};
    const std::string frame = EncodeCommInit(msg);
    auto back = DecodeCommInit(frame);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, msg);
    // Without its launch word (a kvd-nccl/6 frame), or with one that is neither 0 nor 1: refused.
    EXPECT_FALSE(DecodeCommInit(frame.substr(0, frame.size() - 4)).ok());
    std::string bad = frame;
    bad[bad.size() - 4] = 2;
    EXPECT_FALSE(DecodeCommInit(bad).ok());
  }
}

TEST(NcclWireTest, DataAnnouncementCarriesTheDirectThreshold) {
  DataMsg msg;
  msg.seq = 3;
  msg.region_id = 4;
  msg.chunk_bytes = 1 << 20;
  msg.direct_bytes = 8 << 20;
  msg.ranges = {{16, 32}, {64, 8}};
  const std::string frame = EncodeData(msg);
  auto back = DecodeData(frame);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->direct_bytes, msg.direct_bytes);
  EXPECT_EQ(back->chunk_bytes, msg.chunk_bytes);
  ASSERT_EQ(back->ranges.size(), 2u);
  EXPECT_EQ(back->ranges[1].offset, 64u);
  EXPECT_FALSE(DecodeData(frame.substr(0, frame.size() - 1)).ok());
  // A chunk below kMinChunkBytes would list a range one tiny piece at a time: refused.
  msg.chunk_bytes = kMinChunkBytes - 1;
  EXPECT_FALSE(DecodeData(EncodeData(msg)).ok());
  msg.chunk_bytes = kMinChunkBytes;
  EXPECT_TRUE(DecodeData(EncodeData(msg)).ok());
}

TEST(NcclWireTest, DataAnnouncementCarriesRunGroupRows) {
  DataMsg msg;
  msg.chunk_bytes = kMinChunkBytes;
  msg.ranges = {{0, 8}};
  msg.strided = {{4096, 1024, 16, 4096}, {1 << 20, 512, 3, -2048, 5, -8192}};
  const std::string frame = EncodeData(msg);
  auto back = DecodeData(frame);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->strided.size(), 2u);
  EXPECT_EQ(back->strided[0].count, 16u);
  EXPECT_EQ(back->strided[0].outer_count, 1u);
  EXPECT_EQ(back->strided[1].stride, -2048);
  EXPECT_EQ(back->strided[1].outer_count, 5u);
  EXPECT_EQ(back->strided[1].outer_stride, -8192);
  EXPECT_EQ(*TotalBytes(back->ranges, back->strided), 8u + 16 * 1024 + 5 * 3 * 512);
  EXPECT_FALSE(DecodeData(frame.substr(0, frame.size() - 8)).ok());
  // Two shapes, two runs: the frame ends with the last run's group count and its one offset.
  // A count that the frame cannot hold is refused before anything is allocated, and so is none.
  std::string forged = frame;
  forged[frame.size() - 16 + 7] = '\x7f';
  EXPECT_FALSE(DecodeData(forged).ok());
  forged = frame;
  forged[frame.size() - 16] = '\0';
  EXPECT_FALSE(DecodeData(forged).ok());
  // So is a run count the frame cannot hold (the first run's header follows it).
  forged = frame;
  forged[frame.size() - 2 * 56 - 8 + 7] = '\x7f';
  EXPECT_FALSE(DecodeData(forged).ok());
}

// A batch's groups nearly all share one shape (a page's head of 512 B rows): each costs the
// announcement its first offset alone, and the shapes and their order come back as they were.
TEST(NcclWireTest, RowsOfOneShapeTravelAsTheirOffsets) {
  DataMsg msg;
  msg.chunk_bytes = kMinChunkBytes;
  for (uint64_t i = 0; i < 1000; ++i) msg.strided.push_back({i * 8192, 512, 16, 512});
  const std::string one_shape = EncodeData(msg);
  EXPECT_LT(one_shape.size(), 1000 * 8 + 128);
  msg.strided.insert(msg.strided.begin() + 500, {1 << 30, 100, 3, -4096});
  msg.strided.push_back({7, 512, 15, 512});
  msg.strided.push_back({7, 512, 15, 512, 8, 8192});
  auto back = DecodeData(EncodeData(msg));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->strided.size(), msg.strided.size());
  for (size_t i = 0; i < msg.strided.size(); ++i) {
    const Strided &a = back->strided[i], &b = msg.strided[i];
    EXPECT_EQ(a, b) << i;
  }
}

// A put writes each destination byte once, and a get asks for each source byte once, so their
// bytes are bounded by the region's: a peer's announcement or request of more (ranges repeating
// one stretch) is refused before any chunk is laid out.
TEST(NcclWireTest, APutOfMoreBytesThanItsRegionIsRefused) {
  EXPECT_TRUE(CheckBatchSize(4096, 4096).ok());
  EXPECT_TRUE(CheckBatchSize(0, 0).ok());
  const std::vector<Range> again(3, Range{0, 4096});  // each inside the region on its own
  EXPECT_TRUE(CheckRanges(again, 8192).ok());
  auto total = TotalBytes(again);
  ASSERT_TRUE(total.ok());
  const Status s = CheckBatchSize(*total, 8192);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("12288"), std::string::npos) << s.ToString();
}

// Rows whose extent below the first row passes 2^64 wrap around to offsets anywhere: 37 rows
// INT64_MIN bytes apart from offset 8 put row 1 at 2^63 + 8. Refused, whatever the first offset
// (fuzz_nccl_wire found this shape accepted).
TEST(NcclWireTest, RowsWhoseExtentWrapsAroundAreRefused) {
  const int64_t most_negative = std::numeric_limits<int64_t>::min();
  for (uint64_t count : {2ull, 3ull, 37ull}) {
    for (uint64_t offset : {0ull, 8ull, 4096ull}) {
      const std::vector<Strided> rows = {{offset, 512, count, most_negative}};
      const Status s = CheckStrided(rows, 16 << 20, 1 << 20);
      EXPECT_EQ(s.code(), Code::kOutOfRange) << count << " rows from " << offset;
    }
  }
  // The same rows a page apart, downwards from the top of the region, still pass.
  const std::vector<Strided> down = {{(16 << 20) - 4096, 512, 16, -4096}};
  EXPECT_TRUE(CheckStrided(down, 16 << 20, 1 << 20).ok());
}

TEST(NcclWireTest, APeersRowsMustLieInTheRegionApartAndWithinAChunk) {
  const uint64_t region = 1 << 20, chunk = 64 << 10;
  EXPECT_TRUE(CheckStrided({{{0, 1024, 16, 2048}}}, region, chunk).ok());
  EXPECT_TRUE(CheckStrided({{{region - 1024, 1024, 4, -4096}}}, region, chunk).ok());
  EXPECT_EQ(CheckStrided({{{region - 1024, 1024, 2, 1024}}}, region, chunk).code(),
            Code::kOutOfRange);
  EXPECT_EQ(CheckStrided({{{1024, 1024, 2, -2048}}}, region, chunk).code(), Code::kOutOfRange);
  EXPECT_FALSE(CheckStrided({{{0, 1024, 2, 512}}}, region, chunk).ok());   // rows overlap
  EXPECT_FALSE(CheckStrided({{{0, 1024, 0, 2048}}}, region, chunk).ok());  // no rows
  EXPECT_FALSE(CheckStrided({{{0, 0, 4, 2048}}}, region, chunk).ok());     // empty rows
  EXPECT_FALSE(CheckStrided({{{0, chunk + 1, 1, 0}}}, region, chunk).ok());
  EXPECT_FALSE(TotalBytes({}, {{{0, 1ull << 40, 1ull << 30, 1ull << 40}}}).ok());
  // Groups of one shape that fit one by one overflow together (4 · 2^62 = 2^64).
  const std::vector<Strided> quarters(4, {0, 1ull << 62, 1, 0});
  EXPECT_FALSE(TotalBytes({}, quarters).ok());
  const std::vector<Range> five = {{0, 5}};
  EXPECT_EQ(*TotalBytes(five, std::span(quarters).first(2)), (1ull << 63) + 5);
}

// Blocks repeated at a second stride: each at least kMinBlockBytes and clear of the next, and
// their whole extent inside the region, whichever way either stride points.
TEST(NcclWireTest, APeersBlocksMustHoldEnoughBytesAndNotOverlap) {
  const uint64_t region = 1 << 20, chunk = 64 << 10;
  // A page converted LBNHC -> BLHNC: 8 heads of 16 rows of 512 B, the heads 8 KiB apart.
  EXPECT_TRUE(CheckStrided({{{0, 512, 16, 512, 8, 8192}}}, region, chunk).ok());
  EXPECT_TRUE(CheckStrided({{{region - 8192, 512, 16, 512, 8, -8192}}}, region, chunk).ok());
  EXPECT_TRUE(CheckStrided({{{region - 512, 512, 16, -512, 8, -8192}}}, region, chunk).ok());
  EXPECT_EQ(CheckStrided({{{region - 8192 * 7, 512, 16, 512, 8, 8192}}}, region, chunk).code(),
            Code::kOutOfRange);
  EXPECT_EQ(CheckStrided({{{8192 * 6, 512, 16, 512, 8, -8192}}}, region, chunk).code(),
            Code::kOutOfRange);
  // Blocks that overlap (8 KiB each, 4 KiB apart), of too few bytes, or none at all.
  EXPECT_EQ(CheckStrided({{{0, 512, 16, 512, 8, 4096}}}, region, chunk).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(CheckStrided({{{0, 512, 4, 512, 8, 8192}}}, region, chunk).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(CheckStrided({{{0, 512, 16, 512, 0, 8192}}}, region, chunk).code(),
            Code::kInvalidArgument);
  // One block needs no outer stride, however small.
  EXPECT_TRUE(CheckStrided({{{0, 512, 4, 512, 1, 0}}}, region, chunk).ok());
  // An outer extent past 2^64 below the first row is refused, not wrapped.
  const int64_t most_negative = std::numeric_limits<int64_t>::min();
  for (uint64_t blocks : {2ull, 3ull, 37ull}) {
    const Status s = CheckStrided({{{8, 4096, 1, 0, blocks, most_negative}}}, region, chunk);
    EXPECT_EQ(s.code(), Code::kOutOfRange) << blocks;
  }
  // Bytes overflow through the blocks too.
  EXPECT_FALSE(TotalBytes({}, {{{0, 1 << 20, 1 << 20, 1 << 20, 1ull << 30, 1ull << 40}}}).ok());
  EXPECT_EQ(*TotalBytes({}, {{{0, 512, 16, 512, 8, 8192}}}), 64u << 10);
}

// kvbench's LBNHC -> BLHNC request, random block ids: SplitGroups makes each page's 8 head groups
// one entry of 8 blocks on both sides, the rows in the same order as the plan's, and the
// receiver's view passes the peer's checks.
TEST(NcclWireTest, APagesHeadGroupsTravelAsOneEntryOfBlocks) {
  const int64_t blocks = 64;
  const Conversion c(blocks, 7);
  Plan plan;
  ASSERT_TRUE(c.Append(PlanEntries::kGroups, 1, 2, &plan).ok());
  ASSERT_EQ(plan.groups.size(), static_cast<size_t>(blocks) * 8);

  DataMsg msg;
  msg.chunk_bytes = 32 << 20;
  std::vector<Range> gather;
  std::vector<Strided> rows;
  SplitGroups(plan.groups, msg.chunk_bytes, &msg, &gather, &rows);
  EXPECT_TRUE(gather.empty());
  ASSERT_EQ(msg.strided.size(), static_cast<size_t>(blocks));
  ASSERT_EQ(rows.size(), msg.strided.size());
  EXPECT_EQ(msg.strided[0].outer_count, 8u);
  EXPECT_EQ(rows[0].outer_count, 8u);
  std::vector<kv::Run> expected;
  ExpandGroups(plan.groups, &expected);
  const std::vector<kv::Run> sent = RowsOf(rows, true), landed = RowsOf(msg.strided, false);
  ASSERT_EQ(sent.size(), expected.size());
  ASSERT_EQ(landed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(sent[i].src_offset, expected[i].src_offset) << i;
    ASSERT_EQ(landed[i].dst_offset, expected[i].dst_offset) << i;
    ASSERT_EQ(sent[i].length, expected[i].length) << i;
  }
  EXPECT_TRUE(CheckStrided(msg.strided, c.dst.span_bytes(), 32 << 20).ok());
  EXPECT_EQ(*TotalBytes({}, msg.strided), plan.bytes);
  auto back = DecodeData(EncodeData(msg));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->strided, msg.strided);
}

// The planner's blocks (PlanEntries::kGroupBlocks) announced as such: the same entries, rows in
// the same order, as SplitGroups makes of the plan's groups.
TEST(NcclWireTest, ThePlannersBlocksTravelAsTheEntriesSplitGroupsMakes) {
  const int64_t blocks = 64;
  const Conversion c(blocks, 9);
  Plan g, b;
  ASSERT_TRUE(c.Append(PlanEntries::kGroups, 1, 2, &g).ok());
  ASSERT_TRUE(c.Append(PlanEntries::kGroupBlocks, 1, 2, &b).ok());
  ASSERT_EQ(b.blocks.size(), static_cast<size_t>(blocks));
  DataMsg from_groups, from_blocks;
  std::vector<Range> gather_g, gather_b;
  std::vector<Strided> rows_g, rows_b;
  SplitGroups(g.groups, 32 << 20, &from_groups, &gather_g, &rows_g);
  SplitBlocks(b.blocks, 32 << 20, &from_blocks, &gather_b, &rows_b);
  EXPECT_EQ(from_blocks.strided, from_groups.strided);
  EXPECT_EQ(rows_b, rows_g);
  EXPECT_TRUE(gather_b.empty());
  EXPECT_TRUE(CheckStrided(from_blocks.strided, c.dst.span_bytes(), 32 << 20).ok());
}

// A block the receiver would refuse whole (blocks under kMinBlockBytes, rows longer than a
// chunk) goes as SplitGroups sends its groups; one of a single block goes as it is.
TEST(NcclWireTest, BlocksTheReceiverWouldRefuseGoAsTheirGroups) {
  auto split = [](const GroupBlocks& b, uint64_t chunk_bytes) {
    DataMsg msg;
    std::vector<Range> gather;
    std::vector<Strided> rows;
    SplitBlocks(std::span(&b, 1), chunk_bytes, &msg, &gather, &rows);
    EXPECT_EQ(msg.strided.size(), rows.size());
    EXPECT_EQ(msg.ranges.size(), gather.size());
    EXPECT_TRUE(CheckStrided(msg.strided, 1 << 30, chunk_bytes).ok());
    return std::make_pair(msg.strided.size(), msg.ranges.size());
  };
  // 2 KiB blocks: too small as blocks, so two entries of one block each.
  EXPECT_EQ(split({{0, 0, 512, 4, 4096, 512}, 2, 512, 8192}, 1 << 20), std::make_pair(2ul, 0ul));
  // 8 KiB blocks: one entry.
  EXPECT_EQ(split({{0, 0, 512, 16, 4096, 512}, 8, 512, 8192}, 1 << 20), std::make_pair(1ul, 0ul));
  // Rows of 8 KiB with 4 KiB chunks: every row as a range.
  EXPECT_EQ(split({{0, 0, 8192, 2, 8192, 8192}, 3, 1 << 16, 1 << 16}, 4096),
            std::make_pair(0ul, 6ul));
}

// Groups become blocks of one entry only where the receiver's checks would take it: blocks of
// kMinBlockBytes that do not overlap there, at one step on both sides.
TEST(NcclWireTest, GroupsThatTheChecksWouldRefuseAsBlocksStayApart) {
  auto split = [](const std::vector<RunGroup>& groups) {
    DataMsg msg;
    std::vector<Range> gather;
    std::vector<Strided> rows;
    SplitGroups(groups, 1 << 20, &msg, &gather, &rows);
    EXPECT_EQ(msg.strided.size(), rows.size());
    EXPECT_TRUE(CheckStrided(msg.strided, 1 << 30, 1 << 20).ok());
    return msg.strided.size();
  };
  // 16 rows of 512 B contiguous on the receiver: 8 KiB blocks, 8 KiB apart, then 4 KiB apart.
  EXPECT_EQ(split({{0, 0, 512, 16, 4096, 512},
                   {512, 8192, 512, 16, 4096, 512},
                   {1024, 16384, 512, 16, 4096, 512}}),
            1u);
  EXPECT_EQ(split({{0, 0, 512, 16, 4096, 512}, {512, 4096, 512, 16, 4096, 512}}), 2u);
  // Blocks of 2 KiB: too small.
  EXPECT_EQ(split({{0, 0, 512, 4, 4096, 512}, {512, 8192, 512, 4, 4096, 512}}), 2u);
  // A third group off the step, or of another shape, starts an entry of its own.
  EXPECT_EQ(split({{0, 0, 512, 16, 4096, 512},
                   {512, 8192, 512, 16, 4096, 512},
                   {1024, 20000, 512, 16, 4096, 512}}),
            2u);
  EXPECT_EQ(split({{0, 0, 512, 16, 4096, 512}, {512, 8192, 512, 16, 2048, 512}}), 2u);
}

// Rows gathered chunk by chunk on the sender and scattered chunk by chunk on the receiver, each
// side chunking its own view (same lengths and counts, other offsets and strides), give what
// the groups copied directly give.
TEST(NcclWireTest, RowsGatheredIntoChunksAndScatteredLandWhereTheGroupsSay) {
  std::mt19937_64 rng(5);
  const uint64_t region = 4 << 20, chunk_bytes = 8192;
  std::vector<uint8_t> src(region), dst(region, 0), expected(region, 0), tabled(region, 0);
  std::iota(src.begin(), src.end(), 0);
  std::vector<Strided> sender, receiver;
  uint64_t dst_at = 0;
  for (int i = 0; i < 60; ++i) {
    const uint64_t length = 1 + rng() % 3000, count = 1 + rng() % 12;
    const uint64_t blocks = i % 3 == 0 ? 1 : 1 + rng() % 5;  // entries of several blocks too
    const int64_t src_stride = static_cast<int64_t>(length + rng() % 100);
    const int64_t src_outer = static_cast<int64_t>(rng() % 512) - 256;  // may overlap: reads
    const uint64_t src_at = 2048 + rng() % (region / 2);
    const int64_t dst_stride = static_cast<int64_t>(length + rng() % 64);
    const uint64_t block_span = (count - 1) * static_cast<uint64_t>(dst_stride) + length;
    const int64_t dst_outer = static_cast<int64_t>(block_span + rng() % 64);
    sender.push_back({src_at, length, count, src_stride, blocks, src_outer});
    receiver.push_back({dst_at, length, count, dst_stride, blocks, dst_outer});
    dst_at += blocks * static_cast<uint64_t>(dst_outer);
  }
  ASSERT_LT(dst_at, region);
  const std::vector<kv::Run> reads = RowsOf(sender, true), writes = RowsOf(receiver, false);
  ASSERT_EQ(reads.size(), writes.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    std::memcpy(expected.data() + writes[i].dst_offset, src.data() + reads[i].src_offset,
                reads[i].length);
  }
  const GroupChunks gather = ChunkGroups(sender, chunk_bytes, Direction::kGather);
  const GroupChunks scatter = ChunkGroups(receiver, chunk_bytes, Direction::kScatter);
  ASSERT_EQ(gather.bytes, scatter.bytes);
  ASSERT_GT(gather.count(), 1u);
  std::vector<uint8_t> staging(chunk_bytes);
  uint64_t moved = 0;
  for (size_t k = 0; k < gather.count(); ++k) {
    EXPECT_LE(gather.bytes[k], chunk_bytes);
    kernels::CopyBlocksHost(src.data(), staging.data(), gather.chunk(k));
    kernels::CopyBlocksHost(staging.data(), dst.data(), scatter.chunk(k));
    moved += gather.bytes[k];
  }
  EXPECT_EQ(moved, *TotalBytes({}, receiver));
  EXPECT_TRUE(dst == expected);

  // The same chunks through the copy kernels' tables (what RunTables uploads), run on the host.
  const Chunks no_runs;
  TableLayout gather_layout, scatter_layout;
  LayOutTables(no_runs, gather, &gather_layout);
  LayOutTables(no_runs, scatter, &scatter_layout);
  std::vector<uint64_t> gather_table(gather_layout.table_bytes / 8 + 2);
  std::vector<uint64_t> scatter_table(scatter_layout.table_bytes / 8 + 2);
  ASSERT_TRUE(EncodeTables(no_runs, gather, gather_layout, gather_table.data()).ok());
  ASSERT_TRUE(EncodeTables(no_runs, scatter, scatter_layout, scatter_table.data()).ok());
  ASSERT_EQ(gather_layout.chunks(), gather.count());
  for (size_t k = 0; k < gather.count(); ++k) {
    const auto* g = reinterpret_cast<const char*>(gather_table.data()) + gather_layout.group_table;
    const auto* s =
        reinterpret_cast<const char*>(scatter_table.data()) + scatter_layout.group_table;
    kernels::CopyBlockTableHost(src.data(), staging.data(),
                                g + gather_layout.first[k] * sizeof(kernels::PlanCopyBlockChunk),
                                gather_layout.count[k]);
    kernels::CopyBlockTableHost(staging.data(), tabled.data(),
                                s + scatter_layout.first[k] * sizeof(kernels::PlanCopyBlockChunk),
                                scatter_layout.count[k]);
  }
  EXPECT_TRUE(tabled == expected);
}

}  // namespace
}  // namespace kv::transport::nccl
