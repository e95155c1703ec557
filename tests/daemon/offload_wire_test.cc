// The offload pool wired into kvd: store → lookup → load through the connector, against a kvd
// in this process (embedded) and a kvd process over its unix socket. Host memory, loopback only;
// every wait ends by the connector's timeout.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include "connector/client.h"
#include "connector/connector.h"
#include "daemon/daemon.h"
#include "tools/testing/kvd_process.h"

namespace kv {
namespace {

using connector::Connector;
using connector::ConnectorOptions;
using connector::KeyState;
using connector::KvCache;
using offload::BlockKey;

// 4 layers × 2 heads × 4 tokens × 16 B: a slot is 512 bytes.
constexpr uint64_t kSlotBytes = 4 * 2 * 4 * 16;

LayoutSpec Shape(const std::string& order, int64_t heads = 2) {
  LayoutSpec s;
  s.order = order;
  s.layers = 4;
  s.blocks = 16;
  s.heads = heads;
  s.block_size = 4;
  s.content_bytes = 16;
  return s;
}

std::vector<BlockKey> Keys(uint64_t first, size_t count) {
  std::vector<BlockKey> keys;
  for (size_t i = 0; i < count; ++i)
    keys.push_back(BlockKey::FromUint64(0x9e3779b97f4a7c15 * (first + i)));
  return keys;
}

// The byte content (l, h, n, c) of the block that holds key `key` — what the engine computed.
uint8_t Content(uint64_t key, int64_t l, int64_t h, int64_t n, int64_t c) {
  return static_cast<uint8_t>(key * 131 + l * 31 + h * 17 + n * 7 + c);
}

// Calls fn(byte, expected) for every content byte of `block` in layer `only_layer` (-1: every
// layer), `expected` being the content of the block that holds `key`.
template <typename Fn>
void ForEachByte(const KvCache& cache, int64_t block, uint64_t key, int64_t only_layer, Fn fn) {
  auto* base = static_cast<uint8_t*>(cache.base);
  const KvRegion r = connector::RegionOf(cache);
  for (int64_t l = 0; l < r.size(Axis::kL); ++l) {
    if (only_layer >= 0 && l != only_layer) continue;
    for (int64_t h = 0; h < r.size(Axis::kH); ++h)
      for (int64_t n = 0; n < r.size(Axis::kN); ++n)
        for (int64_t c = 0; c < r.logical_content_bytes(); ++c)
          fn(base[r.offset(l, block, h, n) + c], Content(key, l, h, n, c));
  }
}

void Fill(const KvCache& cache, int64_t block, uint64_t key) {
  ForEachByte(cache, block, key, -1, [](uint8_t& byte, uint8_t expected) { byte = expected; });
}

// Mismatches of `block` against the content of `key`, in layer `only_layer` or every layer.
int64_t Mismatches(const KvCache& cache, int64_t block, uint64_t key, int64_t only_layer = -1) {
  int64_t bad = 0;
  ForEachByte(cache, block, key, only_layer,
              [&bad](uint8_t byte, uint8_t expected) { bad += byte != expected; });
  return bad;
}

enum class Where { kEmbedded, kProcess };

class OffloadWire : public ::testing::TestWithParam<Where> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvd-offwire-" + std::to_string(getpid()) + "-" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            std::to_string(reinterpret_cast<uintptr_t>(this)));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    daemon_.reset();
    process_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A kvd with a pool of `slots` slots (0: no pool).
  void StartKvd(uint64_t slots) {
    if (GetParam() == Where::kEmbedded) {
      daemon::DaemonOptions o;
      o.name = "offload";
      o.listen = "";
      o.transport_name = "local";
      o.offload_bytes = slots * kSlotBytes;
      auto d = daemon::Daemon::Start(std::move(o));
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      daemon_ = *d;
      return;
    }
    kv::harness::KvdProcess::Options o;
    o.binary = kv::harness::KvdBesideSelf();
    o.name = "offload";
    o.socket_path = (dir_ / "kvd.sock").string();
    o.transport = "local";
    o.extra_args = {"--log-level", "warn", "--offload-bytes", std::to_string(slots * kSlotBytes)};
    auto p = kv::harness::KvdProcess::Start(o);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    process_ = std::move(*p);
  }

  // A connected engine with one registered cache of `shape`.
  std::unique_ptr<Connector> Engine(const std::string& instance, const LayoutSpec& shape,
                                    KvCache* cache) {
    ConnectorOptions o;
    o.instance = instance;
    o.timeout = std::chrono::milliseconds(10000);
    auto c =
        daemon_ ? Connector::OpenEmbedded(daemon_, o) : Connector::Open(process_->socket_path(), o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    auto caches = (*c)->RegisterKvCaches(connector::HostCaches({&shape, 1}));
    EXPECT_TRUE(caches.ok()) << caches.status().ToString();
    if (!caches.ok()) return nullptr;
    *cache = caches->front();
    return std::move(*c);
  }

  proto::OffloadStatus PoolStatus(Connector& c) {
    auto s = connector::DaemonStatusOf(c);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->offload() : proto::OffloadStatus();
  }

  std::filesystem::path dir_;
  std::shared_ptr<daemon::Daemon> daemon_;
  std::unique_ptr<kv::harness::KvdProcess> process_;
};

TEST_P(OffloadWire, StoreLookupLoadRoundTrip) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(64));
  KvCache cache;
  auto engine = Engine("e", Shape("LBNHC"), &cache);
  ASSERT_TRUE(engine);
  const std::vector<int64_t> src = {3, 1, 7, 2};
  for (size_t i = 0; i < src.size(); ++i) Fill(cache, src[i], 100 + i);
  auto keys = Keys(100, 4);
  auto stored = engine->OffloadStore(keys, src);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->stored, 4u);
  EXPECT_TRUE(stored->evicted.empty());
  EXPECT_EQ(stored->bytes, 4 * kSlotBytes);
  ASSERT_TRUE(stored->op.Wait().ok());

  // Two more keys the pool never saw: the prefix stops at them.
  auto asked = Keys(100, 6);
  auto hits = engine->OffloadLookup(asked);
  ASSERT_TRUE(hits.ok()) << hits.status().ToString();
  EXPECT_EQ(*hits, 4u);

  const std::vector<int64_t> dst = {8, 9, 10, 12};
  auto loaded = engine->OffloadLoad(keys, dst, /*per_layer=*/true);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(loaded->per_layer);  // layer-first cache: layers land one by one
  for (int l = 0; l < 4; ++l) {
    ASSERT_TRUE(loaded->op.WaitLayer(l).ok()) << "layer " << l;
    for (size_t i = 0; i < dst.size(); ++i) EXPECT_EQ(Mismatches(cache, dst[i], 100 + i, l), 0);
  }
  ASSERT_TRUE(loaded->op.Wait().ok());

  const proto::OffloadStatus s = PoolStatus(*engine);
  EXPECT_TRUE(s.enabled());
  EXPECT_EQ(s.capacity_slots(), 64u);
  EXPECT_EQ(s.used_slots(), 4u);
  EXPECT_EQ(s.hits(), 4u);
  EXPECT_EQ(s.misses(), 2u);
  EXPECT_EQ(s.bytes_in(), 4 * kSlotBytes);
  EXPECT_EQ(s.bytes_out(), 4 * kSlotBytes);
  EXPECT_NE(s.shape().find("4 layers"), std::string::npos) << s.shape();
  // Offload ops are not P/D requests: GetFinished never reports them.
  EXPECT_TRUE(engine->GetFinished().received.empty());
}

TEST_P(OffloadWire, WholeLoadWithoutPerLayerWaits) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(16));
  KvCache cache;
  auto engine = Engine("e", Shape("BLNHC"), &cache);
  ASSERT_TRUE(engine);
  Fill(cache, 5, 7);
  auto keys = Keys(7, 1);
  auto stored = engine->OffloadStore(keys, std::vector<int64_t>{5});
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  ASSERT_TRUE(stored->op.Wait().ok());
  auto loaded = engine->OffloadLoad(keys, std::vector<int64_t>{0});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_FALSE(loaded->per_layer);
  ASSERT_TRUE(loaded->op.WaitLayer(0).ok());  // every layer lands with the whole load
  ASSERT_TRUE(loaded->op.Wait().ok());
  EXPECT_EQ(Mismatches(cache, 0, 7), 0);
}

// An engine that goes away and a new one with the same block shape (another physical order,
// even) finds the blocks the first one stored: the pool is keyed, not tied to an engine.
TEST_P(OffloadWire, RestartedEngineFindsItsPages) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(16));
  auto keys = Keys(40, 3);
  {
    KvCache cache;
    auto first = Engine("vllm-0", Shape("LBNHC"), &cache);
    ASSERT_TRUE(first);
    for (int64_t b = 0; b < 3; ++b) Fill(cache, b, 40 + b);
    auto stored = first->OffloadStore(keys, std::vector<int64_t>{0, 1, 2});
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    ASSERT_TRUE(stored->op.Wait().ok());
  }  // disconnects; its shared memory is gone from this process
  KvCache cache;
  auto second = Engine("vllm-0", Shape("BLNHC"), &cache);
  ASSERT_TRUE(second);
  auto hits = second->OffloadLookup(keys);
  ASSERT_TRUE(hits.ok()) << hits.status().ToString();
  EXPECT_EQ(*hits, 3u);
  auto loaded = second->OffloadLoad(keys, std::vector<int64_t>{15, 4, 9});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_TRUE(loaded->op.Wait().ok());
  EXPECT_EQ(Mismatches(cache, 15, 40), 0);
  EXPECT_EQ(Mismatches(cache, 4, 41), 0);
  EXPECT_EQ(Mismatches(cache, 9, 42), 0);
}

// Security issue 19: keys are namespaced per engine instance. Tenant B loaded tenant A's block by
// its hash before; now it can neither look it up nor load it.
TEST_P(OffloadWire, AnotherInstanceCannotLookUpOrLoadItsKeys) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(16));
  KvCache a_cache, b_cache;
  auto a = Engine("tenant-a", Shape("LBNHC"), &a_cache);
  auto b = Engine("tenant-b", Shape("LBNHC"), &b_cache);
  ASSERT_TRUE(a && b);
  Fill(a_cache, 0, 7);
  auto keys = Keys(7, 1);
  auto stored = a->OffloadStore(keys, std::vector<int64_t>{0});
  ASSERT_TRUE(stored.ok() && stored->op.Wait().ok());
  auto theirs = b->OffloadLookup(keys);
  ASSERT_TRUE(theirs.ok()) << theirs.status().ToString();
  EXPECT_EQ(*theirs, 0u);
  auto loaded = b->OffloadLoad(keys, std::vector<int64_t>{3});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), Code::kNotFound);
  EXPECT_GT(Mismatches(b_cache, 3, 7), 0) << "tenant A's bytes reached tenant B";
  auto mine = a->OffloadLookup(keys);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(*mine, 1u);
}

// Copies in flight when their engine goes away still land, and their completions (for an
// engine kvd no longer knows) are dropped quietly.
TEST_P(OffloadWire, EngineLeavingWithStoresInFlight) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(128));
  std::vector<BlockKey> all;
  {
    KvCache cache;
    auto engine = Engine("leaver", Shape("LBNHC"), &cache);
    ASSERT_TRUE(engine);
    std::vector<connector::OffloadStored> pending;
    for (uint64_t round = 0; round < 4; ++round) {
      auto keys = Keys(1000 + 16 * round, 16);
      std::vector<int64_t> blocks(16);
      for (int64_t b = 0; b < 16; ++b) {
        blocks[b] = b;
        Fill(cache, b, 1000 + 16 * round + b);
      }
      auto stored = engine->OffloadStore(keys, blocks);
      ASSERT_TRUE(stored.ok()) << stored.status().ToString();
      pending.push_back(std::move(*stored));
      all.insert(all.end(), keys.begin(), keys.end());
      // The engine rewrites its blocks only after a store landed.
      ASSERT_TRUE(pending.back().op.Wait().ok());
    }
    // One more, not waited for: the engine disconnects with it in flight.
    auto last = engine->OffloadStore(
        Keys(5000, 16),
        std::vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
    ASSERT_TRUE(last.ok()) << last.status().ToString();
  }
  KvCache cache;
  // The same instance, restarted: keys are namespaced per instance (security issue 19).
  auto next = Engine("leaver", Shape("LBNHC"), &cache);
  ASSERT_TRUE(next);
  // The in-flight store lands on the pool's copy thread; poll its keys, bounded.
  auto in_flight = Keys(5000, 16);
  size_t hits = 0;
  for (int attempt = 0; attempt < 500 && hits < in_flight.size(); ++attempt) {
    auto states = next->OffloadProbe(in_flight);
    ASSERT_TRUE(states.ok()) << states.status().ToString();
    hits = std::count(states->begin(), states->end(), KeyState::kReady);
    if (hits < in_flight.size()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(hits, in_flight.size());
  auto found = next->OffloadLookup(all);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, all.size());
  auto loaded = next->OffloadLoad(
      std::span(all).subspan(48, 16),
      std::vector<int64_t>({15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_TRUE(loaded->op.Wait().ok());
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(Mismatches(cache, 15 - i, 1048 + i), 0) << i;
}

// kvd stopping with copies in flight: it waits for them; the engine's waits end, none hangs.
TEST_P(OffloadWire, KvdStoppingWithCopiesInFlight) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(64));
  KvCache cache;
  auto engine = Engine("e", Shape("LBNHC"), &cache);
  ASSERT_TRUE(engine);
  auto stored = engine->OffloadStore(
      Keys(1, 16), std::vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  if (daemon_) {
    daemon_->Shutdown();
  } else {
    auto code = process_->Stop(std::chrono::milliseconds(5000));
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    EXPECT_EQ(*code, 0);
  }
  Status waited = stored->op.Wait();
  // Either the completion made it out before the connection closed, or the wait names kvd.
  EXPECT_TRUE(waited.ok() || waited.code() == Code::kUnavailable) << waited.ToString();
  EXPECT_EQ(engine->OffloadLookup(Keys(1, 1)).status().code(), Code::kUnavailable);
}

TEST_P(OffloadWire, UnknownKeysInLoadAreNamedAndNothingIsWritten) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(16));
  KvCache cache;
  auto engine = Engine("e", Shape("LBNHC"), &cache);
  ASSERT_TRUE(engine);
  Fill(cache, 0, 1);
  auto known = Keys(1, 1);
  auto stored = engine->OffloadStore(known, std::vector<int64_t>{0});
  ASSERT_TRUE(stored.ok() && stored->op.Wait().ok());

  Fill(cache, 5, 55);
  Fill(cache, 6, 66);
  std::vector<BlockKey> keys = {known[0], Keys(999, 1)[0], Keys(777, 1)[0]};
  std::vector<connector::MissingKey> missing;
  auto loaded = engine->OffloadLoad(keys, std::vector<int64_t>{5, 6, 7}, false, 0, &missing);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), Code::kNotFound);
  EXPECT_NE(loaded.status().message().find(keys[1].ToHex()), std::string::npos)
      << loaded.status().ToString();
  EXPECT_NE(loaded.status().message().find(keys[2].ToHex()), std::string::npos);
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(missing[0].index, 1u);
  EXPECT_EQ(missing[0].state, KeyState::kAbsent);
  EXPECT_EQ(missing[1].index, 2u);
  // Nothing written, not even the key that was present.
  EXPECT_EQ(Mismatches(cache, 5, 55), 0);
  EXPECT_EQ(Mismatches(cache, 6, 66), 0);
  EXPECT_TRUE(engine->GetFailedBlocks().empty());
  // The connection is alive.
  auto hits = engine->OffloadLookup(known);
  ASSERT_TRUE(hits.ok()) << hits.status().ToString();
  EXPECT_EQ(*hits, 1u);
}

TEST_P(OffloadWire, PastCapacityEvictsAndSaysSo) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(4));
  KvCache cache;
  auto engine = Engine("e", Shape("LBNHC"), &cache);
  ASSERT_TRUE(engine);
  auto first = Keys(10, 4);
  auto a = engine->OffloadStore(first, std::vector<int64_t>{0, 1, 2, 3});
  ASSERT_TRUE(a.ok() && a->op.Wait().ok());
  // Touch keys 12 and 13 so 10 and 11 are the least recently used.
  auto touched = engine->OffloadLoad(std::span(first).subspan(2), std::vector<int64_t>{8, 9});
  ASSERT_TRUE(touched.ok() && touched->op.Wait().ok());

  auto more = Keys(20, 2);
  auto b = engine->OffloadStore(more, std::vector<int64_t>{4, 5});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(b->op.Wait().ok());
  ASSERT_EQ(b->evicted.size(), 2u);
  EXPECT_EQ(b->evicted[0], first[0]);
  EXPECT_EQ(b->evicted[1], first[1]);
  auto hits = engine->OffloadLookup(first);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ(*hits, 0u);
  EXPECT_EQ(PoolStatus(*engine).evictions(), 2u);

  // More new keys than the pool has slots: refused as a whole, never dropped silently.
  auto too_many = engine->OffloadStore(Keys(50, 5), std::vector<int64_t>{0, 1, 2, 3, 4});
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), Code::kResourceExhausted) << too_many.status().ToString();
  auto still = engine->OffloadLookup(more);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(*still, 2u);
}

TEST_P(OffloadWire, OtherBlockShapeIsRejectedWithBothShapes) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(16));
  KvCache cache, wide_cache;
  auto engine = Engine("small", Shape("LBNHC"), &cache);
  ASSERT_TRUE(engine);
  auto stored = engine->OffloadStore(Keys(1, 1), std::vector<int64_t>{0});
  ASSERT_TRUE(stored.ok() && stored->op.Wait().ok());
  auto wide = Engine("wide", Shape("LBNHC", /*heads=*/4), &wide_cache);
  ASSERT_TRUE(wide);
  auto refused = wide->OffloadStore(Keys(1, 1), std::vector<int64_t>{0});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kIncompatible);
  EXPECT_NE(refused.status().message().find("4 heads"), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("2 heads"), std::string::npos);
  EXPECT_EQ(wide->OffloadLookup(Keys(1, 1)).status().code(), Code::kIncompatible);
}

TEST_P(OffloadWire, BadRequestsGetClearErrorsAndTheConnectionLives) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(16));
  KvCache cache;
  auto engine = Engine("e", Shape("LBNHC"), &cache);
  ASSERT_TRUE(engine);
  auto keys = Keys(1, 2);
  const std::vector<int64_t> blocks = {0, 1};
  auto code = [](const auto& r) { return r.status().code(); };
  EXPECT_EQ(code(engine->OffloadStore(keys, std::vector<int64_t>{0, 16})), Code::kOutOfRange);
  EXPECT_EQ(code(engine->OffloadStore(keys, std::vector<int64_t>{0, -1})), Code::kOutOfRange);
  EXPECT_EQ(code(engine->OffloadStore(keys, std::vector<int64_t>{0})), Code::kInvalidArgument);
  EXPECT_EQ(code(engine->OffloadStore(keys, blocks, /*region=*/3)), Code::kOutOfRange);
  EXPECT_EQ(code(engine->OffloadStore({}, {})), Code::kInvalidArgument);
  // One destination block named twice.
  EXPECT_EQ(code(engine->OffloadLoad(keys, std::vector<int64_t>{4, 4})), Code::kInvalidArgument);
  EXPECT_EQ(engine->SaveLayer("offload:1", 0, blocks).code(), Code::kInvalidArgument);
  // Nothing was stored by any of the above; the connection still answers.
  auto hits = engine->OffloadLookup(keys);
  ASSERT_TRUE(hits.ok()) << hits.status().ToString();
  EXPECT_EQ(*hits, 0u);
  auto ok = engine->OffloadStore(keys, blocks);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(ok->op.Wait().ok());
}

// What a client other than the connector may send: keys of any length, counts that differ.
TEST_P(OffloadWire, MalformedKeysOnTheWireAreRefusedOneByOne) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(16));
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  if (daemon_) {
    ASSERT_TRUE(daemon_->AttachEngine(fds[1]).ok());
  } else {
    close(fds[1]);
    fds[0] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, process_->socket_path().c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(connect(fds[0], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  auto client = connector::ConnectorCore::Client::Create(fds[0], std::chrono::milliseconds(5000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  connector::ConnectorCore::Client& raw = **client;
  proto::EngineMessage hello;
  hello.mutable_hello()->set_protocol_version(proto::PROTOCOL_VERSION);
  hello.mutable_hello()->set_instance("raw");
  hello.mutable_hello()->set_tp_size(1);
  ASSERT_TRUE(raw.Call(hello).ok());
  for (size_t length : {0, 4, 7, 33, 64}) {
    proto::EngineMessage m;
    m.mutable_offload_lookup()->add_keys(std::string(length, 'k'));
    auto r = raw.Call(m);
    ASSERT_FALSE(r.ok()) << length;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find("key 0"), std::string::npos) << r.status().ToString();
  }
  proto::EngineMessage uneven;
  uneven.mutable_offload_store()->set_request_id("offload:x");
  uneven.mutable_offload_store()->add_keys(std::string(8, 'k'));
  EXPECT_EQ(raw.Call(uneven).status().code(), Code::kInvalidArgument);
  proto::EngineMessage unnamed;
  unnamed.mutable_offload_load()->add_keys(std::string(8, 'k'));
  unnamed.mutable_offload_load()->add_block_ids(0);
  EXPECT_EQ(raw.Call(unnamed).status().code(), Code::kInvalidArgument);
  // Well-formed, but this client registered no region.
  proto::EngineMessage no_region;
  no_region.mutable_offload_lookup()->add_keys(std::string(8, 'k'));
  auto r = raw.Call(no_region);
  EXPECT_EQ(r.status().code(), Code::kOutOfRange) << r.status().ToString();
  // The connection is alive.
  proto::EngineMessage status;
  status.mutable_status();
  auto s = raw.Call(status);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->status().offload().enabled());
}

TEST_P(OffloadWire, WithoutAPoolOffloadIsUnsupported) {
  ASSERT_NO_FATAL_FAILURE(StartKvd(0));
  KvCache cache;
  auto engine = Engine("e", Shape("LBNHC"), &cache);
  ASSERT_TRUE(engine);
  auto r = engine->OffloadStore(Keys(1, 1), std::vector<int64_t>{0});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnsupported);
  EXPECT_NE(r.status().message().find("--offload-bytes"), std::string::npos);
  EXPECT_FALSE(PoolStatus(*engine).enabled());
}

INSTANTIATE_TEST_SUITE_P(Modes, OffloadWire, ::testing::Values(Where::kEmbedded, Where::kProcess),
                         [](const auto& info) {
                           return info.param == Where::kEmbedded ? "Embedded" : "OverSocket";
                         });

}  // namespace
}  // namespace kv
