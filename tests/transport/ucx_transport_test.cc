// The ucx backend with two workers in one process, over TCP and over shared memory.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>

#include "base/codec.h"
#include "tests/support/test_support.h"
#include "transport/transport.h"

namespace kv::transport {
namespace {

using namespace std::chrono_literals;
using testing::ExpectCopied;
using testing::Fill;
using testing::PostAndWait;
using testing::SpreadRuns;
using testing::Waiter;

// UCX itself: host registrations are UCX's alone (stage_runs_below=0: no chooser, whose
// registrations carry a staged region id beside UCX's descriptor), so these tests see UCX's
// descriptors and its put paths for every batch.
TransportOptions Tls(const std::string& tls) {
  return {{{"UCX_TLS", tls}, {"stage_runs_below", "0"}}};
}

class UcxPair : public ::testing::TestWithParam<std::string> {
 public:
  // The settings of both transports.
  virtual TransportOptions Options() const { return Tls(GetParam()); }
  void SetUp() override {
    auto a = CreateTransport("ucx", Options());
    auto b = CreateTransport("ucx", Options());
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    initiator = std::move(*a);
    target = std::move(*b);
    src.resize(8 << 20);
    dst.assign(16 << 20, 0xEE);
    Fill(src, 3);
    auto s = initiator->register_memory(src.data(), src.size(), MemoryLocation::Host());
    auto d = target->register_memory(dst.data(), dst.size(), MemoryLocation::Host());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    src_reg = std::move(*s);
    dst_reg = std::move(*d);
    auto p = initiator->connect(target->address());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    peer = *p;
    auto r = initiator->import_remote(peer, dst_reg->packed_descriptor());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    remote = std::move(*r);
  }
  // Registrations and descriptors go before their transports (the Transport contract).
  void TearDown() override {
    remote.reset();
    src_reg.reset();
    dst_reg.reset();
    initiator.reset();
    target.reset();
  }

  std::unique_ptr<Transport> initiator, target;
  std::vector<uint8_t> src, dst;
  std::unique_ptr<MemoryRegistration> src_reg, dst_reg;
  PeerId peer = 0;
  std::unique_ptr<RemoteMemory> remote;
};

TEST_P(UcxPair, ManyBatchesInFlightAllComplete) {
  std::vector<Waiter> waiters(64);
  for (size_t i = 0; i < waiters.size(); ++i) {
    std::vector<kv::Run> runs = {{i * 4096, i * 8192, 4096}};
    ASSERT_TRUE(initiator
                    ->post({Op::kPut, src_reg.get(), remote.get(), runs, testing::In(10s)},
                           waiters[i].callback())
                    .ok());
  }
  for (auto& w : waiters) ASSERT_TRUE(w.Wait().ok());
  for (size_t i = 0; i < waiters.size(); ++i)
    ASSERT_EQ(0, std::memcmp(src.data() + i * 4096, dst.data() + i * 8192, 4096)) << i;
}

// A batch takes its own references to its mapping and remote key on the progress thread; the
// registration and the descriptor lend them until then. Destroyed right after post(), before the
// progress thread can have taken them, they must still outlive every batch posted with them.
TEST_P(UcxPair, RegistrationAndDescriptorDestroyedRightAfterPostOutliveTheirBatches) {
  std::vector<uint8_t> local(1 << 20);
  Fill(local, 7);
  auto reg = initiator->register_memory(local.data(), local.size(), MemoryLocation::Host());
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  auto r = initiator->import_remote(peer, dst_reg->packed_descriptor());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<Waiter> waiters(64);
  for (size_t i = 0; i < waiters.size(); ++i) {
    std::vector<kv::Run> runs = {{i * 16384, i * 16384, 16384}};
    ASSERT_TRUE(
        initiator
            ->post({Op::kPut, reg->get(), r->get(), runs, testing::In(10s)}, waiters[i].callback())
            .ok());
  }
  r->reset();
  reg->reset();
  for (auto& w : waiters) ASSERT_TRUE(w.Wait().ok());
  EXPECT_EQ(0, std::memcmp(local.data(), dst.data(), local.size()));
}

// A local registration of another ucx transport names another engine's mapping: refused.
TEST_P(UcxPair, LocalMemoryOfAnotherTransportIsRefused) {
  std::vector<uint8_t> other(4096, 0x11);
  auto foreign = target->register_memory(other.data(), other.size(), MemoryLocation::Host());
  ASSERT_TRUE(foreign.ok()) << foreign.status().ToString();
  std::vector<kv::Run> runs = {{0, 0, 4096}};
  Status s = initiator->post({Op::kPut, foreign->get(), remote.get(), runs, testing::In(10s)},
                             [](Status) { ADD_FAILURE() << "a refused batch must not complete"; });
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_EQ(dst, std::vector<uint8_t>(dst.size(), 0xEE));
}

// Posts `count` batches of one 1 MiB slice each, a notification after each; the receiver checks
// the slice's bytes when its notification arrives: one that overtook its data would see stale
// bytes.
void ExpectNotificationsAfterTheirData(UcxPair& pair, PeerId peer, uint64_t count) {
  std::mutex mu;
  std::vector<std::string> seen;
  std::atomic<int> stale{0};
  const uint64_t slice = 1 << 20;
  pair.target->set_notification_handler([&](std::string_view m) {
    uint64_t i = std::stoull(std::string(m));
    if (std::memcmp(pair.src.data() + i * slice, pair.dst.data() + i * slice, slice) != 0) ++stale;
    std::lock_guard lock(mu);
    seen.emplace_back(m);
  });
  std::vector<Waiter> waiters(count);
  for (uint64_t i = 0; i < waiters.size(); ++i) {
    std::vector<kv::Run> runs = {{i * slice, i * slice, slice}};
    ASSERT_TRUE(
        pair.initiator
            ->post({Op::kPut, pair.src_reg.get(), pair.remote.get(), runs, testing::In(10s)},
                   waiters[i].callback())
            .ok());
    ASSERT_TRUE(pair.initiator->notify(peer, std::to_string(i)).ok());
  }
  for (auto& w : waiters) ASSERT_TRUE(w.Wait().ok());
  for (int i = 0; i < 10000; ++i) {
    {
      std::lock_guard lock(mu);
      if (seen.size() == waiters.size()) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  // Stops the handler before `seen` and `stale` go out of scope.
  pair.target->set_notification_handler([](std::string_view) {});
  std::lock_guard lock(mu);
  ASSERT_EQ(seen.size(), waiters.size());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], std::to_string(i)) << "out of order";
  EXPECT_EQ(stale, 0);
}

TEST_P(UcxPair, DisconnectForgetsThePeerAndReconnectWorks) {
  initiator->disconnect(peer);
  std::vector<kv::Run> runs = {{0, 0, 1}};
  EXPECT_EQ(
      initiator->post({Op::kPut, src_reg.get(), remote.get(), runs, testing::In(1s)}, [](Status) {})
          .code(),
      Code::kNotFound);
  EXPECT_EQ(initiator->notify(peer, "x").code(), Code::kNotFound);
  auto p = initiator->connect(target->address());
  ASSERT_TRUE(p.ok());
  auto r = initiator->import_remote(*p, dst_reg->packed_descriptor());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(PostAndWait(*initiator, Op::kPut, *src_reg, **r, {{0, 0, 4096}}).ok());
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 4096));
}

// A peer that comes through open_endpoint() has a worker of its own on this side (a sender
// killed mid-write into a shared-memory FIFO wedges the worker it wrote to); the peers on the
// shared worker carry on when it goes.
TEST_P(UcxPair, AnEndpointServesItsPeerAndGoesWithIt) {
  auto endpoint = target->open_endpoint();
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  EXPECT_NE(endpoint->id, 0u);
  EXPECT_NE(endpoint->address, target->address());
  auto unused = target->open_endpoint();
  ASSERT_TRUE(unused.ok());
  target->release_endpoint(unused->id);

  auto other = CreateTransport("ucx", Tls(GetParam()));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  {
    auto reg = (*other)->register_memory(src.data(), src.size(), MemoryLocation::Host());
    ASSERT_TRUE(reg.ok());
    auto to_target = (*other)->connect(endpoint->address);
    ASSERT_TRUE(to_target.ok()) << to_target.status().ToString();
    auto back = target->connect_endpoint((*other)->address(), endpoint->id);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    // Consumed: a second connect on it is refused, and so is a released one.
    EXPECT_EQ(target->connect_endpoint((*other)->address(), endpoint->id).status().code(),
              Code::kNotFound);
    EXPECT_EQ(target->connect_endpoint((*other)->address(), unused->id).status().code(),
              Code::kNotFound);
    auto r = (*other)->import_remote(*to_target, dst_reg->packed_descriptor());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(PostAndWait(**other, Op::kPut, **reg, **r, {{8192, 1 << 20, 8192}}).ok());
    EXPECT_EQ(0, std::memcmp(src.data() + 8192, dst.data() + (1 << 20), 8192));
    r->reset();
    (*other)->disconnect(*to_target);
    target->disconnect(*back);
  }
  // The shared worker still serves the initiator.
  ASSERT_TRUE(PostAndWait(*initiator, Op::kPut, *src_reg, *remote, {{0, 0, 8192}}).ok());
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 8192));
}

TEST_P(UcxPair, DisconnectWithBatchesInFlightCompletesEveryOne) {
  std::vector<kv::Run> runs = {{0, 0, src.size()}};
  // Let wire-up finish first: UCX 1.13 aborts the peer's process when an endpoint is reset while
  // the peer still owes it a wire-up reply (see ucx_progress.cc, FailPeer).
  ASSERT_TRUE(PostAndWait(*initiator, Op::kPut, *src_reg, *remote, runs).ok());
  std::vector<Waiter> waiters(8);
  for (auto& w : waiters) {
    ASSERT_TRUE(
        initiator
            ->post({Op::kPut, src_reg.get(), remote.get(), runs, testing::In(10s)}, w.callback())
            .ok());
  }
  initiator->disconnect(peer);
  for (auto& w : waiters) {
    Status s = w.Wait();
    // Batches that landed before the disconnect are OK; the rest are aborted, none hang.
    EXPECT_TRUE(s.ok() || s.code() == Code::kAborted) << s.ToString();
  }
}

TEST_P(UcxPair, RegistrationOfTheSameSlabIsShared) {
  auto again = initiator->register_memory(src.data(), src.size(), MemoryLocation::Host());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->packed_descriptor(), src_reg->packed_descriptor());
  EXPECT_EQ(initiator->register_memory(nullptr, 10, MemoryLocation::Host()).status().code(),
            Code::kInvalidArgument);
}

TEST_P(UcxPair, PutsIntoMemoryTheTransportAllocated) {
  auto target_memory = target->allocate_memory(1 << 20, MemoryLocation::Host());
  ASSERT_TRUE(target_memory.ok()) << target_memory.status().ToString();
  ASSERT_NE((*target_memory)->base(), nullptr);
  EXPECT_EQ((*target_memory)->length(), 1u << 20);
  std::memset((*target_memory)->base(), 0xEE, 1 << 20);
  auto r = initiator->import_remote(peer, (*target_memory)->packed_descriptor());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto runs = SpreadRuns(64, 8192, 8192);
  ASSERT_TRUE(PostAndWait(*initiator, Op::kPut, *src_reg, **r, runs).ok());
  const auto* bytes = static_cast<const uint8_t*>((*target_memory)->base());
  ExpectCopied(src, std::vector<uint8_t>(bytes, bytes + (1 << 20)), runs, 0xEE);
  r->reset();
  EXPECT_EQ(target->allocate_memory(0, MemoryLocation::Host()).status().code(),
            Code::kInvalidArgument);
}

TEST_P(UcxPair, MalformedAddressesAndDescriptorsAreRejected) {
  EXPECT_EQ(initiator->connect("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(initiator->connect(target->address().substr(0, 10)).status().code(),
            Code::kInvalidArgument);
  std::string d = dst_reg->packed_descriptor();
  EXPECT_EQ(initiator->import_remote(peer, d.substr(0, d.size() - 1)).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(initiator->import_remote(peer + 100, d).status().code(), Code::kNotFound);
  EXPECT_EQ(initiator->notify(peer, std::string(1 << 20, 'x')).code(), Code::kInvalidArgument);
}

TEST_P(UcxPair, DeviceMemoryIsRefusedWhereUcxHasNoCuda) {
  if (initiator->supports(MemoryKind::kCuda)) GTEST_SKIP() << "this UCX reaches CUDA memory";
  auto r = initiator->register_memory(src.data(), 4096, MemoryLocation::Cuda(0));
  EXPECT_EQ(r.status().code(), Code::kUnsupported);
  EXPECT_NE(r.status().message().find("pinned host"), std::string::npos);
}

// Over tcp puts travel as active messages the target copies itself (ucx_am_put.cc): a descriptor
// naming an address the target never registered must not let a peer write there.
TEST_P(UcxPair, APutMessageIntoMemoryTheTargetNeverRegisteredIsRefused) {
  if (GetParam() != "tcp") GTEST_SKIP() << "puts are UCX's RMA here, checked by its rkey";
  std::vector<uint8_t> unregistered(4096, 0x5A);
  std::string forged = dst_reg->packed_descriptor();
  const uint64_t address = reinterpret_cast<uintptr_t>(unregistered.data());
  std::memcpy(forged.data() + 8, &address, sizeof address);  // after the magic and the version
  auto r = initiator->import_remote(peer, forged);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Security issue 19: the target does not answer a refused write (a "refused" answer was an
  // address oracle); the batch fails at its deadline, the peer with it.
  Status s = PostAndWait(*initiator, Op::kPut, *src_reg, **r, {{0, 0, 4096}}, 2s);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), Code::kInvalidArgument) << "answered: " << s.ToString();
  EXPECT_EQ(unregistered, std::vector<uint8_t>(4096, 0x5A));
}

// Security issue 19: what a peer hands the backend is checked before UCX parses it. 8 random
// bytes as a remote key segfaulted kvd in ucp_ep_rkey_unpack; a malformed worker address aborted
// it on an assertion in ucp_ep_create; an endpoint to one of its own workers let a peer aim UCX
// at kvd's own memory.
TEST_P(UcxPair, MalformedRkeysAndWorkerAddressesAreRefusedBeforeUcxParsesThem) {
  std::mt19937_64 rng(19);
  auto random_bytes = [&](size_t n) {
    std::string out(n, '\0');
    for (auto& c : out) c = static_cast<char>(rng());
    return out;
  };
  // The descriptor with its rkey replaced.
  auto with_rkey = [&](const std::string& rkey) {
    const std::string descriptor = dst_reg->packed_descriptor();
    ByteReader in(descriptor);
    uint32_t magic = 0, version = 0;
    uint64_t address = 0, length = 0;
    std::string_view old_rkey;
    EXPECT_TRUE(in.u32(&magic) && in.u32(&version) && in.u64(&address) && in.u64(&length) &&
                in.bytes(&old_rkey));
    return ByteWriter().u32(magic).u32(version).u64(address).u64(length).bytes(rkey).take();
  };
  std::string all_mds(9, '\xff');  // every memory domain named, none present
  all_mds[8] = 0;
  const std::string no_md(9, '\0');  // names no memory domain: UCX would emulate RMA
  for (const std::string& rkey : {random_bytes(8), all_mds, random_bytes(300), no_md}) {
    auto r = initiator->import_remote(peer, with_rkey(rkey));
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  }
  // The address with its worker part replaced.
  auto with_worker = [&](const std::string& wrapped, const std::string& worker) {
    ByteReader in(wrapped);
    uint32_t magic = 0, version = 0;
    std::string_view old_worker;
    EXPECT_TRUE(in.u32(&magic) && in.u32(&version) && in.bytes(&old_worker));
    return ByteWriter().u32(magic).u32(version).bytes(worker).take();
  };
  std::string garbage = random_bytes(200);
  const std::string target_address = target->address();
  {
    ByteReader in(target_address);
    uint32_t magic = 0, version = 0;
    std::string_view worker;
    ASSERT_TRUE(in.u32(&magic) && in.u32(&version) && in.bytes(&worker));
    garbage[0] = static_cast<char>(worker[0] ^ 0x5a);  // not this build's header
  }
  EXPECT_FALSE(initiator->connect(with_worker(target->address(), garbage)).ok());
  EXPECT_FALSE(initiator->connect(with_worker(target->address(), random_bytes(5))).ok());
  auto own = initiator->connect(initiator->address());
  ASSERT_FALSE(own.ok());
  EXPECT_NE(own.status().message().find("worker of this"), std::string::npos)
      << own.status().ToString();
  // Nothing was harmed: the real descriptor and peer still work.
  auto runs = SpreadRuns(4, 1 << 20, 4096);
  ASSERT_TRUE(PostAndWait(*initiator, Op::kPut, *src_reg, *remote, runs).ok());
  ExpectCopied(src, dst, runs, 0xEE);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxPair, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

// With an in-flight bound of one 1 MiB slice per peer, batches and the notifications behind them
// wait in the transport's queue.
class UcxPairSmallBound : public UcxPair {
 public:
  TransportOptions Options() const override {
    TransportOptions options = Tls(GetParam());
    options.settings.emplace_back("max_inflight_bytes", "1048576");
    return options;
  }
};

TEST_P(UcxPairSmallBound, NotificationsWaitForTheBatchesQueuedBeforeThem) {
  ExpectNotificationsAfterTheirData(*this, peer, 8);
}

TEST_P(UcxPairSmallBound, ABatchLargerThanTheBoundGoesOutAlone) {
  auto runs = SpreadRuns(2, 3 << 20, 4096);
  ASSERT_TRUE(PostAndWait(*initiator, Op::kPut, *src_reg, *remote, runs).ok());
  ExpectCopied(src, dst, runs, 0xEE);
}

TEST_P(UcxPairSmallBound, DisconnectCompletesTheQueuedBatchesToo) {
  ASSERT_TRUE(PostAndWait(*initiator, Op::kPut, *src_reg, *remote, {{0, 0, 4096}}).ok());
  std::vector<Waiter> waiters(8);
  for (uint64_t i = 0; i < waiters.size(); ++i) {
    std::vector<kv::Run> runs = {{i << 20, i << 20, 1 << 20}};
    ASSERT_TRUE(initiator
                    ->post({Op::kPut, src_reg.get(), remote.get(), runs, testing::In(10s)},
                           waiters[i].callback())
                    .ok());
  }
  initiator->disconnect(peer);
  // Batches still queued when the disconnect ran never reached UCX: they complete all the same.
  for (auto& w : waiters) {
    Status s = w.Wait();
    EXPECT_TRUE(s.ok() || s.code() == Code::kAborted) << s.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxPairSmallBound, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

// kvd's put path with write grants (Transport::guard_writes, issue 19): into a guarded
// registration a peer's put lands only inside a live grant of that peer; a put outside one, or
// after the grant was revoked, is refused unanswered and the sender's endpoint closed, so its
// later puts (granted ones included) fail too.
class UcxGrants : public ::testing::Test {
 public:
  void SetUp() override {
    const TransportOptions options{{{"UCX_TLS", "tcp"}, {"put_path", "am"}}};
    auto a = CreateTransport("ucx", options);
    auto b = CreateTransport("ucx", options);
    ASSERT_TRUE(a.ok() && b.ok());
    sender = std::move(*a);
    target = std::move(*b);
    ASSERT_TRUE(target->checks_write_grants());
    src.resize(64 << 10);
    Fill(src, 5);
    dst.assign(64 << 10, 0xEE);
    auto s = sender->register_memory(src.data(), src.size(), MemoryLocation::Host());
    auto d = target->register_memory(dst.data(), dst.size(), MemoryLocation::Host());
    ASSERT_TRUE(s.ok() && d.ok());
    src_reg = std::move(*s);
    dst_reg = std::move(*d);
    ASSERT_TRUE(target->guard_writes(*dst_reg).ok());
    // The sender comes through an endpoint of its own on the target (as kvd's peers do), so the
    // target knows which of its peers a put comes from.
    auto endpoint = target->open_endpoint();
    ASSERT_TRUE(endpoint.ok());
    auto to_target = sender->connect(endpoint->address);
    ASSERT_TRUE(to_target.ok()) << to_target.status().ToString();
    auto back = target->connect_endpoint(sender->address(), endpoint->id);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    sender_on_target = *back;
    auto r = sender->import_remote(*to_target, dst_reg->packed_descriptor());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    remote = std::move(*r);
  }
  void TearDown() override {
    remote.reset();
    src_reg.reset();
    dst_reg.reset();
    sender.reset();
    target.reset();
  }
  Status Put(uint64_t offset, uint64_t length, std::chrono::milliseconds deadline = 10s) {
    return PostAndWait(*sender, Op::kPut, *src_reg, *remote, {{offset, offset, length}}, deadline);
  }
  bool Landed(uint64_t offset, uint64_t length) const {
    return std::memcmp(src.data() + offset, dst.data() + offset, length) == 0;
  }
  bool Untouched(uint64_t offset, uint64_t length) const {
    for (uint64_t i = offset; i < offset + length; ++i) {
      if (dst[i] != 0xEE) return false;
    }
    return true;
  }

  std::unique_ptr<Transport> sender, target;
  std::vector<uint8_t> src, dst;
  std::unique_ptr<MemoryRegistration> src_reg, dst_reg;
  PeerId sender_on_target = 0;
  std::unique_ptr<RemoteMemory> remote;
};

TEST_F(UcxGrants, AGrantedPutLandsAndOneOutsideTheGrantClosesTheEndpoint) {
  const Transport::WriteRange granted[] = {{8192, 8192}, {32768, 4096}};
  ASSERT_TRUE(target->grant_writes(7, sender_on_target, *dst_reg, granted).ok());
  ASSERT_TRUE(Put(8192, 8192).ok());
  ASSERT_TRUE(Put(32768 + 1024, 2048).ok());
  EXPECT_TRUE(Landed(8192, 8192));
  EXPECT_TRUE(Landed(32768 + 1024, 2048));

  // Registered but not granted, and straddling the end of a grant: refused, never answered
  // (not kInvalidArgument), nothing written.
  Status outside = Put(0, 4096, 2s);
  EXPECT_FALSE(outside.ok());
  EXPECT_NE(outside.code(), Code::kInvalidArgument) << "answered: " << outside.ToString();
  EXPECT_TRUE(Untouched(0, 4096));
  // The endpoint is closed: a put inside the grant no longer lands either.
  std::memset(dst.data() + 8192, 0xEE, 8192);
  EXPECT_FALSE(Put(8192, 8192, 2s).ok());
  EXPECT_TRUE(Untouched(8192, 8192));
}

TEST_F(UcxGrants, APutStraddlingAGrantsEndIsRefused) {
  const Transport::WriteRange granted[] = {{8192, 8192}};
  ASSERT_TRUE(target->grant_writes(7, sender_on_target, *dst_reg, granted).ok());
  EXPECT_FALSE(Put(12288, 8192, 2s).ok());  // its last 4 KiB lie past the grant
  EXPECT_TRUE(Untouched(16384, 4096));
}

TEST_F(UcxGrants, APutAfterTheGrantWasRevokedIsRefused) {
  const Transport::WriteRange granted[] = {{0, 16384}};
  ASSERT_TRUE(target->grant_writes(9, sender_on_target, *dst_reg, granted).ok());
  ASSERT_TRUE(Put(0, 4096).ok());
  EXPECT_TRUE(Landed(0, 4096));
  target->revoke_writes(9);
  EXPECT_FALSE(Put(4096, 4096, 2s).ok());
  EXPECT_TRUE(Untouched(4096, 4096));
}

// A grant names its peer: another peer's puts into the same range are refused.
TEST_F(UcxGrants, AGrantToAnotherPeerDoesNotAdmitThisOne) {
  const Transport::WriteRange granted[] = {{0, 16384}};
  ASSERT_TRUE(target->grant_writes(3, sender_on_target + 1000, *dst_reg, granted).ok());
  EXPECT_FALSE(Put(0, 4096, 2s).ok());
  EXPECT_TRUE(Untouched(0, 4096));
}

// Batches of short runs go staged (gather, one put into a receive slot, scatter: the host
// chooser, staged_transport.h); the scatter checks the grants of the region too.
TEST_F(UcxGrants, StagedBatchesOfShortRunsAreCheckedToo) {
  const Transport::WriteRange granted[] = {{8192, 8192}};
  ASSERT_TRUE(target->grant_writes(5, sender_on_target, *dst_reg, granted).ok());
  std::vector<kv::Run> inside, outside;
  for (uint64_t i = 0; i < 8; ++i) {
    inside.push_back({8192 + i * 1024, 8192 + i * 1024, 512});
    outside.push_back({i * 1024, i * 1024, 512});
  }
  ASSERT_TRUE(PostAndWait(*sender, Op::kPut, *src_reg, *remote, inside).ok());
  for (const kv::Run& r : inside) EXPECT_TRUE(Landed(r.dst_offset, r.length));
  EXPECT_FALSE(PostAndWait(*sender, Op::kPut, *src_reg, *remote, outside, 2s).ok());
  EXPECT_TRUE(Untouched(0, 8192));
  target->revoke_writes(5);
  std::memset(dst.data() + 8192, 0xEE, 8192);
  EXPECT_FALSE(PostAndWait(*sender, Op::kPut, *src_reg, *remote, inside, 2s).ok());
  EXPECT_TRUE(Untouched(8192, 8192));
}

TEST_F(UcxGrants, GrantsOutsideTheRegistrationAreRefused) {
  const Transport::WriteRange past[] = {{60 << 10, 8192}};
  EXPECT_EQ(target->grant_writes(4, sender_on_target, *dst_reg, past).code(), Code::kOutOfRange);
}

TEST(UcxTransport, UnparsableInFlightBoundIsRejected) {
  for (const char* bad : {"0", "12abc", "", "-5", "99999999999999999999999"}) {
    auto t = CreateTransport("ucx", {{{"max_inflight_bytes", bad}}});
    EXPECT_EQ(t.status().code(), Code::kInvalidArgument) << "'" << bad << "'";
  }
}

TEST(UcxTransport, UnknownPutPathIsRejected) {
  auto t = CreateTransport("ucx", {{{"put_path", "emulated"}}});
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  for (const char* good : {"auto", "am", "rma"}) {
    auto ok = CreateTransport("ucx", {{{"put_path", good}}});
    EXPECT_TRUE(ok.ok()) << good << ": " << ok.status().ToString();
  }
}

// The backend's own keys never reach UCX (which would refuse them), whatever else is set.
TEST(UcxTransport, OwnSettingsAndUcxSettingsTogether) {
  auto t = CreateTransport("ucx", {{{"max_inflight_bytes", "4194304"},
                                    {"UCX_TLS", "tcp"},
                                    {"put_path", "am"},
                                    {"staging_slots", "2"}}});
  EXPECT_TRUE(t.ok()) << t.status().ToString();
}

TEST(UcxTransport, UnparsableSettingIsRejected) {
  auto t = CreateTransport("ucx", {{{"UCX_RNDV_THRESH", "banana"}}});
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kv::transport
