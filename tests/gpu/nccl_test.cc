// Failure modes of the nccl backend's link management and pipeline, between processes on two
// GPUs: a silent connection must not hold up other peers' hellos, and a peer that dies while a
// batch of thousands of chunks is in flight must fail that batch well within its deadline and
// leave the sender able to serve a new peer.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "tests/gpu/gpu_peers.h"
#include "transport/cuda_ipc/side_channel.h"

namespace kv::transport::gputest {
namespace {

using namespace std::chrono_literals;

constexpr int kSeed = 11;
constexpr uint64_t kSmall = 1 << 20;

TEST(GpuNcclTest, SilentConnectionDoesNotStallOtherPeers) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  auto sender = StartPeer({"nccl", 0, kSmall, kSeed});
  auto receiver = StartPeer({"nccl", 1, kSmall, -1});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  // Connected and silent: its hello never comes. Accepted first, it held the receiver's accept
  // loop for the whole handshake timeout (20 s in these peers) before hellos progressed apart.
  auto silent = gpu::Socket::Connect(receiver->address, Clock::now() + 5s);
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  std::this_thread::sleep_for(100ms);  // the receiver accepts it before the sender connects

  const std::vector<kv::Run> runs = {{0, 0, kSmall}};
  const auto start = Clock::now();
  Status put = Transfer(*sender, *receiver, Op::kPut, runs);
  ASSERT_TRUE(put.ok()) << put.ToString();
  EXPECT_LT(Clock::now() - start, 10s);  // connect, communicators and the batch
  auto bytes = Dump(*receiver);
  ASSERT_TRUE(bytes.ok());
  EXPECT_TRUE(*bytes == Expected(kSmall, kSeed, runs));
  EXPECT_TRUE(Stop(*sender).ok());
  EXPECT_TRUE(Stop(*receiver).ok());
}

TEST(GpuNcclTest, PeerDyingMidPipelineFailsTheBatchWithinItsDeadline) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  // 8192 chunks of the peers' 64 KiB staging: at tens of µs per NCCL operation the batch is
  // still in its pipeline, with slots and lanes full, long after the kill below.
  constexpr uint64_t kBig = 512ull << 20;
  auto sender = StartPeer({"nccl", 0, kBig, kSeed});
  auto receiver = StartPeer({"nccl", 1, kBig, -1});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  const std::vector<kv::Run> small = {{0, 0, kSmall}};
  ASSERT_TRUE(Transfer(*sender, *receiver, Op::kPut, small).ok());  // link and lanes are up

  const std::vector<kv::Run> all = {{0, 0, kBig}};
  const auto start = Clock::now();
  auto put =
      std::async(std::launch::async, [&] { return Transfer(*sender, *receiver, Op::kPut, all); });
  std::this_thread::sleep_for(30ms);
  receiver->process->Kill();
  Status failed = put.get();
  EXPECT_TRUE(failed.code() == Code::kUnavailable || failed.code() == Code::kTimeout)
      << failed.ToString();
  EXPECT_LT(Clock::now() - start, 15s);  // the batch's deadline is 20 s in these peers

  // The dead link's communicators were aborted, not left spinning: a new peer gets its batch
  // through fresh ones, and the sender shuts down cleanly.
  auto fresh = StartPeer({"nccl", 1, kSmall, -1});
  ASSERT_TRUE(fresh.ok());
  Status again = Transfer(*sender, *fresh, Op::kPut, small);
  EXPECT_TRUE(again.ok()) << again.ToString();
  auto bytes = Dump(*fresh);
  ASSERT_TRUE(bytes.ok());
  EXPECT_TRUE(*bytes == Expected(kSmall, kSeed, small));
  EXPECT_TRUE(Stop(*sender).ok());
  EXPECT_TRUE(Stop(*fresh).ok());
}

}  // namespace
}  // namespace kv::transport::gputest
