// The staged decorator on a CPU-only machine: "ucx" with stage_host=1 stages host memory through
// the same slots, chunks, acks and notification queue as GPU memory, with memcpy for the copies.
// Two processes over UCX tcp on loopback; every wait is bounded and ~ChildProcess kills and
// reaps the target on every path. Beside the backend: it forges the backend's descriptors and
// control frames, and checks its chunker and wire codec (registered in tests/transport).
#include <signal.h>

#include <cstring>
#include <future>

#include "tests/support/target_process.h"
#include "tools/testing/child_process.h"
#include "transport/staged/chunker.h"
#include "transport/staged/core.h"
#include "transport/staged/wire.h"
#include "transport/transport.h"

namespace kv::transport {

using harness::Channel;
using harness::ChildProcess;
namespace {

using namespace std::chrono_literals;
using testing::Fill;
using testing::SpreadRuns;
using testing::Waiter;

constexpr uint32_t kSeed = 5;
constexpr uint8_t kUntouched = 0xEE;

// stage: whether this side stages its host registrations; slot: staging_bytes.
TransportOptions Options(bool stage, uint64_t slot = 64 << 10) {
  return {{{"UCX_TLS", "tcp"},
           {"stage_host", stage ? "1" : "0"},
           {"staging_bytes", std::to_string(slot)},
           {"staging_slots", "2"}}};
}

std::unique_ptr<ChildProcess> StartTarget(const TransportOptions& options, uint64_t bytes,
                                          bool filled = false) {
  return testing::StartTarget(options, bytes, kSeed, filled, kUntouched);
}

std::string Verdict(ChildProcess& child) {
  auto v = child.channel().Receive(Clock::now() + 30s);
  return v.ok() ? *v : v.status().ToString();
}

std::string Check(uint64_t count, uint64_t length, uint64_t gap) {
  return testing::CheckMessage(count, length, gap);
}

// This process's end of most tests: a "ucx" transport connected to a target child serving
// target_bytes, and a source of src_bytes filled from kSeed and registered. Connect fails the
// calling test where a step fails: call it inside ASSERT_NO_FATAL_FAILURE.
struct Initiator {
  std::unique_ptr<ChildProcess> child;
  std::unique_ptr<Transport> transport;
  std::vector<uint8_t> src;
  std::unique_ptr<MemoryRegistration> reg;
  testing::TargetConnection c;
};

void Connect(const TransportOptions& mine, const TransportOptions& target, uint64_t target_bytes,
             uint64_t src_bytes, Initiator* p) {
  p->child = StartTarget(target, target_bytes);
  ASSERT_NE(p->child, nullptr);
  auto transport = CreateTransport("ucx", mine);
  ASSERT_TRUE(transport.ok()) << transport.status().ToString();
  p->transport = std::move(*transport);
  p->src.resize(src_bytes);
  Fill(p->src, kSeed);
  auto reg = p->transport->register_memory(p->src.data(), p->src.size(), MemoryLocation::Host());
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  p->reg = std::move(*reg);
  auto c = testing::ConnectToTarget(*p->transport, *p->child);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  p->c = std::move(*c);
}

// Which sides stage: (initiator, target). Staged to staged is the GPU path; the mixed ones are
// a GPU region put into host memory and host memory put into a GPU region; direct to direct is
// host memory on both sides, where the chooser stages the batches of 700-byte runs and puts the
// 1 MiB runs straight.
class StagedPair : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(StagedPair, ChunkedPutsArriveBeforeTheNotificationsThatFollowThem) {
  auto [initiator_stages, target_stages] = GetParam();
  Initiator p;
  ASSERT_NO_FATAL_FAILURE(
      Connect(Options(initiator_stages), Options(target_stages), 16 << 20, 8 << 20, &p));

  // Three batches, then the note at once: many small runs (table-bound chunks), then runs far
  // larger than a 64 KiB slot (split across chunks). Nothing waits for a completion before the
  // note is sent: holding it back behind the scatters is the transport's job.
  for (auto [count, length, gap] :
       {std::tuple<uint64_t, uint64_t, uint64_t>{3000, 700, 300}, {6, 1 << 20, 4096}}) {
    auto runs = SpreadRuns(count, length, gap);
    std::vector<Waiter> waiters(3);
    const size_t third = runs.size() / 3;
    for (size_t i = 0; i < 3; ++i) {
      std::span<const kv::Run> part(runs.data() + i * third,
                                    i == 2 ? runs.size() - 2 * third : third);
      ASSERT_TRUE(p.transport
                      ->post({Op::kPut, p.reg.get(), p.c.remote.get(), part, testing::In(20s)},
                             waiters[i].callback())
                      .ok());
    }
    ASSERT_TRUE(p.transport->notify(p.c.peer, Check(count, length, gap)).ok());
    for (auto& w : waiters) {
      Status s = w.Wait(30s);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    EXPECT_EQ(Verdict(*p.child), "ok") << count << " runs of " << length;
  }
  ASSERT_TRUE(p.child->channel().Send("quit").ok());
  auto code = p.child->Wait(Clock::now() + 30s);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0);
}

INSTANTIATE_TEST_SUITE_P(Sides, StagedPair,
                         ::testing::Values(std::pair{true, true}, std::pair{true, false},
                                           std::pair{false, true}, std::pair{false, false}),
                         [](const auto& info) {
                           return std::string(info.param.first ? "Staged" : "Direct") + "To" +
                                  (info.param.second ? "Staged" : "Direct");
                         });

// Many small host batches posted at once, before the link is open: they wait for the
// receiver's slots together, so once it is, several share each slot (one range table, one put,
// one kData and one ack for all of them; core.h, kShareSlotBytes). Every batch completes, every
// byte lands, and the note after them still arrives after their data.
TEST(Staged, SmallBatchesThatShareASlotEachCompleteAndLandBeforeTheNote) {
  Initiator p;
  ASSERT_NO_FATAL_FAILURE(Connect(Options(true), Options(true), 16 << 20, 8 << 20, &p));

  // 64 batches of 40 runs of 700 B (28 KB each): two fit a 64 KiB slot with their tables.
  constexpr uint64_t kCount = 64 * 40, kLength = 700, kGap = 300;
  auto runs = SpreadRuns(kCount, kLength, kGap);
  std::vector<Waiter> waiters(64);
  for (size_t i = 0; i < waiters.size(); ++i) {
    std::span<const kv::Run> part(runs.data() + i * 40, 40);
    ASSERT_TRUE(p.transport
                    ->post({Op::kPut, p.reg.get(), p.c.remote.get(), part, testing::In(20s)},
                           waiters[i].callback())
                    .ok());
  }
  ASSERT_TRUE(p.transport->notify(p.c.peer, Check(kCount, kLength, kGap)).ok());
  for (auto& w : waiters) {
    Status s = w.Wait(30s);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(Verdict(*p.child), "ok");
  ASSERT_TRUE(p.child->channel().Send("quit").ok());
  auto code = p.child->Wait(Clock::now() + 30s);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0);
}

// A chunk into host memory is scattered and acked on the receiver's inner thread (core.h,
// ScatterHere), not its worker: with the receiver's worker held inside one of its own batches'
// completions, a batch into its host memory still completes and lands. Both transports in this
// process; the worker is held for a bounded time only.
TEST(Staged, HostChunksLandWhileTheReceiversWorkerIsBusy) {
  auto a = CreateTransport("ucx", Options(true));
  auto b = CreateTransport("ucx", Options(true));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<uint8_t> a_mem(1 << 20), b_mem(1 << 20, kUntouched);
  Fill(a_mem, kSeed);
  auto a_reg = (*a)->register_memory(a_mem.data(), a_mem.size(), MemoryLocation::Host());
  auto b_reg = (*b)->register_memory(b_mem.data(), b_mem.size(), MemoryLocation::Host());
  ASSERT_TRUE(a_reg.ok() && b_reg.ok());
  auto to_b = (*a)->connect((*b)->address());
  auto to_a = (*b)->connect((*a)->address());
  ASSERT_TRUE(to_b.ok() && to_a.ok());
  auto b_remote = (*a)->import_remote(*to_b, (*b_reg)->packed_descriptor());
  auto a_remote = (*b)->import_remote(*to_a, (*a_reg)->packed_descriptor());
  ASSERT_TRUE(b_remote.ok() && a_remote.ok());
  const std::vector<kv::Run> first = {{0, 0, 4096}}, second = {{8192, 8192, 4096}};
  // a's link to b opens on its first batch (b's worker answers the hello).
  ASSERT_TRUE(testing::PostAndWait(**a, Op::kPut, **a_reg, **b_remote, first).ok());

  // b's worker runs its batches' completions: hold it in one.
  std::promise<void> held, release;
  std::shared_future<void> released = release.get_future().share();
  ASSERT_TRUE((*b)->post({Op::kPut, b_reg->get(), a_remote->get(), first, testing::In(20s)},
                         [&held, released](Status) {
                           held.set_value();
                           (void)released.wait_for(20s);
                         })
                  .ok());
  ASSERT_EQ(held.get_future().wait_for(20s), std::future_status::ready);

  Waiter landed;
  ASSERT_TRUE((*a)->post({Op::kPut, a_reg->get(), b_remote->get(), second, testing::In(20s)},
                         landed.callback())
                  .ok());
  Status s = landed.Wait(5s);
  release.set_value();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(std::memcmp(a_mem.data() + 8192, b_mem.data() + 8192, 4096), 0);
  a_remote->reset();
  b_remote->reset();
  a_reg->reset();
  b_reg->reset();
}

// A get of the target's staged region into local memory, staged or not: the target puts the
// runs back over its own link into an alias of ours. Runs outside its region are refused there.
class StagedGet : public ::testing::TestWithParam<bool> {};

TEST_P(StagedGet, PullsRunsFromAStagedRegionAndRefusesRunsOutsideIt) {
  const uint64_t bytes = 4 << 20;
  auto child = StartTarget(Options(true), bytes, /*filled=*/true);
  ASSERT_NE(child, nullptr);
  auto transport = CreateTransport("ucx", Options(GetParam()));
  ASSERT_TRUE(transport.ok());
  std::vector<uint8_t> dst(16 << 20, kUntouched);
  auto reg = (*transport)->register_memory(dst.data(), dst.size(), MemoryLocation::Host());
  ASSERT_TRUE(reg.ok());
  auto c = testing::ConnectToTarget(**transport, *child);
  ASSERT_TRUE(c.ok()) << c.status().ToString();

  // src_offset packed in the target's region, dst_offset spread here; 5000 runs: three parts.
  auto runs = SpreadRuns(5000, 700, 300);
  Status got = testing::PostAndWait(**transport, Op::kGet, **reg, *c->remote, runs);
  ASSERT_TRUE(got.ok()) << got.ToString();
  std::vector<uint8_t> src(bytes);
  Fill(src, kSeed);
  testing::ExpectCopied(src, dst, runs, kUntouched);

  auto real = staged::DecodeRegion(c->descriptor);
  ASSERT_TRUE(real.ok());
  staged::RegionDescriptor forged = *real;
  forged.length = 4 * bytes;
  auto big = (*transport)->import_remote(c->peer, staged::EncodeRegion(forged));
  ASSERT_TRUE(big.ok());
  Status refused =
      testing::PostAndWait(**transport, Op::kGet, **reg, **big, {{3 * bytes, 700, 64}});
  EXPECT_EQ(refused.code(), Code::kOutOfRange) << refused.ToString();
  EXPECT_EQ(dst[700], kUntouched);  // a gap the first get left alone
}

INSTANTIATE_TEST_SUITE_P(Local, StagedGet, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Staged" : "Direct"; });

// Host memory on both sides (no stage_host): the chooser. Which path a batch took shows in how a
// run past the real region fails, given a descriptor that claims more than the region: the
// inner transport refuses it in post() against its own descriptor (direct), while a staged
// batch is accepted and refused by the receiver's check (the completion).
TEST(Staged, TheChooserStagesShortRunsAndPutsLongRunsDirect) {
  const uint64_t bytes = 1 << 20;
  Initiator p;
  ASSERT_NO_FATAL_FAILURE(Connect(Options(false), Options(false), bytes, 4 << 20, &p));
  auto real = staged::DecodeRegion(p.c.descriptor);
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  EXPECT_FALSE(real->inner.empty());  // both paths reach it
  staged::RegionDescriptor forged = *real;
  forged.length = 4 * bytes;
  auto big = p.transport->import_remote(p.c.peer, staged::EncodeRegion(forged));
  ASSERT_TRUE(big.ok()) << big.status().ToString();

  Waiter waiter;
  const std::vector<kv::Run> long_run = {{0, 3 * bytes, 64 << 10}};
  Status direct = p.transport->post({Op::kPut, p.reg.get(), big->get(), long_run, testing::In(10s)},
                                    waiter.callback());
  EXPECT_EQ(direct.code(), Code::kOutOfRange) << direct.ToString();
  const std::vector<kv::Run> short_runs = {{0, 0, 512}, {512, 3 * bytes, 512}};
  Status staged = p.transport->post(
      {Op::kPut, p.reg.get(), big->get(), short_runs, testing::In(10s)}, waiter.callback());
  ASSERT_TRUE(staged.ok()) << staged.ToString();
  Status refused = waiter.Wait(20s);
  EXPECT_EQ(refused.code(), Code::kOutOfRange) << refused.ToString();
  // The refused chunk failed that staged link (staged_transport.h): a new connection sees the
  // target's memory untouched, the good run of the refused chunk included.
  auto peer = p.transport->connect(p.c.address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(p.transport->notify(*peer, "untouched").ok());
  EXPECT_EQ(Verdict(*p.child), "ok");
}

TEST(Staged, WithoutTheChooserHostRegistrationsAreTheInnerTransports) {
  TransportOptions options = Options(false);
  options.settings.emplace_back("stage_runs_below", "0");
  auto transport = CreateTransport("ucx", options);
  ASSERT_TRUE(transport.ok()) << transport.status().ToString();
  std::vector<uint8_t> memory(1 << 20);
  auto reg = (*transport)->register_memory(memory.data(), memory.size(), MemoryLocation::Host());
  ASSERT_TRUE(reg.ok());
  EXPECT_FALSE(staged::IsRegionDescriptor((*reg)->packed_descriptor()));
  auto with = CreateTransport("ucx", Options(false));
  ASSERT_TRUE(with.ok());
  auto both = (*with)->register_memory(memory.data(), memory.size(), MemoryLocation::Host());
  ASSERT_TRUE(both.ok());
  EXPECT_TRUE(staged::IsRegionDescriptor((*both)->packed_descriptor()));
}

TEST(StagedChooser, StagesBatchesWhoseMeanRunIsShorterThanTheThreshold) {
  const std::vector<kv::Run> small = {{0, 0, 100}, {0, 0, 300}};  // mean 200
  EXPECT_TRUE(staged::StagesBetter(small, 201));
  EXPECT_FALSE(staged::StagesBetter(small, 200));
  EXPECT_FALSE(staged::StagesBetter(small, 0));  // 0: never
  EXPECT_FALSE(staged::StagesBetter({}, 1 << 20));
}

TEST(Staged, UserNotificationsThatLookLikeControlFramesArriveVerbatim) {
  auto child = StartTarget(Options(true), 1 << 20);
  ASSERT_NE(child, nullptr);
  auto transport = CreateTransport("ucx", Options(true));
  ASSERT_TRUE(transport.ok());
  auto c = testing::ConnectToTarget(**transport, *child);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string forged = staged::EncodeAck({1, 1, 0, Status::Ok()});
  ASSERT_TRUE((*transport)->notify(c->peer, forged).ok());
  ASSERT_TRUE((*transport)->notify(c->peer, "plain").ok());
  EXPECT_EQ(Verdict(*child), "note:" + forged);
  EXPECT_EQ(Verdict(*child), "note:plain");
}

TEST(Staged, RangesOutsideTheRegionAreRefusedAndThatLinkDropped) {
  const uint64_t bytes = 1 << 20;
  Initiator p;
  ASSERT_NO_FATAL_FAILURE(Connect(Options(true), Options(true), bytes, 4 << 20, &p));

  // A descriptor claiming four times the region: this side's checks pass, the target's must not.
  auto real = staged::DecodeRegion(p.c.descriptor);
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  staged::RegionDescriptor forged = *real;
  forged.length = 4 * bytes;
  auto big = p.transport->import_remote(p.c.peer, staged::EncodeRegion(forged));
  ASSERT_TRUE(big.ok());
  std::vector<kv::Run> outside = {{0, 0, 4096}, {0, 3 * bytes, 4096}};
  Status refused = testing::PostAndWait(*p.transport, Op::kPut, *p.reg, **big, outside);
  EXPECT_EQ(refused.code(), Code::kOutOfRange) << refused.ToString();

  // The link is gone: later batches on it fail at once. A new connection is a new link: the
  // target's memory is untouched (the whole chunk was refused, not just its bad range), and
  // puts work again.
  Status later = testing::PostAndWait(*p.transport, Op::kPut, *p.reg, *p.c.remote, {{0, 0, 4096}});
  EXPECT_EQ(later.code(), Code::kUnavailable) << later.ToString();
  auto peer = p.transport->connect(p.c.address);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto remote = p.transport->import_remote(*peer, p.c.descriptor);
  ASSERT_TRUE(remote.ok());
  ASSERT_TRUE(p.transport->notify(*peer, "untouched").ok());
  EXPECT_EQ(Verdict(*p.child), "ok");
  auto runs = SpreadRuns(100, 4000, 96);
  Status put = testing::PostAndWait(*p.transport, Op::kPut, *p.reg, **remote, runs);
  ASSERT_TRUE(put.ok()) << put.ToString();
  ASSERT_TRUE(p.transport->notify(*peer, Check(100, 4000, 96)).ok());
  EXPECT_EQ(Verdict(*p.child), "ok");
}

TEST(Staged, KilledTargetFailsItsBatchesInBoundedTime) {
  Initiator p;
  ASSERT_NO_FATAL_FAILURE(
      Connect(Options(true, 1 << 20), Options(true, 1 << 20), 64 << 20, 64 << 20, &p));
  ASSERT_TRUE(
      testing::PostAndWait(*p.transport, Op::kPut, *p.reg, *p.c.remote, {{0, 0, 4096}}).ok());

  std::vector<Waiter> waiters(8);
  std::vector<kv::Run> runs = SpreadRuns(64, 1 << 20, 0);
  for (auto& w : waiters) {
    ASSERT_TRUE(
        p.transport
            ->post({Op::kPut, p.reg.get(), p.c.remote.get(), runs, testing::In(5s)}, w.callback())
            .ok());
  }
  p.child->Kill();
  int failed = 0;
  for (auto& w : waiters) {
    Status s = w.Wait(15s);
    ASSERT_NE(s.code(), Code::kInternal) << "a batch never completed";
    if (!s.ok()) {
      ++failed;
      EXPECT_TRUE(s.code() == Code::kUnavailable || s.code() == Code::kTimeout) << s.ToString();
    }
  }
  EXPECT_GT(failed, 0);
}

TEST(StagedChunker, SplitsRunsToFitSlotsWithTheirTable) {
  std::vector<kv::Run> runs = {{0, 100, 10000}, {20000, 0, 50}, {30000, 50000, 0}};
  auto chunks = staged::PlanChunks(runs, 4096, true);
  uint64_t covered = 0;
  uint64_t expect_src = 0;
  for (const auto& chunk : chunks) {
    EXPECT_EQ(chunk.payload_offset, staged::TableBytes(chunk.runs.size()));
    EXPECT_LE(chunk.payload_offset + chunk.payload_bytes, 4096u);
    for (const kv::Run& r : chunk.runs) {
      if (covered < 10000) {
        EXPECT_EQ(r.src_offset, expect_src);
        EXPECT_EQ(r.dst_offset, 100 + expect_src);
        expect_src += r.length;
      }
      covered += r.length;
    }
  }
  EXPECT_EQ(covered, 10050u);
  EXPECT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks.back().runs.back().src_offset, 20000u);  // the zero-length run is dropped
  auto gather = staged::GatherRuns(chunks[0]);
  EXPECT_EQ(gather[0].dst_offset, chunks[0].payload_offset);
  EXPECT_TRUE(staged::PlanChunks(runs, 4096, false).size() == 3u);
}

TEST(StagedWire, MalformedFramesAreRefused) {
  staged::DataMsg m{{1, 2}, 3, 4, 1, 5, 6};
  std::string frame = staged::EncodeData(m);
  auto back = staged::DecodeData(frame);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->payload_bytes, 6u);
  EXPECT_FALSE(staged::DecodeData(frame.substr(0, frame.size() - 1)).ok());
  EXPECT_FALSE(staged::DecodeAck(frame).ok());
  EXPECT_FALSE(staged::PeekControl(staged::EncodeUser(frame)).ok());
  EXPECT_FALSE(staged::DecodeRegion("KVSR").ok());
}

}  // namespace
}  // namespace kv::transport
