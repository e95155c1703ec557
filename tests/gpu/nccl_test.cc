// The nccl backend between processes on two GPUs: a silent connection must not hold up other
// peers' hellos; a peer that dies while a batch of thousands of chunks is in flight must fail
// that batch well within its deadline and leave the sender able to serve a new peer; posts and
// notifications return at once while earlier batches wait on an engine's event; large runs that
// skip the staging land next to staged ones, pushed and pulled, with notes behind the data; and
// the two sides may group their NCCL launches differently.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "base/framed_socket.h"
#include "tests/support/gpu_peers.h"

namespace kv::transport::gputest {
namespace {

using namespace std::chrono_literals;

constexpr int kSeed = 11;
constexpr uint64_t kSmall = 1 << 20;
constexpr uint64_t kMiB = 1 << 20;

// The harness's staging is 64 KiB; runs of 256 KiB and more go direct, in 64 KiB pieces.
const Settings kDirect = {{"direct_bytes", "262144"}};

// Direct runs (1 MiB + 5 bytes, 300 KiB) between staged ones (4 KiB, 100 KiB, 17 bytes).
std::vector<kv::Run> MixedRuns() {
  return {{0, 8 * kMiB, 4096},
          {kMiB, 0, kMiB + 5},
          {3 * kMiB, 3 * kMiB + 64, 100 << 10},
          {5 * kMiB + 3, 5 * kMiB, 300 << 10},
          {7 * kMiB, 7 * kMiB + 1, 17}};
}

// Pulls `runs` from `holder` into a fresh peer on GPU 1 (with `settings`); every byte checked.
void ExpectPulled(Peer& holder, uint64_t bytes, const std::vector<kv::Run>& runs,
                  const Settings& settings = {}) {
  auto puller = StartPeer({"nccl", 1, bytes, -1}, settings);
  ASSERT_TRUE(puller.ok());
  Status got = Transfer(*puller, holder, Op::kGet, runs);
  ASSERT_TRUE(got.ok()) << got.ToString();
  auto pulled = Dump(*puller);
  ASSERT_TRUE(pulled.ok());
  EXPECT_TRUE(*pulled == Expected(bytes, kSeed, runs));
  EXPECT_TRUE(Stop(*puller).ok());
}

TEST(GpuNcclTest, SilentConnectionDoesNotStallOtherPeers) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  auto sender = StartPeer({"nccl", 0, kSmall, kSeed});
  auto receiver = StartPeer({"nccl", 1, kSmall, -1});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  // Connected and silent: its hello never comes. Accepted first, it held the receiver's accept
  // loop for the whole handshake timeout (20 s in these peers) before hellos progressed apart.
  auto silent = kv::Socket::Connect(receiver->address, Clock::now() + 5s);
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

// With blocking_launch too: the sender's own thread is then inside NCCL's launches or waiting for
// room behind kLaunchesAhead unfinished ones when the peer dies, and must come out all the same.
TEST(GpuNcclTest, PeerDyingMidPipelineFailsTheBatchWithinItsDeadline) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  // 8192 chunks of the peers' 64 KiB staging: at tens of µs per NCCL operation the batch is
  // still in its pipeline, with slots and lanes full, long after the kill below.
  constexpr uint64_t kBig = 512ull << 20;
  for (const Settings& settings : {Settings{}, Settings{{"blocking_launch", "1"}}}) {
    SCOPED_TRACE(settings.empty() ? "thread launches" : "blocking launches");
    auto sender = StartPeer({"nccl", 0, kBig, kSeed}, settings);
    auto receiver = StartPeer({"nccl", 1, kBig, -1}, settings);
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
    auto fresh = StartPeer({"nccl", 1, kSmall, -1}, settings);
    ASSERT_TRUE(fresh.ok());
    Status again = Transfer(*sender, *fresh, Op::kPut, small);
    EXPECT_TRUE(again.ok()) << again.ToString();
    auto bytes = Dump(*fresh);
    ASSERT_TRUE(bytes.ok());
    EXPECT_TRUE(*bytes == Expected(kSmall, kSeed, small));
    EXPECT_TRUE(Stop(*sender).ok());
    EXPECT_TRUE(Stop(*fresh).ok());
  }
}

// kvd posts every layer of a request as it is saved, long before the engine's GPU reaches it:
// batches wait in kvd's event gate (daemon/event_gate.h) for the first one's event, and the
// posts and the notification behind them must return without waiting for the event, the staging
// slots or the link's threads. The note still arrives only after the data of all of them.
TEST(GpuNcclGateTest, PostsAndNotifyReturnAtOnceWhileEarlierBatchesWaitOnAnEvent) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  constexpr uint64_t kBytes = 9 * kMiB;
  auto sender = StartPeer({"nccl", 0, kBytes, kSeed}, kDirect);
  auto receiver = StartPeer({"nccl", 1, kBytes, -1});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  const std::vector<kv::Run> runs = MixedRuns();
  ASSERT_TRUE(Transfer(*sender, *receiver, Op::kPut, {{0, 0, 4096}}).ok());  // link is up

  TransferOptions gated;
  gated.gated = true;
  gated.gated_batches = 12;  // past the slots and run tables the pipeline has
  gated.note_while_gated = true;
  gated.note = std::string(kSnapshotPrefix) + "all-in";
  Status put = Transfer(*sender, *receiver, Op::kPut, runs, gated);
  ASSERT_TRUE(put.ok()) << put.ToString();
  auto at_note = SnapshotAtNote(*receiver, gated.note);
  ASSERT_TRUE(at_note.ok()) << at_note.status().ToString();
  std::vector<kv::Run> all = {{0, 0, 4096}};  // the first batch, overwritten by the gated ones
  all.insert(all.end(), runs.begin(), runs.end());
  EXPECT_TRUE(*at_note == Expected(kBytes, kSeed, all)) << "the note came before the data";
  EXPECT_TRUE(Stop(*sender).ok());
  EXPECT_TRUE(Stop(*receiver).ok());
}

TEST(GpuNcclTest, DirectRunsLandBesideStagedOnesPushedAndPulled) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  constexpr uint64_t kBytes = 9 * kMiB;
  const std::vector<kv::Run> runs = MixedRuns();
  auto sender = StartPeer({"nccl", 0, kBytes, kSeed}, kDirect);
  auto receiver = StartPeer({"nccl", 1, kBytes, -1});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  // Two batches back to back, the note behind both: the second one's ops follow the first's on
  // the lanes, with nothing settled in between.
  std::vector<kv::Run> first(runs.begin(), runs.begin() + 2);
  std::vector<kv::Run> second(runs.begin() + 2, runs.end());
  ASSERT_TRUE(Transfer(*sender, *receiver, Op::kPut, first).ok());
  TransferOptions noted;
  noted.note = std::string(kSnapshotPrefix) + "pushed";
  Status put = Transfer(*sender, *receiver, Op::kPut, second, noted);
  ASSERT_TRUE(put.ok()) << put.ToString();
  auto at_note = SnapshotAtNote(*receiver, noted.note);
  ASSERT_TRUE(at_note.ok()) << at_note.status().ToString();
  EXPECT_TRUE(*at_note == Expected(kBytes, kSeed, runs));

  // A get: the holder (the sender, direct_bytes set) answers with direct pieces too.
  ExpectPulled(*sender, kBytes, runs);
  EXPECT_TRUE(Stop(*sender).ok());
  EXPECT_TRUE(Stop(*receiver).ok());
}

// Pushes MixedRuns() and `small_runs` runs of 4000 bytes (from 9 MiB on, clear of them; 16 per
// chunk of the harness's 64 KiB staging) from a peer set `first` to one set `second`, then the
// other way round, and pulls them back from each sender with the receiver's settings: every byte
// checked each time.
void ExpectEveryByteBothWays(uint64_t small_runs, const Settings& first, const Settings& second) {
  const uint64_t bytes = 9 * kMiB + small_runs * 4096 + kMiB;
  std::vector<kv::Run> runs = MixedRuns();
  for (uint64_t i = 0; i < small_runs; ++i) {
    runs.push_back({9 * kMiB + i * 4096, 9 * kMiB + i * 4096, 4000});
  }
  for (const auto& [send, receive] : {std::pair{first, second}, std::pair{second, first}}) {
    auto sender = StartPeer({"nccl", 0, bytes, kSeed}, send);
    auto receiver = StartPeer({"nccl", 1, bytes, -1}, receive);
    ASSERT_TRUE(sender.ok() && receiver.ok());
    Status put = Transfer(*sender, *receiver, Op::kPut, runs);
    ASSERT_TRUE(put.ok()) << put.ToString();
    auto landed = Dump(*receiver);
    ASSERT_TRUE(landed.ok());
    EXPECT_TRUE(*landed == Expected(bytes, kSeed, runs));
    ExpectPulled(*sender, bytes, runs, receive);
    EXPECT_TRUE(Stop(*sender).ok());
    EXPECT_TRUE(Stop(*receiver).ok());
  }
}

// Each side groups its NCCL launches on its own (group_ops): a sender launching four sends at once
// and a receiver launching one receive at a time, and the other way round, must still match
// every chunk, across many slot reuses (about 32 chunks), pushed and pulled.
TEST(GpuNcclTest, SidesGroupingTheirLaunchesDifferentlyLandEveryByte) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  ExpectEveryByteBothWays(512,
                          {{"staging_slots", "8"}, {"group_ops", "4"}, {"direct_bytes", "262144"}},
                          {{"group_ops", "1"}});
}

// The sending side decides how a direction's lanes launch (blocking_launch): a sender on blocking
// communicators facing a receiver set otherwise, and the other way round, land every chunk pushed
// and pulled, over more launches per lane than Lanes::kLaunchesAhead (about 128 chunks, 32
// launches on each of the four lanes).
TEST(GpuNcclTest, BlockingLaunchesFollowTheSendingSide) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  ExpectEveryByteBothWays(2048, {{"blocking_launch", "1"}, {"direct_bytes", "262144"}},
                          {{"group_ops", "1"}});
}

}  // namespace
}  // namespace kv::transport::gputest
