// kvd's event gate (daemon/event_gate.h) with a fake engine event (an atomic the test fires) over
// a recording transport, and over the offload pool: work whose event fired goes at once, held
// work goes the moment its event fires, later work goes ahead of held work, held work whose
// event never fires fails alone at its deadline having started nothing, notes wait for the held
// batches of their peer (and are dropped behind one that failed), a disconnect fails the peer's
// held batches, and a store whose event never fires frees its pool slots; batches sharing an
// event's key are asked once a pass, without the gate's lock. Every wait is bounded.
#include "daemon/event_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/offload/offload_pool.h"

namespace kv::daemon {
namespace {

using namespace std::chrono_literals;
using transport::Batch;
using transport::Completion;
using transport::PeerId;

constexpr auto kBound = 10s;

class FakeRegistration final : public transport::MemoryRegistration {
 public:
  void* base() const override { return nullptr; }
  uint64_t length() const override { return 1 << 20; }
  MemoryLocation location() const override { return MemoryLocation::Host(); }
  std::string packed_descriptor() const override { return {}; }
};

class FakeRemote final : public transport::RemoteMemory {
 public:
  explicit FakeRemote(PeerId peer) : peer_(peer) {}
  PeerId peer() const override { return peer_; }
  uint64_t length() const override { return 1 << 20; }

 private:
  PeerId peer_;
};

// Records what reaches it, in order: "post:<first run's src_offset>", "note:<message>",
// "disconnect:<peer>". A post completes at once with OK unless `refuse` is set.
class RecordingTransport final : public transport::Transport {
 public:
  std::string_view name() const override { return "recording"; }
  std::string address() const override { return {}; }
  bool supports(MemoryKind) const override { return true; }
  Result<std::unique_ptr<transport::MemoryRegistration>> register_memory(void*, uint64_t,
                                                                         MemoryLocation) override {
    return Status::Unsupported("fake");
  }
  Result<PeerId> connect(std::string_view) override { return Status::Unsupported("fake"); }
  void disconnect(PeerId peer) override { Record("disconnect:" + std::to_string(peer)); }
  Result<std::unique_ptr<transport::RemoteMemory>> import_remote(PeerId,
                                                                 std::string_view) override {
    return Status::Unsupported("fake");
  }
  Status post(const Batch& batch, Completion done) override {
    if (refuse) return Status::OutOfRange("refused by the transport");
    Record("post:" + std::to_string(batch.runs.empty() ? 0 : batch.runs[0].src_offset));
    done(Status::Ok());
    return Status::Ok();
  }
  Status notify(PeerId, std::string message) override {
    Record("note:" + message);
    return Status::Ok();
  }
  void set_notification_handler(transport::NotificationHandler) override {}

  std::vector<std::string> events() {
    std::lock_guard lock(mu_);
    return events_;
  }
  // Waits (bounded) until `event` was recorded.
  bool Saw(const std::string& event) {
    const auto until = std::chrono::steady_clock::now() + kBound;
    while (std::chrono::steady_clock::now() < until) {
      for (const std::string& e : events()) {
        if (e == event) return true;
      }
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }
  std::atomic<bool> refuse{false};

 private:
  void Record(std::string event) {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(event));
  }
  std::mutex mu_;
  std::vector<std::string> events_;
};

// An engine's event: fired or not, or failed.
struct FakeEvent {
  std::atomic<bool> fired{false};
  std::atomic<bool> failed{false};
  EventProbe probe() {
    return [this]() -> Result<bool> {
      if (failed) return Status::Internal("the engine's kernel failed");
      return fired.load();
    };
  }
};

// A completion the test waits on, never for long.
struct Done {
  std::shared_ptr<std::promise<Status>> promise = std::make_shared<std::promise<Status>>();
  std::future<Status> future = promise->get_future();
  Completion callback() {
    return [p = promise](Status s) { p->set_value(std::move(s)); };
  }
  bool ready() { return future.wait_for(0s) == std::future_status::ready; }
  Status Wait() {
    if (future.wait_for(kBound) != std::future_status::ready) {
      return Status::Internal("no completion within the bound");
    }
    return future.get();
  }
};

class EventGateTest : public ::testing::Test {
 protected:
  // A batch to `peer` whose first run starts at `tag`, so the recording tells batches apart.
  Batch MakeBatch(PeerId peer, uint64_t tag, std::chrono::milliseconds deadline = 10s) {
    runs_.push_back(std::make_unique<std::vector<kv::Run>>(1, kv::Run{tag, 0, 8}));
    remotes_.push_back(std::make_unique<FakeRemote>(peer));
    return Batch{transport::Op::kPut, &local_, remotes_.back().get(), *runs_.back(),
                 std::chrono::steady_clock::now() + deadline};
  }

  RecordingTransport transport_;
  FakeRegistration local_;
  std::vector<std::unique_ptr<std::vector<kv::Run>>> runs_;
  std::vector<std::unique_ptr<FakeRemote>> remotes_;
};

TEST_F(EventGateTest, WorkWhoseEventFiredGoesAtOnceOnTheCallersThread) {
  EventGate gate(&transport_);
  FakeEvent fired;
  fired.fired = true;
  Done a, b;
  ASSERT_TRUE(gate.Post(MakeBatch(1, 10), nullptr, a.callback()).ok());
  ASSERT_TRUE(gate.Post(MakeBatch(1, 11), fired.probe(), b.callback()).ok());
  EXPECT_EQ(transport_.events(), (std::vector<std::string>{"post:10", "post:11"}));
  EXPECT_TRUE(a.ready() && b.ready());
  EXPECT_EQ(gate.held(), 0u);
  // The transport's refusal is the caller's, with nothing held.
  transport_.refuse = true;
  Done c;
  EXPECT_EQ(gate.Post(MakeBatch(1, 12), fired.probe(), c.callback()).code(), Code::kOutOfRange);
  EXPECT_FALSE(c.ready());
}

TEST_F(EventGateTest, AHeldBatchIsPostedOnceItsEventFiresAndLaterOnesGoAhead) {
  EventGate gate(&transport_);
  FakeEvent layer;
  Done held, later;
  ASSERT_TRUE(gate.Post(MakeBatch(1, 20), layer.probe(), held.callback()).ok());
  ASSERT_TRUE(gate.Post(MakeBatch(1, 21), nullptr, later.callback()).ok());
  EXPECT_TRUE(later.ready());
  std::this_thread::sleep_for(50ms);  // time to go wrong
  EXPECT_FALSE(held.ready()) << "posted before its event fired";
  EXPECT_EQ(transport_.events(), (std::vector<std::string>{"post:21"}));
  EXPECT_EQ(gate.held(), 1u);
  layer.fired = true;
  EXPECT_TRUE(held.Wait().ok());
  EXPECT_EQ(transport_.events(), (std::vector<std::string>{"post:21", "post:20"}));
  EXPECT_EQ(gate.held(), 0u);
}

// An engine killed mid-layer: its event never fires. The batch fails alone at its deadline with
// kTimeout, never posted, and batches posted beside it go meanwhile.
TEST_F(EventGateTest, ABatchWhoseEventNeverFiresFailsAloneAtItsDeadline) {
  EventGate gate(&transport_);
  FakeEvent dead, alive;
  Done stuck, beside, fired_later;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(gate.Post(MakeBatch(1, 30, 200ms), dead.probe(), stuck.callback()).ok());
  ASSERT_TRUE(gate.Post(MakeBatch(1, 31), nullptr, beside.callback()).ok());
  ASSERT_TRUE(gate.Post(MakeBatch(1, 32), alive.probe(), fired_later.callback()).ok());
  alive.fired = true;
  EXPECT_TRUE(beside.Wait().ok());
  EXPECT_TRUE(fired_later.Wait().ok());
  EXPECT_FALSE(stuck.ready()) << "ended before its deadline";
  const Status s = stuck.Wait();
  EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  EXPECT_EQ(transport_.events(), (std::vector<std::string>{"post:31", "post:32"}));
}

// A step's saves of one layer wait for one event: with a key, the poller asks it once a pass for
// all of them (each batch's own probe ran once, on the caller's thread, when it was posted), and
// they all go once it fired, in order.
TEST_F(EventGateTest, BatchesSharingAKeyAreAskedOnceForAll) {
  EventGate gate(&transport_);
  FakeEvent layer;
  std::vector<std::shared_ptr<std::atomic<int>>> asked;
  std::vector<Done> done(8);
  const EventKey key{&layer, 3};
  for (int i = 0; i < 8; ++i) {
    auto count = asked.emplace_back(std::make_shared<std::atomic<int>>(0));
    EventProbe probe = [count, inner = layer.probe()] {
      ++*count;
      return inner();
    };
    ASSERT_TRUE(gate.Post(MakeBatch(1, 50 + i), probe, done[i].callback(), key).ok());
  }
  std::this_thread::sleep_for(50ms);  // many passes of the poller
  EXPECT_EQ(gate.held(), 8u);
  EXPECT_GT(asked[0]->load(), 2) << "the poller did not ask the key";
  for (int i = 1; i < 8; ++i) EXPECT_EQ(asked[i]->load(), 1) << "batch " << i << " asked again";
  layer.fired = true;
  for (Done& d : done) EXPECT_TRUE(d.Wait().ok());
  std::vector<std::string> posts;
  for (int i = 0; i < 8; ++i) posts.push_back("post:" + std::to_string(50 + i));
  EXPECT_EQ(transport_.events(), posts);
}

// A keyed probe runs without the gate's lock: Post, Notify and held() go on while it takes its
// time (a cudaEventQuery costs microseconds; kvd's io thread must not wait behind it).
TEST_F(EventGateTest, AKeyedProbeRunsWithoutTheGatesLock) {
  EventGate gate(&transport_);
  std::promise<void> entered, release;
  auto entered_future = entered.get_future();
  auto release_future = release.get_future().share();
  auto calls = std::make_shared<std::atomic<int>>(0);
  EventProbe slow = [calls, &entered, release_future]() -> Result<bool> {
    if (++*calls == 1) return false;  // Post's own look, on the caller's thread
    if (*calls == 2) {
      entered.set_value();
      if (release_future.wait_for(kBound) != std::future_status::ready) return false;
    }
    return true;
  };
  Done held, beside;
  ASSERT_TRUE(gate.Post(MakeBatch(1, 60), slow, held.callback(), EventKey{&calls, 0}).ok());
  ASSERT_EQ(entered_future.wait_for(kBound), std::future_status::ready);
  // The poller is inside the probe now: with the lock held these would wait for it.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(gate.held(), 1u);
  ASSERT_TRUE(gate.Post(MakeBatch(1, 61), nullptr, beside.callback()).ok());
  EXPECT_TRUE(gate.Notify(1, "after").ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_TRUE(beside.ready());
  EXPECT_FALSE(held.ready());
  release.set_value();
  EXPECT_TRUE(held.Wait().ok());
  EXPECT_TRUE(transport_.Saw("note:after"));
  // The note waited for the batch held before it.
  EXPECT_EQ(transport_.events(), (std::vector<std::string>{"post:61", "post:60", "note:after"}));
}

TEST_F(EventGateTest, AnEventThatFailsFailsItsBatchUnposted) {
  EventGate gate(&transport_);
  FakeEvent event;
  event.failed = true;
  Done now;
  EXPECT_EQ(gate.Post(MakeBatch(1, 40), event.probe(), now.callback()).code(), Code::kInternal);
  EXPECT_FALSE(now.ready());  // refused: `done` is not called
  FakeEvent later;
  Done held;
  ASSERT_TRUE(gate.Post(MakeBatch(1, 41), later.probe(), held.callback()).ok());
  later.failed = true;
  EXPECT_EQ(held.Wait().code(), Code::kInternal);
  EXPECT_TRUE(transport_.events().empty());
}

// Transport::notify promises delivery after the batches posted before it; a held batch is not
// posted yet, so a note to its peer waits here, and goes once the batch has been posted. Notes
// keep their order; another peer's note does not wait.
TEST_F(EventGateTest, NotesWaitForTheHeldBatchesOfTheirPeerInOrder) {
  EventGate gate(&transport_);
  FakeEvent layer;
  Done held;
  ASSERT_TRUE(gate.Post(MakeBatch(1, 50), layer.probe(), held.callback()).ok());
  ASSERT_TRUE(gate.Notify(1, "first").ok());
  ASSERT_TRUE(gate.Notify(1, "second").ok());
  ASSERT_TRUE(gate.Notify(2, "elsewhere").ok());
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(transport_.events(), (std::vector<std::string>{"note:elsewhere"}));
  layer.fired = true;
  ASSERT_TRUE(held.Wait().ok());
  ASSERT_TRUE(transport_.Saw("note:second"));
  EXPECT_EQ(transport_.events(),
            (std::vector<std::string>{"note:elsewhere", "post:50", "note:first", "note:second"}));
  // Nothing held: a note goes at once.
  ASSERT_TRUE(gate.Notify(1, "third").ok());
  EXPECT_EQ(transport_.events().back(), "note:third");
}

// A note behind a held batch that fails (its event never fired) is dropped: the peer must not
// hear that bytes are in place that never came. A later note goes.
TEST_F(EventGateTest, ANoteBehindABatchThatFailedHereIsDropped) {
  EventGate gate(&transport_);
  FakeEvent dead;
  Done stuck;
  ASSERT_TRUE(gate.Post(MakeBatch(1, 60, 100ms), dead.probe(), stuck.callback()).ok());
  ASSERT_TRUE(gate.Notify(1, "never").ok());
  EXPECT_EQ(stuck.Wait().code(), Code::kTimeout);
  ASSERT_TRUE(gate.Notify(1, "after").ok());
  ASSERT_TRUE(transport_.Saw("note:after"));
  EXPECT_EQ(transport_.events(), (std::vector<std::string>{"note:after"}));
}

// A held batch the transport refuses once its event fired fails with the transport's error, and
// the note behind it is dropped; a held note the transport refuses is reported to `refused`.
TEST_F(EventGateTest, ATransportRefusalOfAHeldBatchFailsItAndDropsItsNote) {
  EventGate gate(&transport_);
  FakeEvent layer;
  Done held;
  ASSERT_TRUE(gate.Post(MakeBatch(1, 70), layer.probe(), held.callback()).ok());
  std::atomic<bool> refused{false};
  ASSERT_TRUE(gate.Notify(1, "dropped", [&](Status) { refused = true; }).ok());
  transport_.refuse = true;
  layer.fired = true;
  EXPECT_EQ(held.Wait().code(), Code::kOutOfRange);
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(transport_.events().empty());
  EXPECT_FALSE(refused) << "a dropped note is not a refused one";
}

TEST_F(EventGateTest, DisconnectFailsThePeersHeldBatchesAndNoOthers) {
  EventGate gate(&transport_);
  FakeEvent layer;
  Done one, two, other;
  ASSERT_TRUE(gate.Post(MakeBatch(1, 80), layer.probe(), one.callback()).ok());
  ASSERT_TRUE(gate.Post(MakeBatch(1, 81), layer.probe(), two.callback()).ok());
  ASSERT_TRUE(gate.Post(MakeBatch(2, 82), layer.probe(), other.callback()).ok());
  ASSERT_TRUE(gate.Notify(1, "gone").ok());
  gate.Disconnect(1);
  // Failed at once, before the event fired: nothing of them was posted.
  ASSERT_TRUE(one.ready() && two.ready());
  EXPECT_EQ(one.Wait().code(), Code::kAborted);
  EXPECT_EQ(two.Wait().code(), Code::kAborted);
  EXPECT_FALSE(other.ready());
  layer.fired = true;
  EXPECT_TRUE(other.Wait().ok());
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(transport_.events(), (std::vector<std::string>{"disconnect:1", "post:82"}));
}

TEST_F(EventGateTest, DestroyingTheGateFailsWhatItHolds) {
  FakeEvent never;
  Done batch, work;
  std::atomic<bool> started{false};
  {
    EventGate gate(&transport_);
    ASSERT_TRUE(gate.Post(MakeBatch(1, 90), never.probe(), batch.callback()).ok());
    gate.Hold(
        never.probe(), std::chrono::steady_clock::now() + 10s, [&] { started = true; },
        work.callback());
  }
  EXPECT_EQ(batch.Wait().code(), Code::kAborted);
  EXPECT_EQ(work.Wait().code(), Code::kAborted);
  EXPECT_FALSE(started);
  EXPECT_TRUE(transport_.events().empty());
}

TEST_F(EventGateTest, HeldWorkStartsOnceItsEventFiresOrFailsAtItsDeadline) {
  EventGate gate(nullptr);  // Hold needs no transport
  FakeEvent fired, later, never;
  fired.fired = true;
  std::atomic<int> started{0};
  Done unused, failed;
  gate.Hold(
      fired.probe(), std::chrono::steady_clock::now() + 10s, [&] { ++started; }, unused.callback());
  EXPECT_EQ(started.load(), 1);  // at once, on this thread
  std::promise<void> ran;
  gate.Hold(
      later.probe(), std::chrono::steady_clock::now() + 10s, [&] { ran.set_value(); },
      unused.callback());
  gate.Hold(
      never.probe(), std::chrono::steady_clock::now() + 100ms, [&] { ++started; },
      failed.callback());
  later.fired = true;
  EXPECT_EQ(ran.get_future().wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(failed.Wait().code(), Code::kTimeout);
  EXPECT_EQ(started.load(), 1);
  EXPECT_FALSE(unused.ready());
}

// The offload pool's store behind the gate, as kvd builds it (offload_service.cc): a store whose
// event never fires fails alone at the deadline with nothing copied, its keys absent and its
// slots free again, while a store beside it lands; one whose event fires lands.
TEST(EventGateOffload, AStoreWhoseEventNeverFiresFailsAloneAndFreesItsSlots) {
  LayoutSpec shape;
  shape.order = "LBNHC";
  shape.layers = 2;
  shape.blocks = 4;
  shape.heads = 1;
  shape.block_size = 4;
  shape.content_bytes = 8;
  auto region = KvRegion::Create(shape);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  std::vector<std::byte> cache(region->span_bytes(), std::byte{7});
  offload::PoolOptions options;
  options.slot_layout = shape;
  options.capacity_bytes = 3 * region->span_bytes() / 4;  // three slots
  options.memory.try_huge_pages = false;
  auto pool = offload::OffloadPool::Create(options);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EventGate gate(nullptr);
  auto gated = [&gate](FakeEvent& event, std::chrono::milliseconds deadline) {
    return
        [&gate, &event, deadline](std::function<void()> start, std::function<void(Status)> fail) {
          gate.Hold(event.probe(), std::chrono::steady_clock::now() + deadline, std::move(start),
                    std::move(fail));
        };
  };
  FakeEvent dead, alive;
  const std::vector<offload::BlockKey> stuck_keys = {offload::BlockKey::FromUint64(1),
                                                     offload::BlockKey::FromUint64(2)};
  const std::vector<int64_t> blocks = {0, 1};
  Done stuck;
  ASSERT_TRUE((*pool)
                  ->Store({&*region, cache.data(), stuck_keys, blocks, gated(dead, 200ms)},
                          stuck.callback())
                  .ok());
  const std::vector<offload::BlockKey> beside_keys = {offload::BlockKey::FromUint64(3)};
  const std::vector<int64_t> beside_blocks = {2};
  Done beside;
  ASSERT_TRUE(
      (*pool)
          ->Store({&*region, cache.data(), beside_keys, beside_blocks, nullptr}, beside.callback())
          .ok());
  EXPECT_TRUE(beside.Wait().ok());
  EXPECT_FALSE(stuck.ready());
  EXPECT_EQ(stuck.Wait().code(), Code::kTimeout);
  EXPECT_EQ((*pool)->stats().used_slots, 1u);  // the store beside; the failed one's are free
  EXPECT_EQ(*(*pool)->Lookup(*region, stuck_keys), 0u);
  // The same keys again, behind an event that fires: they land in the slots freed above.
  Done again;
  ASSERT_TRUE(
      (*pool)
          ->Store({&*region, cache.data(), stuck_keys, blocks, gated(alive, 10s)}, again.callback())
          .ok());
  alive.fired = true;
  EXPECT_TRUE(again.Wait().ok());
  EXPECT_EQ(*(*pool)->Lookup(*region, stuck_keys), 2u);
}

}  // namespace
}  // namespace kv::daemon
