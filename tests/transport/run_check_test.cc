// CheckBatch: run groups are bounds-checked row by row (first and last row), and refused by
// every backend that does not take them.
#include <gtest/gtest.h>

#include "transport/run_check.h"
#include "transport/transport.h"

namespace kv::transport {
namespace {

class Region final : public MemoryRegistration, public RemoteMemory {
 public:
  explicit Region(uint64_t bytes) : bytes_(bytes) {}
  void* base() const override { return nullptr; }
  uint64_t length() const override { return bytes_; }
  MemoryLocation location() const override { return MemoryLocation::Host(); }
  std::string packed_descriptor() const override { return {}; }
  PeerId peer() const override { return 1; }

 private:
  uint64_t bytes_;
};

TEST(RunCheck, GroupsAreCheckedAndRefusedWhereNotTaken) {
  const Region local(1000), remote(2000);
  const RunGroup fits{0, 0, 100, 10, 100, 200};
  const RunGroup past_source{0, 0, 100, 10, 101, 100};
  Batch batch;
  batch.local = &local;
  batch.remote = &remote;
  batch.groups = std::span(&fits, 1);
  EXPECT_TRUE(CheckBatch(batch, /*takes_groups=*/true).ok());
  EXPECT_EQ(CheckBatch(batch).code(), Code::kUnsupported);
  batch.groups = std::span(&past_source, 1);
  EXPECT_EQ(CheckBatch(batch, true).code(), Code::kOutOfRange);
  // A get reads the remote side: 2000 bytes there, so the same group fits.
  batch.op = Op::kGet;
  EXPECT_TRUE(CheckBatch(batch, true).ok());
}

TEST(RunCheck, BlocksAreCheckedAndRefusedWhereNotTaken) {
  const Region local(1 << 16), remote(1 << 16);
  // An LBNHC page's 8 heads converted to BLHNC: exactly 64 KiB on both sides.
  const GroupBlocks page{{0, 0, 512, 16, 4096, 512}, 8, 512, 8192};
  const GroupBlocks past_destination{{0, 512, 512, 16, 4096, 512}, 8, 512, 8192};
  Batch batch;
  batch.local = &local;
  batch.remote = &remote;
  batch.blocks = std::span(&page, 1);
  EXPECT_TRUE(CheckBatch(batch, /*takes_groups=*/true, /*takes_blocks=*/true).ok());
  EXPECT_EQ(CheckBatch(batch, true).code(), Code::kUnsupported);
  EXPECT_EQ(CheckBatch(batch).code(), Code::kUnsupported);
  batch.blocks = std::span(&past_destination, 1);
  EXPECT_EQ(CheckBatch(batch, true, true).code(), Code::kOutOfRange);
}

TEST(RunCheck, LocalBackendRefusesGroups) {
  auto local = CreateTransport("local");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE((*local)->takes_run_groups());
  EXPECT_FALSE((*local)->takes_group_blocks());
}

}  // namespace
}  // namespace kv::transport
