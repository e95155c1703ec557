// The ucx backend between two processes on loopback: a peer killed mid-batch while another keeps
// working, a stalled peer past the deadline. Puts, gets, notification order, bounds and a killed
// peer's batches, over tcp and shm: the conformance suite (conformance_suite.h).
//
// Children are forked before this process initialises UCX and set up their own transport; every
// wait is bounded and ~ChildProcess kills and reaps them on every path.
#include <signal.h>

#include <cstring>

#include "tests/support/target_process.h"
#include "tools/testing/child_process.h"
#include "transport/transport.h"

namespace kv::transport {

using harness::Channel;
using harness::ChildProcess;
namespace {

using namespace std::chrono_literals;
using testing::Fill;
using testing::SpreadRuns;
using testing::Waiter;

constexpr uint32_t kSeed = 11;

TransportOptions Tls(const std::string& tls) {
  return {{{"UCX_TLS", tls}}};
}

std::unique_ptr<ChildProcess> StartTarget(const std::string& tls, uint64_t bytes) {
  return testing::StartTarget(Tls(tls), bytes, kSeed);
}

// Puts `runs`, then asks the target to check them; "ok" means every byte arrived before the
// notification did.
void PutAndCheck(Transport& transport, ChildProcess& child, const testing::TargetConnection& c,
                 const MemoryRegistration& src, uint64_t count, uint64_t length, uint64_t gap) {
  auto runs = SpreadRuns(count, length, gap);
  Waiter waiter;
  ASSERT_TRUE(
      transport.post({Op::kPut, &src, c.remote.get(), runs, testing::In(20s)}, waiter.callback())
          .ok());
  // Sent before the batch completes on purpose: ordering after the data is the transport's job.
  ASSERT_TRUE(transport.notify(c.peer, testing::CheckMessage(count, length, gap)).ok());
  Status done = waiter.Wait(30s);
  ASSERT_TRUE(done.ok()) << done.ToString();
  auto verdict = child.channel().Receive(Clock::now() + 30s);
  ASSERT_TRUE(verdict.ok()) << verdict.status().ToString();
  EXPECT_EQ(*verdict, "ok");
}

TEST(UcxPeerFailure, KilledPeerFailsItsBatchesAndTheSurvivorKeepsWorking) {
  auto doomed = StartTarget("tcp", 64 << 20);
  auto fresh = StartTarget("tcp", 64 << 20);
  ASSERT_TRUE(doomed && fresh);
  auto transport = CreateTransport("ucx", Tls("tcp"));
  ASSERT_TRUE(transport.ok());
  std::vector<uint8_t> src(64 << 20);
  Fill(src, kSeed);
  auto reg = (*transport)->register_memory(src.data(), src.size(), MemoryLocation::Host());
  ASSERT_TRUE(reg.ok());
  auto c = testing::ConnectToTarget(**transport, *doomed);
  ASSERT_TRUE(c.ok()) << c.status().ToString();

  // About a gigabyte in flight: far more than loopback TCP moves before the kill lands.
  const auto deadline = 5s;
  std::vector<Waiter> waiters(16);
  std::vector<kv::Run> runs = SpreadRuns(64, 1 << 20, 0);
  for (auto& w : waiters) {
    ASSERT_TRUE((*transport)
                    ->post({Op::kPut, reg->get(), c->remote.get(), runs, testing::In(deadline)},
                           w.callback())
                    .ok());
  }
  doomed->Kill();
  int failed = 0;
  for (auto& w : waiters) {
    Status s = w.Wait(deadline + 5s);
    ASSERT_NE(s.code(), Code::kInternal) << "a batch never completed";
    if (!s.ok()) {
      ++failed;
      EXPECT_TRUE(s.code() == Code::kUnavailable || s.code() == Code::kTimeout) << s.ToString();
    }
  }
  EXPECT_GT(failed, 0);

  auto again = testing::ConnectToTarget(**transport, *fresh);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  PutAndCheck(**transport, *fresh, *again, **reg, 256, 65536, 4096);
}

TEST(UcxPeerFailure, StalledPeerMissesTheDeadlineWithTimeout) {
  auto stalled = StartTarget("tcp", 128 << 20);
  ASSERT_NE(stalled, nullptr);
  auto transport = CreateTransport("ucx", Tls("tcp"));
  ASSERT_TRUE(transport.ok());
  std::vector<uint8_t> src(128 << 20);
  auto reg = (*transport)->register_memory(src.data(), src.size(), MemoryLocation::Host());
  ASSERT_TRUE(reg.ok());
  auto c = testing::ConnectToTarget(**transport, *stalled);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // Warm the connection up so the stall hits data, not the wire-up.
  ASSERT_TRUE(testing::PostAndWait(**transport, Op::kPut, **reg, *c->remote, {{0, 0, 4096}}).ok());

  ASSERT_EQ(::kill(stalled->pid(), SIGSTOP), 0);
  // The target no longer reads its socket: 128 MiB cannot fit in the kernel's buffers.
  Waiter waiter;
  std::vector<kv::Run> runs = {{0, 0, src.size()}};
  ASSERT_TRUE((*transport)
                  ->post({Op::kPut, reg->get(), c->remote.get(), runs, testing::In(300ms)},
                         waiter.callback())
                  .ok());
  Status s = waiter.Wait(10s);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
  stalled->Kill();
}

}  // namespace
}  // namespace kv::transport
