// The nccl backend's batch schedule and its announcement, on the host: which ranges skip the
// staging (both sides derive it from the lengths alone, so it must be a pure function of them)
// and that the threshold survives the wire. Beside the backend, whose internals it tests
// (registered in tests/gpu).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kv::transport::nccl
