// "ucx" with GPU regions where UCX has no CUDA support: the staged decorator gathers on the
// sender's GPU into pinned slots, UCX moves the slots, the receiver scatters on its GPU. Two
// processes on one GPU are enough (the path crosses host memory either way): a layout
// conversion (LBNHC → BLHNC, random block ids, a partial last block) put and verified byte for
// byte after the sender's notification, a put held in kvd's event gate for an engine's event, one
// whose event never fires, the mirror get, and a killed receiver failing the next batch.
#include <gtest/gtest.h>

#include "layout/kv_region.h"
#include "layout/plan.h"
#include "tests/support/gpu_peers.h"

namespace kv::transport::gputest {
namespace {

constexpr int kSrcSeed = 3;

LayoutSpec Spec(const std::string& order, int64_t blocks) {
  LayoutSpec s;
  s.order = order;
  s.layers = 4;
  s.blocks = blocks;
  s.heads = 4;
  s.block_size = 16;
  s.content_bytes = 256;
  return s;
}

class StagedGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() < 1) GTEST_SKIP() << "needs a CUDA device";
  }
  Peer Start(uint64_t bytes, int seed) {
    auto peer = StartPeer({"ucx", 0, bytes, seed});
    EXPECT_TRUE(peer.ok()) << peer.status().ToString();
    return peer.ok() ? std::move(*peer) : Peer{};
  }
};

TEST_F(StagedGpuTest, PutConvertsLayoutBetweenGpuRegionsAndNotifiesAfterTheScatter) {
  Planned p = PlanRandomBlocks(Spec("LBNHC", 32), Spec("BLHNC", 40), 200);
  ASSERT_GT(p.runs.size(), 1u);
  Peer sender = Start(p.src_bytes, kSrcSeed);
  Peer receiver = Start(p.dst_bytes, -1);
  ASSERT_TRUE(sender.process && receiver.process);

  // The harness's 64 KiB slots cut this batch into many chunks: slots are reused many times.
  TransferOptions noted;
  noted.note = "layer-done";
  Status put = Transfer(sender, receiver, Op::kPut, p.runs, noted);
  ASSERT_TRUE(put.ok()) << put.ToString();
  ASSERT_TRUE(WaitForNote(receiver, "layer-done").ok());
  auto bytes = Dump(receiver);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_TRUE(*bytes == Expected(p.dst_bytes, kSrcSeed, p.runs));

  std::vector<kv::Run> outside = {{0, p.dst_bytes - 8, 16}};
  EXPECT_EQ(Code::kOutOfRange, Transfer(sender, receiver, Op::kPut, outside).code());
  EXPECT_TRUE(Stop(sender).ok());
  EXPECT_TRUE(Stop(receiver).ok());
}

// kvd orders a layer's transfer after the engine's event: its event gate posts the batch, and so
// starts the gathers, once it fired.
TEST_F(StagedGpuTest, GatedPostWaitsForTheEngineEvent) {
  Planned p = PlanRandomBlocks(Spec("LBNHC", 32), Spec("BLHNC", 32), 160);
  Peer sender = Start(p.src_bytes, kSrcSeed);
  Peer receiver = Start(p.dst_bytes, -1);
  ASSERT_TRUE(sender.process && receiver.process);
  TransferOptions gated;
  gated.gated = true;
  gated.note = "in";
  Status put = Transfer(sender, receiver, Op::kPut, p.runs, gated);
  ASSERT_TRUE(put.ok()) << put.ToString();
  ASSERT_TRUE(WaitForNote(receiver, "in").ok());
  auto bytes = Dump(receiver);
  ASSERT_TRUE(bytes.ok());
  EXPECT_TRUE(*bytes == Expected(p.dst_bytes, kSrcSeed, p.runs));
}

// An engine killed mid-layer leaves that layer's event unfired for good. The batch waiting for
// it fails alone at its deadline in kvd's event gate having copied nothing, and a batch posted
// beside it lands meanwhile (gathers that waited for the event on the device would have held
// that one too).
TEST_F(StagedGpuTest, ABatchWhoseEventNeverFiresExpiresAndHoldsUpNoOther) {
  Planned p = PlanRandomBlocks(Spec("LBNHC", 32), Spec("LBNHC", 32), 256);
  Peer sender = Start(p.src_bytes, kSrcSeed);
  Peer receiver = Start(p.dst_bytes, -1);
  ASSERT_TRUE(sender.process && receiver.process);
  ExpectTheHeldBatchWritesNothing(sender, receiver, p, kSrcSeed);
  EXPECT_TRUE(Stop(sender).ok());
  EXPECT_TRUE(Stop(receiver).ok());
}

TEST_F(StagedGpuTest, GetPullsIntoTheCallersLayout) {
  Planned p = PlanRandomBlocks(Spec("BLHNC", 24), Spec("LBNHC", 48), 333);
  Peer holder = Start(p.src_bytes, kSrcSeed);
  Peer puller = Start(p.dst_bytes, -1);
  ASSERT_TRUE(holder.process && puller.process);
  Status got = Transfer(puller, holder, Op::kGet, p.runs);
  ASSERT_TRUE(got.ok()) << got.ToString();
  auto bytes = Dump(puller);
  ASSERT_TRUE(bytes.ok());
  EXPECT_TRUE(*bytes == Expected(p.dst_bytes, kSrcSeed, p.runs));
  EXPECT_TRUE(Stop(holder).ok());
  EXPECT_TRUE(Stop(puller).ok());
}

TEST_F(StagedGpuTest, KilledReceiverFailsTheNextBatchInsteadOfHanging) {
  Planned p = PlanRandomBlocks(Spec("LBNHC", 32), Spec("LBNHC", 32), 256);
  Peer sender = Start(p.src_bytes, kSrcSeed);
  Peer receiver = Start(p.dst_bytes, -1);
  ASSERT_TRUE(sender.process && receiver.process);
  ASSERT_TRUE(Transfer(sender, receiver, Op::kPut, p.runs).ok());  // the path works first
  receiver.process->Kill();
  Status after = Transfer(sender, receiver, Op::kPut, p.runs);
  EXPECT_TRUE(after.code() == Code::kUnavailable || after.code() == Code::kTimeout)
      << after.ToString();
  EXPECT_TRUE(Stop(sender).ok());
}

}  // namespace
}  // namespace kv::transport::gputest
