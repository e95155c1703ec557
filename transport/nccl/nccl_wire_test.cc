// The nccl backend's batch schedule and its announcement, on the host: which ranges skip the
// staging (both sides derive it from the lengths alone, so it must be a pure function of them),
// that the threshold and a put's run groups survive the wire, that a peer's rows are checked,
// and that rows gathered into chunks and scattered from them land where the groups say. Beside
// the backend, whose internals it tests (registered in tests/gpu).
#include <gtest/gtest.h>

#include <limits>
#include <numeric>
#include <random>

#include "kernels/plan_copy.h"
#include "transport/nccl/wire.h"

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
  msg.strided = {{4096, 1024, 16, 4096}, {1 << 20, 512, 3, -2048}};
  const std::string frame = EncodeData(msg);
  auto back = DecodeData(frame);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->strided.size(), 2u);
  EXPECT_EQ(back->strided[0].count, 16u);
  EXPECT_EQ(back->strided[1].stride, -2048);
  EXPECT_EQ(*TotalBytes(back->ranges, back->strided), 8u + 16 * 1024 + 3 * 512);
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
  forged[frame.size() - 2 * 40 - 8 + 7] = '\x7f';
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
  auto back = DecodeData(EncodeData(msg));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->strided.size(), msg.strided.size());
  for (size_t i = 0; i < msg.strided.size(); ++i) {
    const Strided &a = back->strided[i], &b = msg.strided[i];
    EXPECT_TRUE(a.offset == b.offset && a.length == b.length && a.count == b.count &&
                a.stride == b.stride)
        << i;
  }
}

// A put writes each destination byte once, so its bytes are bounded by the region's: a peer's
// announcement of more (ranges repeating one stretch) is refused before any chunk is laid out.
TEST(NcclWireTest, APutOfMoreBytesThanItsRegionIsRefused) {
  EXPECT_TRUE(CheckPutSize(4096, 4096).ok());
  EXPECT_TRUE(CheckPutSize(0, 0).ok());
  const std::vector<Range> again(3, Range{0, 4096});  // each inside the region on its own
  EXPECT_TRUE(CheckRanges(again, 8192).ok());
  auto total = TotalBytes(again);
  ASSERT_TRUE(total.ok());
  const Status s = CheckPutSize(*total, 8192);
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

// Rows gathered chunk by chunk on the sender and scattered chunk by chunk on the receiver, each
// side chunking its own view (same lengths and counts, other offsets and strides), give what
// the groups copied directly give.
TEST(NcclWireTest, RowsGatheredIntoChunksAndScatteredLandWhereTheGroupsSay) {
  std::mt19937_64 rng(5);
  const uint64_t region = 1 << 20, chunk_bytes = 8192;
  std::vector<uint8_t> src(region), dst(region, 0), expected(region, 0);
  std::iota(src.begin(), src.end(), 0);
  std::vector<Strided> sender, receiver;
  std::vector<RunGroup> groups;
  uint64_t dst_at = 0;
  for (int i = 0; i < 40; ++i) {
    const uint64_t length = 1 + rng() % 3000, count = 1 + rng() % 12;
    const int64_t src_stride = static_cast<int64_t>(length + rng() % 100);
    const uint64_t src_at = rng() % (region - count * (length + 100));
    const int64_t dst_stride = static_cast<int64_t>(length + rng() % 64);
    sender.push_back({src_at, length, count, src_stride});
    receiver.push_back({dst_at, length, count, dst_stride});
    groups.push_back({src_at, dst_at, length, count, src_stride, dst_stride});
    dst_at += count * static_cast<uint64_t>(dst_stride);
  }
  ASSERT_LT(dst_at, region);
  kernels::CopyGroupsHost(src.data(), expected.data(), groups);
  const GroupChunks gather = ChunkGroups(sender, chunk_bytes, Direction::kGather);
  const GroupChunks scatter = ChunkGroups(receiver, chunk_bytes, Direction::kScatter);
  ASSERT_EQ(gather.bytes, scatter.bytes);
  ASSERT_GT(gather.count(), 1u);
  std::vector<uint8_t> staging(chunk_bytes);
  uint64_t moved = 0;
  for (size_t k = 0; k < gather.count(); ++k) {
    EXPECT_LE(gather.bytes[k], chunk_bytes);
    kernels::CopyGroupsHost(src.data(), staging.data(), gather.chunk(k));
    kernels::CopyGroupsHost(staging.data(), dst.data(), scatter.chunk(k));
    moved += gather.bytes[k];
  }
  EXPECT_EQ(moved, *TotalBytes({}, receiver));
  EXPECT_TRUE(dst == expected);
}

}  // namespace
}  // namespace kv::transport::nccl
