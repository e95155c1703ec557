// The offload pool on host memory: store, lookup and load by key, eviction, pins, bad input,
// layout conversion and engine restarts.
#include "daemon/offload/offload_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

namespace kv::offload {
namespace {

using std::chrono::seconds;

constexpr int64_t kLayers = 3, kHeads = 2, kTokens = 4, kContent = 8;

LayoutSpec Shape(const std::string& order, int64_t blocks, int64_t tokens = kTokens) {
  LayoutSpec s;
  s.order = order;
  s.layers = kLayers;
  s.blocks = blocks;
  s.heads = kHeads;
  s.block_size = tokens;
  s.content_bytes = kContent;
  return s;
}

// An engine's KV cache in host memory.
struct Engine {
  KvRegion region;
  std::vector<std::byte> memory;

  static Engine Make(const LayoutSpec& spec) {
    auto region = KvRegion::Create(spec);
    EXPECT_TRUE(region.ok()) << region.status().ToString();
    Engine e{*region, {}};
    e.memory.resize(e.region.span_bytes());
    return e;
  }
  // Writes content derived from `seed` into every logical byte of `block`.
  void Fill(int64_t block, uint32_t seed) {
    ForEachByte(block, [&](uint64_t off, uint64_t i) {
      memory[off] = static_cast<std::byte>((seed * 131 + i * 7) & 0xff);
    });
  }
  bool Holds(int64_t block, uint32_t seed) const {
    bool same = true;
    ForEachByte(block, [&](uint64_t off, uint64_t i) {
      same &= memory[off] == static_cast<std::byte>((seed * 131 + i * 7) & 0xff);
    });
    return same;
  }
  template <typename F>
  void ForEachByte(int64_t block, F f) const {
    uint64_t i = 0;
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t n = 0; n < region.size(Axis::kN); ++n)
          for (int64_t c = 0; c < kContent; ++c) f(region.offset(l, block, h, n) + c, i++);
  }
  BlockTransfer Transfer(std::span<const BlockKey> keys, std::span<const int64_t> blocks) {
    return {&region, memory.data(), keys, blocks, nullptr};
  }
};

std::unique_ptr<OffloadPool> MakePool(uint64_t slots, const std::string& order = "LBNHC") {
  PoolOptions options;
  options.slot_layout = Shape(order, 1);
  options.capacity_bytes = slots * kLayers * kHeads * kTokens * kContent;
  options.memory.try_huge_pages = false;
  auto pool = OffloadPool::Create(options);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? std::move(pool).value() : nullptr;
}

std::vector<BlockKey> Keys(std::initializer_list<uint64_t> values) {
  std::vector<BlockKey> keys;
  for (uint64_t v : values) keys.push_back(BlockKey::FromUint64(v));
  return keys;
}

// A completion the test waits on, never for long.
class Done {
 public:
  Completion callback() {
    return [this](Status s) { promise_.set_value(std::move(s)); };
  }
  Status Wait() {
    auto future = promise_.get_future();
    if (future.wait_for(seconds(10)) != std::future_status::ready) {
      return Status::Timeout("completion did not arrive within 10 s");
    }
    return future.get();
  }

 private:
  std::promise<Status> promise_;
};

Status StoreAndWait(OffloadPool& pool, const BlockTransfer& t, StoreTicket* ticket = nullptr) {
  Done done;
  auto r = pool.Store(t, done.callback());
  if (!r.ok()) return r.status();
  if (ticket) *ticket = *r;
  return done.Wait();
}

Status LoadAndWait(OffloadPool& pool, const BlockTransfer& t,
                   std::vector<int64_t>* layers = nullptr) {
  Done done;
  LayerDone on_layer;
  if (layers) on_layer = [layers](int64_t l) { layers->push_back(l); };
  auto r = pool.Load(t, on_layer, done.callback());
  if (!r.ok()) return r.status();
  return done.Wait();
}

TEST(OffloadPool, StoreLookupLoadRoundTrip) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool);
  Engine engine = Engine::Make(Shape("LBNHC", 16));
  auto keys = Keys({101, 102, 103});
  std::vector<int64_t> blocks = {5, 6, 2};
  for (size_t i = 0; i < keys.size(); ++i) engine.Fill(blocks[i], 101 + i);

  StoreTicket ticket;
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(keys, blocks), &ticket).ok());
  EXPECT_EQ(ticket.stored, 3u);
  EXPECT_EQ(ticket.bytes, 3u * kLayers * kHeads * kTokens * kContent);
  // Blocks 5, 6 land in slots 0, 1 and merge per layer; block 2 is its own run per layer.
  EXPECT_EQ(ticket.runs, 2u * kLayers);

  auto probe = Keys({101, 102, 999, 103});
  EXPECT_EQ(*pool->Lookup(engine.region, probe), 2u);

  std::vector<int64_t> targets = {9, 0, 15};
  std::vector<int64_t> layers;
  ASSERT_TRUE(LoadAndWait(*pool, engine.Transfer(keys, targets), &layers).ok());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE(engine.Holds(targets[i], 101 + i)) << i;
  EXPECT_EQ(layers, (std::vector<int64_t>{0, 1, 2}));  // layer-first: one completion per layer

  PoolStats s = pool->stats();
  EXPECT_EQ(s.capacity_slots, 8u);
  EXPECT_EQ(s.used_slots, 3u);
  EXPECT_EQ(s.pinned_slots, 0u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.bytes_in, ticket.bytes);
  EXPECT_EQ(s.bytes_out, ticket.bytes);
  EXPECT_NE(ToJson(s).find("\"hits\": 2, \"misses\": 2"), std::string::npos) << ToJson(s);
  EXPECT_NE(ToText(s).find("50.0% hit rate"), std::string::npos) << ToText(s);
}

TEST(OffloadPool, StoringAKeyTwiceCopiesItOnce) {
  auto pool = MakePool(4);
  Engine engine = Engine::Make(Shape("LBNHC", 4));
  auto keys = Keys({1, 2, 1});
  std::vector<int64_t> blocks = {0, 1, 2};
  StoreTicket ticket;
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(keys, blocks), &ticket).ok());
  EXPECT_EQ(ticket.stored, 2u);
  EXPECT_EQ(ticket.already_present, 1u);
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(keys, blocks), &ticket).ok());
  EXPECT_EQ(ticket.stored, 0u);
  EXPECT_EQ(ticket.already_present, 3u);
  EXPECT_EQ(pool->stats().used_slots, 2u);
}

TEST(OffloadPool, UnknownKeysInLoadFailPerKeyAndWriteNothing) {
  auto pool = MakePool(4);
  Engine engine = Engine::Make(Shape("LBNHC", 4));
  auto stored = Keys({1});
  std::vector<int64_t> b0 = {0};
  engine.Fill(0, 1);
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(stored, b0)).ok());

  engine.Fill(1, 50);
  engine.Fill(2, 51);
  engine.Fill(3, 52);
  auto keys = Keys({1, 0xdead, 0xbeef});
  std::vector<int64_t> targets = {1, 2, 3};
  Status s = LoadAndWait(*pool, engine.Transfer(keys, targets));
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_NE(s.message().find("2 of 3 keys"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("key 1 (adde000000000000)"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("key 2 (efbe000000000000)"), std::string::npos) << s.message();
  EXPECT_TRUE(engine.Holds(1, 50));  // not even the known key was written
  EXPECT_TRUE(engine.Holds(2, 51));
  EXPECT_TRUE(engine.Holds(3, 52));
  EXPECT_EQ(pool->stats().pinned_slots, 0u);
  using State = OffloadPool::KeyState;
  EXPECT_EQ(*pool->Probe(engine.region, keys),
            (std::vector<State>{State::kReady, State::kAbsent, State::kAbsent}));
}

TEST(OffloadPool, StoringPastCapacityEvictsLeastRecentlyUsed) {
  auto pool = MakePool(4);
  Engine engine = Engine::Make(Shape("LBNHC", 8));
  auto first = Keys({1, 2, 3, 4});
  std::vector<int64_t> b = {0, 1, 2, 3};
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(first, b)).ok());
  auto again = Keys({1});  // 1 becomes the most recently used
  std::vector<int64_t> b0 = {0};
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(again, b0)).ok());

  auto more = Keys({5, 6});
  std::vector<int64_t> b45 = {4, 5};
  StoreTicket ticket;
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(more, b45), &ticket).ok());
  ASSERT_EQ(ticket.evicted.size(), 2u);
  EXPECT_EQ(ticket.evicted[0], BlockKey::FromUint64(2));
  EXPECT_EQ(ticket.evicted[1], BlockKey::FromUint64(3));
  auto probe1 = Keys({1, 4, 5, 6});
  EXPECT_EQ(*pool->Lookup(engine.region, probe1), 4u);
  auto probe2 = Keys({2});
  EXPECT_EQ(*pool->Lookup(engine.region, probe2), 0u);
  EXPECT_EQ(pool->stats().evictions, 2u);
}

TEST(OffloadPool, MakingRoomNeverEvictsAKeyOfTheSameStore) {
  auto pool = MakePool(4);
  Engine engine = Engine::Make(Shape("LBNHC", 8));
  auto first = Keys({1, 2, 3, 4});
  std::vector<int64_t> b = {0, 1, 2, 3};
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(first, b)).ok());
  // Key 1 is the least recently used, but this store names it: it must survive.
  auto mixed = Keys({1, 5, 6, 7});
  std::vector<int64_t> b2 = {0, 4, 5, 6};
  StoreTicket ticket;
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(mixed, b2), &ticket).ok());
  EXPECT_EQ(ticket.already_present, 1u);
  EXPECT_EQ(ticket.evicted.size(), 3u);
  EXPECT_EQ(*pool->Lookup(engine.region, mixed), 4u);
  // Four new keys beside one present one cannot fit: refused, and nothing is evicted.
  auto too_many = Keys({1, 8, 9, 10, 11});
  std::vector<int64_t> b3 = {0, 1, 2, 3, 7};
  EXPECT_EQ(StoreAndWait(*pool, engine.Transfer(too_many, b3)).code(), Code::kResourceExhausted);
  EXPECT_EQ(*pool->Lookup(engine.region, mixed), 4u);
  EXPECT_EQ(pool->stats().pinned_slots, 0u);
}

TEST(OffloadPool, StoreLargerThanThePoolFailsLoudlyAndChangesNothing) {
  auto pool = MakePool(2);
  Engine engine = Engine::Make(Shape("LBNHC", 4));
  auto one = Keys({1});
  std::vector<int64_t> b0 = {0};
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(one, b0)).ok());
  auto three = Keys({2, 3, 4});
  std::vector<int64_t> b = {1, 2, 3};
  Status s = StoreAndWait(*pool, engine.Transfer(three, b));
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_NE(s.message().find("needs 3 slots"), std::string::npos) << s.message();
  EXPECT_EQ(*pool->Lookup(engine.region, one), 1u);
  EXPECT_EQ(pool->stats().evictions, 0u);
}

TEST(OffloadPool, SlotsInFlightAreNeverEvicted) {
  auto pool = MakePool(2);
  Engine engine = Engine::Make(Shape("LBNHC", 4));
  auto keys = Keys({1, 2});
  std::vector<int64_t> b = {0, 1};
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(keys, b)).ok());

  // Hold a load of both slots in flight: its first layer's completion waits for the test.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> entered;
  Done load_done;
  std::vector<int64_t> targets = {2, 3};
  std::atomic<bool> first{true};
  auto r = pool->Load(
      engine.Transfer(keys, targets),
      [&](int64_t) {
        if (first.exchange(false)) {
          entered.set_value();
          released.wait_for(seconds(10));
        }
      },
      load_done.callback());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(entered.get_future().wait_for(seconds(10)), std::future_status::ready);

  EXPECT_EQ(pool->stats().pinned_slots, 2u);
  auto other = Keys({3});
  std::vector<int64_t> b2 = {2};
  auto refused = pool->Store(engine.Transfer(other, b2), [](Status) {});
  EXPECT_EQ(refused.status().code(), Code::kResourceExhausted);

  release.set_value();
  ASSERT_TRUE(load_done.Wait().ok());
  StoreTicket ticket;
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(other, b2), &ticket).ok());
  EXPECT_EQ(ticket.evicted.size(), 1u);
}

TEST(OffloadPool, RejectsBadRequests) {
  auto pool = MakePool(4);
  Engine engine = Engine::Make(Shape("LBNHC", 4));
  auto keys = Keys({1, 2});
  std::vector<int64_t> one = {0};
  EXPECT_EQ(StoreAndWait(*pool, engine.Transfer(keys, one)).code(), Code::kInvalidArgument);
  std::vector<int64_t> outside = {0, 4};
  EXPECT_EQ(StoreAndWait(*pool, engine.Transfer(keys, outside)).code(), Code::kOutOfRange);
  std::vector<int64_t> ok = {0, 1};
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(keys, ok)).ok());
  std::vector<int64_t> twice = {3, 3};
  EXPECT_EQ(LoadAndWait(*pool, engine.Transfer(keys, twice)).code(), Code::kInvalidArgument);
  std::vector<BlockKey> empty(1);
  std::vector<int64_t> b0 = {0};
  EXPECT_EQ(StoreAndWait(*pool, engine.Transfer(empty, b0)).code(), Code::kInvalidArgument);
}

TEST(OffloadPool, RejectsAnotherLayoutShapeWithAMessage) {
  auto pool = MakePool(4);
  Engine engine = Engine::Make(Shape("LBNHC", 4));
  auto keys = Keys({1});
  std::vector<int64_t> b0 = {0};
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(keys, b0)).ok());

  Engine other = Engine::Make(Shape("LBNHC", 4, /*tokens=*/8));
  auto lookup = pool->Lookup(other.region, keys);
  EXPECT_EQ(lookup.status().code(), Code::kIncompatible);
  EXPECT_NE(lookup.status().message().find("3 layers × 2 heads × 8 tokens × 8 B"),
            std::string::npos)
      << lookup.status().message();
  EXPECT_NE(lookup.status().message().find("3 layers × 2 heads × 4 tokens × 8 B"),
            std::string::npos)
      << lookup.status().message();
  EXPECT_EQ(LoadAndWait(*pool, other.Transfer(keys, b0)).code(), Code::kIncompatible);
  EXPECT_EQ(StoreAndWait(*pool, other.Transfer(keys, b0)).code(), Code::kIncompatible);
}

TEST(OffloadPool, ConvertsBetweenPhysicalOrders) {
  auto pool = MakePool(4, "LBNHC");
  Engine layer_first = Engine::Make(Shape("LBNHC", 4));
  Engine blocks_first = Engine::Make(Shape("BLNHC", 4));
  auto keys = Keys({7, 8});
  std::vector<int64_t> b = {1, 2};
  layer_first.Fill(1, 7);
  layer_first.Fill(2, 8);
  ASSERT_TRUE(StoreAndWait(*pool, layer_first.Transfer(keys, b)).ok());
  std::vector<int64_t> targets = {3, 0};
  std::vector<int64_t> layers;
  ASSERT_TRUE(LoadAndWait(*pool, blocks_first.Transfer(keys, targets), &layers).ok());
  EXPECT_TRUE(blocks_first.Holds(3, 7));
  EXPECT_TRUE(blocks_first.Holds(0, 8));
  EXPECT_EQ(layers, (std::vector<int64_t>{0, 1, 2}));  // every layer, reported at the end
}

TEST(OffloadPool, ARestartedEngineFindsItsBlocks) {
  auto pool = MakePool(4);
  auto keys = Keys({41, 42});
  std::vector<int64_t> b = {0, 1};
  {
    Engine before = Engine::Make(Shape("LBNHC", 4));
    before.Fill(0, 41);
    before.Fill(1, 42);
    ASSERT_TRUE(StoreAndWait(*pool, before.Transfer(keys, b)).ok());
  }                                                // the engine's cache is gone
  Engine after = Engine::Make(Shape("LBNHC", 8));  // registers again, even with more blocks
  EXPECT_EQ(*pool->Lookup(after.region, keys), 2u);
  std::vector<int64_t> targets = {6, 7};
  ASSERT_TRUE(LoadAndWait(*pool, after.Transfer(keys, targets)).ok());
  EXPECT_TRUE(after.Holds(6, 41));
  EXPECT_TRUE(after.Holds(7, 42));
}

TEST(OffloadPool, TensorParallelRanksKeepTheirHeadsApart) {
  auto pool = MakePool(4);
  LayoutSpec rank0 = Shape("LBNHC", 2), rank1 = Shape("LBNHC", 2);
  rank0.tp_size = rank1.tp_size = 2;
  rank1.tp_rank = 1;
  Engine e0 = Engine::Make(rank0), e1 = Engine::Make(rank1);
  auto keys = Keys({5});
  std::vector<int64_t> b0 = {0};
  e0.Fill(0, 1);
  ASSERT_TRUE(StoreAndWait(*pool, e0.Transfer(keys, b0)).ok());
  EXPECT_EQ(*pool->Lookup(e1.region, keys), 0u);
  e1.Fill(0, 2);
  ASSERT_TRUE(StoreAndWait(*pool, e1.Transfer(keys, b0)).ok());
  std::vector<int64_t> b1 = {1};
  ASSERT_TRUE(LoadAndWait(*pool, e0.Transfer(keys, b1)).ok());
  ASSERT_TRUE(LoadAndWait(*pool, e1.Transfer(keys, b1)).ok());
  EXPECT_TRUE(e0.Holds(1, 1));
  EXPECT_TRUE(e1.Holds(1, 2));
}

TEST(OffloadPool, ConcurrentEnginesKeepEveryBlockIntact) {
  auto pool = MakePool(16);
  constexpr int kThreads = 4, kRounds = 200;
  std::atomic<int> corrupt{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Engine e = Engine::Make(Shape(t % 2 ? "BLNHC" : "LBNHC", 4));
      std::mt19937 rng(t);
      for (int round = 0; round < kRounds; ++round) {
        uint64_t v = rng() % 40;  // shared key space: threads hit each other's keys
        auto key = Keys({v});
        std::vector<int64_t> b0 = {0}, b1 = {1};
        if (rng() % 2) {
          e.Fill(0, static_cast<uint32_t>(v));
          Status s = StoreAndWait(*pool, e.Transfer(key, b0));
          if (!s.ok() && s.code() != Code::kResourceExhausted) ++failures;
        } else {
          Status s = LoadAndWait(*pool, e.Transfer(key, b1));
          if (s.ok() && !e.Holds(1, static_cast<uint32_t>(v))) ++corrupt;
          if (!s.ok() && s.code() != Code::kNotFound) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupt.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  PoolStats s = pool->stats();
  EXPECT_EQ(s.pinned_slots, 0u);
  EXPECT_LE(s.used_slots, 16u);
}

TEST(OffloadPool, LoadsWithoutLayerWaitersAreOnePhase) {
  auto pool = MakePool(4);
  Engine engine = Engine::Make(Shape("LBNHC", 8));
  auto keys = Keys({1, 2});
  std::vector<int64_t> b = {0, 1}, targets = {4, 5};
  engine.Fill(0, 1);
  engine.Fill(1, 2);
  ASSERT_TRUE(StoreAndWait(*pool, engine.Transfer(keys, b)).ok());
  Done done;
  auto ticket = pool->Load(engine.Transfer(keys, targets), nullptr, done.callback());
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  ASSERT_TRUE(done.Wait().ok());
  EXPECT_FALSE(ticket->per_layer);
  EXPECT_EQ(ticket->runs, static_cast<size_t>(kLayers));  // one merged run per layer
  EXPECT_TRUE(engine.Holds(4, 1));
  EXPECT_TRUE(engine.Holds(5, 2));
}

TEST(OffloadPool, GpuPagesNeedAPinnedPool) {
  auto pool = MakePool(4);  // on this machine (or with pinning off in a test) not pinned
  if (pool->stats().pinned_memory) GTEST_SKIP() << "the pool was pinned: a GPU is present";
  auto region = KvRegion::Create(Shape("LBNHC", 4));
  ASSERT_TRUE(region.ok());
  std::vector<std::byte> fake(region->span_bytes());
  auto keys = Keys({1});
  std::vector<int64_t> b0 = {0};
  Status s =
      StoreAndWait(*pool, {&*region, fake.data(), keys, b0, nullptr, MemoryLocation::Cuda(0)});
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_NE(s.message().find("not pinned"), std::string::npos) << s.message();
  EXPECT_EQ(pool->stats().used_slots, 0u);
}

TEST(DeviceCopy, ParsesItsNames) {
  EXPECT_EQ(*ParseDeviceCopy("auto"), DeviceCopy::kAuto);
  EXPECT_EQ(*ParseDeviceCopy("kernel"), DeviceCopy::kKernel);
  EXPECT_EQ(*ParseDeviceCopy("copy-engine"), DeviceCopy::kCopyEngine);
  EXPECT_EQ(ParseDeviceCopy("dma").status().code(), Code::kInvalidArgument);
}

TEST(OffloadPool, CapacityUnderOneSlotIsRejected) {
  PoolOptions options;
  options.slot_layout = Shape("LBNHC", 1);
  options.capacity_bytes = 100;
  auto pool = OffloadPool::Create(options);
  EXPECT_EQ(pool.status().code(), Code::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("holds no block"), std::string::npos);
}

}  // namespace
}  // namespace kv::offload
