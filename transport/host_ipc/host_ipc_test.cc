// The host_ipc backend's own refusals (puts, gets, notifications, bounds and a killed peer: the
// conformance suite). A fake peer (a unix listener and an FdServer of the test's own, at the
// paths a real peer would use) serves forged descriptors: objects that are not sealed, shorter
// than claimed, or served by another process's fd server must not be mapped.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/fd_share.h"
#include "base/framed_socket.h"
#include "base/shared_memory.h"
#include "tests/support/test_support.h"
#include "transport/host_ipc/copier.h"
#include "transport/host_ipc/regions.h"
#include "transport/same_host_channel.h"
#include "transport/transport.h"

namespace kv::transport {
namespace {

using namespace std::chrono_literals;
using testing::PostAndWait;
using testing::Waiter;

std::unique_ptr<Transport> HostIpc() {
  auto t = CreateTransport("host_ipc");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

// A memfd of `bytes`, sealed with `seals` (0: none).
UniqueFd MemFd(uint64_t bytes, int seals) {
  UniqueFd fd(memfd_create("host-ipc-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(0, ftruncate(fd.get(), static_cast<off_t>(bytes)));
  if (seals != 0) {
    EXPECT_EQ(0, fcntl(fd.get(), F_ADD_SEALS, seals));
  }
  return fd;
}

// What a peer looks like from the importing side: a side channel to connect to and an fd server
// beside it, with descriptors forged for whatever the test serves.
class FakePeer {
 public:
  FakePeer() {
    path_ = (std::filesystem::temp_directory_path() / ("kvd-hipc-fake-" + std::to_string(getpid()) +
                                                       "-" + std::to_string(next_++) + ".sock"))
                .string();
    auto listener = Listener::Listen("unix:" + path_);
    EXPECT_TRUE(listener.ok()) << listener.status().ToString();
    if (listener.ok()) listener_ = std::move(*listener);
    auto server = FdServer::Start(path_ + ".fd");
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    if (server.ok()) server_ = std::move(*server);
  }
  std::string address() const { return HostId() + "|unix:" + path_; }
  // The connection the importer opened, once it came (bounded).
  Socket Accept() {
    const auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline) {
      auto s = listener_.Accept();
      if (s.ok() && s->valid()) return std::move(*s);
      WaitReadable(listener_.fd(), Clock::now() + 100ms);
    }
    return Socket();
  }
  // A descriptor of [offset, offset + length) of `fd`, served here (or naming `fd_path`).
  std::string Serve(UniqueFd fd, uint64_t offset, uint64_t length, std::string fd_path = "") {
    if (fd_path.empty()) fd_path = server_->path();
    host_ipc::WireDescriptor wire{};
    std::memcpy(wire.magic, host_ipc::kMagic, sizeof(host_ipc::kMagic));
    wire.fd_token = server_->Add(std::move(fd));
    std::memcpy(wire.fd_path, fd_path.data(), fd_path.size());
    wire.offset = offset;
    wire.length = length;
    const std::string host = HostId();
    std::memcpy(wire.host_id, host.data(), host.size());
    return std::string(reinterpret_cast<const char*>(&wire), sizeof(wire));
  }

 private:
  static inline std::atomic<int> next_{0};
  std::string path_;
  Listener listener_;
  std::unique_ptr<FdServer> server_;
};

TEST(HostIpc, RegistersOnlyHostMemoryThatLivesInASealedObjectLargeEnough) {
  auto t = HostIpc();
  ASSERT_TRUE(t);
  std::vector<uint8_t> heap(4096);
  auto plain = t->register_memory(heap.data(), heap.size(), MemoryLocation::Host());
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), Code::kUnsupported);
  EXPECT_NE(plain.status().message().find("fd"), std::string::npos) << plain.status().message();
  auto no_fd = t->register_shared_memory(heap.data(), heap.size(), MemoryLocation::Host(), {});
  EXPECT_EQ(no_fd.status().code(), Code::kUnsupported);

  UniqueFd unsealed = MemFd(8192, 0);
  auto open = t->register_shared_memory(heap.data(), heap.size(), MemoryLocation::Host(),
                                        {unsealed.get(), 0});
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), Code::kInvalidArgument);
  EXPECT_NE(open.status().message().find("sealed"), std::string::npos);

  UniqueFd small = MemFd(8192, SharedMemory::kRequiredSeals);
  auto short_object = t->register_shared_memory(heap.data(), heap.size(), MemoryLocation::Host(),
                                                {small.get(), 8192 - 100});
  EXPECT_EQ(short_object.status().code(), Code::kOutOfRange);
  auto fits = t->register_shared_memory(heap.data(), heap.size(), MemoryLocation::Host(),
                                        {small.get(), 4096});
  EXPECT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_FALSE(t->supports(MemoryKind::kCuda));
}

TEST(HostIpc, ImportRefusesUnsealedShortAndForeignObjects) {
  auto t = HostIpc();
  ASSERT_TRUE(t);
  FakePeer peer;
  auto id = t->connect(peer.address());
  ASSERT_TRUE(id.ok()) << id.status().ToString();

  // Not sealed: the peer could shrink it under our mapping (SIGBUS).
  auto unsealed = t->import_remote(*id, peer.Serve(MemFd(1 << 20, 0), 0, 1 << 20));
  ASSERT_FALSE(unsealed.ok());
  EXPECT_EQ(unsealed.status().code(), Code::kInvalidArgument);
  EXPECT_NE(unsealed.status().message().find("sealed"), std::string::npos);
  // Sealed against shrinking only: growing is refused too (SharedMemory's seals).
  auto half = t->import_remote(*id, peer.Serve(MemFd(1 << 20, F_SEAL_GROW), 0, 1 << 20));
  EXPECT_EQ(half.status().code(), Code::kInvalidArgument);
  // Shorter than the descriptor claims.
  auto short_object = t->import_remote(
      *id, peer.Serve(MemFd(1 << 20, SharedMemory::kRequiredSeals), 4096, 1 << 20));
  ASSERT_FALSE(short_object.ok());
  EXPECT_EQ(short_object.status().code(), Code::kOutOfRange);
  // Another fd server than the peer's: not even asked.
  auto foreign = t->import_remote(*id, peer.Serve(MemFd(4096, SharedMemory::kRequiredSeals), 0,
                                                  4096, "/tmp/someone-else.sock.fd"));
  EXPECT_EQ(foreign.status().code(), Code::kInvalidArgument);
  // Truncated, and of a token nobody serves.
  const std::string good = peer.Serve(MemFd(4096, SharedMemory::kRequiredSeals), 0, 4096);
  EXPECT_EQ(t->import_remote(*id, good.substr(1)).status().code(), Code::kInvalidArgument);
  host_ipc::WireDescriptor wire;
  std::memcpy(&wire, good.data(), sizeof(wire));
  wire.fd_token ^= 1;
  auto unknown = t->import_remote(*id, std::string(reinterpret_cast<char*>(&wire), sizeof(wire)));
  EXPECT_EQ(unknown.status().code(), Code::kNotFound) << unknown.status().ToString();
  // A sealed object of the right size maps.
  auto mapped = t->import_remote(*id, good);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ((*mapped)->length(), 4096u);
}

// Runs are checked against the registered length, not the object's: bytes of the object past the
// registration stay out of reach. A batch whose deadline passed before its turn copies nothing.
TEST(HostIpc, RunsPastTheRegionAndLateBatchesCopyNothing) {
  auto a = HostIpc(), b = HostIpc();
  ASSERT_TRUE(a && b);
  auto src = SharedMemory::Create(8192, "host-ipc-src");
  auto dst = SharedMemory::Create(16384, "host-ipc-dst");
  ASSERT_TRUE(src.ok() && dst.ok());
  std::memset(src->data(), 0x5a, src->size());
  auto local = a->register_shared_memory(src->data(), 8192, MemoryLocation::Host(), {src->fd(), 0});
  // b registers the first 8 KiB of its 16 KiB object only.
  auto exported =
      b->register_shared_memory(dst->data(), 8192, MemoryLocation::Host(), {dst->fd(), 0});
  ASSERT_TRUE(local.ok() && exported.ok());
  auto peer = a->connect(b->address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto remote = a->import_remote(*peer, (*exported)->packed_descriptor());
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  EXPECT_EQ((*remote)->length(), 8192u);

  Status past = PostAndWait(*a, Op::kPut, **local, **remote, {{0, 8192 - 10, 11}});
  EXPECT_EQ(past.code(), Code::kOutOfRange);
  Status beyond = PostAndWait(*a, Op::kPut, **local, **remote, {{0, 8192, 4096}});
  EXPECT_EQ(beyond.code(), Code::kOutOfRange);

  Waiter late;
  std::vector<kv::Run> runs = {{0, 0, 4096}};
  ASSERT_TRUE(
      a->post({Op::kPut, local->get(), remote->get(), runs, Clock::now() - 1s}, late.callback())
          .ok());
  EXPECT_EQ(late.Wait().code(), Code::kTimeout);
  const auto* landed = static_cast<const uint8_t*>(dst->data());
  for (size_t i = 0; i < dst->size(); ++i) ASSERT_EQ(landed[i], 0) << i;

  ASSERT_TRUE(PostAndWait(*a, Op::kPut, **local, **remote, {{0, 4096, 4096}}).ok());
  EXPECT_EQ(landed[4096], 0x5a);
  EXPECT_EQ(landed[8191], 0x5a);
  EXPECT_EQ(landed[8192], 0);  // past the registration: never written
}

// A peer whose side channel closes is dead: every batch posted to it completes (OK when its copy
// ran, kUnavailable when it was still queued), within a bound, and later posts are refused.
TEST(HostIpc, APeerWhoseSocketClosesFailsItsBatchesAndLaterPosts) {
  auto t = HostIpc();
  ASSERT_TRUE(t);
  auto src = SharedMemory::Create(8 << 20, "host-ipc-src");
  ASSERT_TRUE(src.ok());
  auto local =
      t->register_shared_memory(src->data(), src->size(), MemoryLocation::Host(), {src->fd(), 0});
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  FakePeer peer;
  auto id = t->connect(peer.address());
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  Socket channel = peer.Accept();
  ASSERT_TRUE(channel.valid());
  auto remote =
      t->import_remote(*id, peer.Serve(MemFd(8 << 20, SharedMemory::kRequiredSeals), 0, 8 << 20));
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();

  constexpr int kBatches = 64;
  std::vector<Waiter> waiters(kBatches);
  std::vector<kv::Run> runs = {{0, 0, 8 << 20}};
  for (Waiter& w : waiters) {
    ASSERT_TRUE(
        t->post({Op::kPut, local->get(), remote->get(), runs, Clock::now() + 60s}, w.callback())
            .ok());
  }
  channel = Socket();  // the peer's process is gone
  for (Waiter& w : waiters) {
    Status s = w.Wait(30s);
    EXPECT_TRUE(s.ok() || s.code() == Code::kUnavailable) << s.ToString();
  }
  // The death is noticed (bounded), and from then on posts are refused.
  Status later = Status::Ok();
  for (auto deadline = Clock::now() + 10s; Clock::now() < deadline;) {
    Waiter w;
    later =
        t->post({Op::kPut, local->get(), remote->get(), runs, Clock::now() + 10s}, w.callback());
    if (!later.ok()) break;
    (void)w.Wait();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(later.code(), Code::kUnavailable) << later.ToString();
  EXPECT_EQ(t->notify(*id, "after").code(), Code::kUnavailable);
  remote->reset();
  local->reset();
}

// copy_threads > 1: a batch split by bytes over the helpers lands exactly as one thread lands it,
// runs cut where a share fills included, group rows with negative strides too.
TEST(HostIpcCopier, SplitBatchesLandExactlyTheRuns) {
  constexpr uint64_t kBytes = 6 << 20;
  std::vector<char> src(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) src[i] = static_cast<char>(testing::PatternByte(i, 7));
  // Odd lengths, so that shares end inside runs; destinations spread, in reverse order.
  std::vector<kv::Run> runs;
  uint64_t at = 0;
  for (uint64_t length : {3u << 20, 1u, 777'777u, 4096u, 65'537u}) {
    runs.push_back({at, kBytes - at - length, length});
    at += length;
  }
  const RunGroup group{at, 0, 1000, 300, 1000, 2000};  // rows into the gaps at the front
  const RunGroup backwards{at + 300'000, 1'500'000, 512, 200, 512, -1024};
  std::vector<char> expected(kBytes, 0);
  host_ipc::Copier(1).Copy(src.data(), expected.data(), runs, {{group, backwards}});
  for (int threads : {2, 3, 5}) {
    host_ipc::Copier copier(threads);
    for (int round = 0; round < 3; ++round) {  // the helpers serve batch after batch
      std::vector<char> dst(kBytes, 0);
      copier.Copy(src.data(), dst.data(), runs, {{group, backwards}});
      EXPECT_TRUE(dst == expected) << threads << " threads, round " << round;
    }
  }
  // The reference itself moved what the runs name.
  EXPECT_EQ(std::memcmp(expected.data() + runs[0].dst_offset, src.data(), runs[0].length), 0);
  EXPECT_EQ(expected[1], src[at + 1]);
}

}  // namespace
}  // namespace kv::transport
