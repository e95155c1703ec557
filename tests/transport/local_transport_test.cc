// The factory and the `local` backend. Puts, gets, notification order, bounds and a closed peer:
// the conformance suite (conformance_suite.h).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <memory>
#include <thread>

#include "tests/support/test_support.h"
#include "transport/transport.h"

namespace kv::transport {
namespace {

using namespace std::chrono_literals;
using testing::Fill;
using testing::PostAndWait;

TEST(TransportFactory, ListsLocalAndRefusesUnknownBackends) {
  auto names = AvailableTransports();
  EXPECT_NE(std::find(names.begin(), names.end(), "local"), names.end());
  auto missing = CreateTransport("carrier-pigeon");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kUnsupported);
  EXPECT_NE(missing.status().message().find("local"), std::string::npos);
  auto automatic = CreateTransport("auto");
  ASSERT_TRUE(automatic.ok()) << automatic.status().ToString();
  EXPECT_EQ((*automatic)->name(), names.front());
}

// Every backend of the build describes itself: what it can do and the keys it takes, which
// CheckSettings holds callers' settings to.
TEST(TransportFactory, DescribesEveryBackendAndChecksSettings) {
  for (const std::string& name : AvailableTransports()) {
    auto info = DescribeTransport(name);
    ASSERT_TRUE(info.ok()) << name << ": " << info.status().ToString();
    EXPECT_EQ(info->name, name);
    for (const SettingInfo& s : info->settings) {
      EXPECT_NE(std::string(s.key), "") << name;
      EXPECT_NE(std::string(s.help), "") << name << " " << s.key;
      // A setting with its documented key passes the check (its value is the backend's to judge).
      EXPECT_TRUE(CheckSettings(name, {{{s.key, "1"}}}).ok()) << name << " " << s.key;
    }
    // GPU backends take the device kvd gives them; ucx its network devices.
    if (info->capabilities.device_copies) {
      EXPECT_TRUE(CheckSettings(name, {{{"device", "0"}}}).ok()) << name;
    }
    if (info->capabilities.ucx_config) {
      EXPECT_TRUE(CheckSettings(name, {{{"UCX_NET_DEVICES", "lo"}, {"TLS", "tcp"}}}).ok());
    } else {
      Status typo = CheckSettings(name, {{{"no_such_key", "1"}}});
      EXPECT_EQ(typo.code(), Code::kInvalidArgument) << name;
      EXPECT_NE(typo.message().find("no_such_key"), std::string::npos) << typo.message();
    }
    Status twice = CheckSettings(name, {{{"UCX_TLS", "tcp"}, {"UCX_TLS", "shm"}}});
    EXPECT_EQ(twice.code(), Code::kInvalidArgument) << name;
  }
  auto automatic = DescribeTransport("auto");
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->name, AvailableTransports().front());
  EXPECT_EQ(DescribeTransport("carrier-pigeon").status().code(), Code::kUnsupported);
  // kvd's short name for cuda_ipc, where this build has it; its settings are asked by either.
  auto ipc = DescribeTransport("ipc");
  auto cuda_ipc = DescribeTransport("cuda_ipc");
  EXPECT_EQ(ipc.ok(), cuda_ipc.ok());
  if (ipc.ok()) {
    EXPECT_EQ(ipc->name, "cuda_ipc");
    EXPECT_TRUE(ipc->takes("socket_dir"));
  }
  auto local = DescribeTransport("local");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local->takes("socket_dir"));
  EXPECT_FALSE(local->capabilities.device_copies);
  EXPECT_FALSE(local->capabilities.ucx_config);
  EXPECT_TRUE(local->settings.empty());
}

class LocalPair : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = CreateTransport("local");
    auto b = CreateTransport("local");
    ASSERT_TRUE(a.ok() && b.ok());
    initiator = std::move(*a);
    target = std::move(*b);
    src.resize(1 << 20);
    dst.assign(2 << 20, 0xEE);
    Fill(src, 7);
    auto s = initiator->register_memory(src.data(), src.size(), MemoryLocation::Host());
    auto d = target->register_memory(dst.data(), dst.size(), MemoryLocation::Host());
    ASSERT_TRUE(s.ok() && d.ok());
    src_reg = std::move(*s);
    dst_reg = std::move(*d);
    auto peer_or = initiator->connect(target->address());
    ASSERT_TRUE(peer_or.ok()) << peer_or.status().ToString();
    peer = *peer_or;
    auto remote_or = initiator->import_remote(peer, dst_reg->packed_descriptor());
    ASSERT_TRUE(remote_or.ok()) << remote_or.status().ToString();
    remote = std::move(*remote_or);
  }

  std::unique_ptr<Transport> initiator, target;
  std::vector<uint8_t> src, dst;
  std::unique_ptr<MemoryRegistration> src_reg, dst_reg;
  PeerId peer = 0;
  std::unique_ptr<RemoteMemory> remote;
};

// A remote imported by one transport names a peer and a region id of that transport only: posted
// on another transport it would reach another peer's region (it once wrote 4 KiB into 16 bytes).
TEST_F(LocalPair, RemoteImportedByAnotherTransportIsRefused) {
  auto third = CreateTransport("local");
  ASSERT_TRUE(third.ok());
  std::vector<uint8_t> small(16, 0xEE);
  auto small_reg = target->register_memory(small.data(), small.size(), MemoryLocation::Host());
  ASSERT_TRUE(small_reg.ok());
  auto third_peer = (*third)->connect(target->address());
  ASSERT_TRUE(third_peer.ok());
  auto third_remote = (*third)->import_remote(*third_peer, (*small_reg)->packed_descriptor());
  ASSERT_TRUE(third_remote.ok());
  // In range of the 16-byte remote, so only the importer check can refuse it.
  std::vector<kv::Run> runs = {{0, 0, 16}};
  Status s =
      initiator->post({Op::kPut, src_reg.get(), third_remote->get(), runs, Clock::now() + 5s},
                      [](Status) { ADD_FAILURE() << "a refused batch must not complete"; });
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_EQ(small, std::vector<uint8_t>(16, 0xEE));
  EXPECT_EQ(dst, std::vector<uint8_t>(dst.size(), 0xEE));
}

TEST_F(LocalPair, BatchStartedPastItsDeadlineTimesOut) {
  Status s = PostAndWait(*initiator, Op::kPut, *src_reg, *remote, {{0, 0, 64}}, -1ms);
  EXPECT_EQ(s.code(), Code::kTimeout);
}

TEST_F(LocalPair, DisconnectedPeerIsNotFound) {
  initiator->disconnect(peer);
  std::vector<kv::Run> runs = {{0, 0, 1}};
  Batch batch{Op::kPut, src_reg.get(), remote.get(), runs, testing::In(1s)};
  EXPECT_EQ(initiator->post(batch, [](Status) {}).code(), Code::kNotFound);
  EXPECT_EQ(initiator->notify(peer, "x").code(), Code::kNotFound);
}

TEST_F(LocalPair, DeadPeerFailsWithUnavailable) {
  dst_reg.reset();
  target.reset();
  Status s = PostAndWait(*initiator, Op::kPut, *src_reg, *remote, {{0, 0, 64}});
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_EQ(initiator->connect("local:" + std::to_string(getpid()) + ":999999").status().code(),
            Code::kUnavailable);
}

// A completion may hold the last reference to a registration of the initiator (kvd's engine
// region, released while its batch was in flight): the progress thread must drop it unlocked.
// It destroyed the finished task under the endpoint's lock, and ~LocalRegistration took that
// lock again: the progress thread deadlocked, and the next post with it (fuzz_daemon found it).
TEST_F(LocalPair, ACompletionHoldingTheLastRegistrationDoesNotDeadlock) {
  std::vector<uint8_t> own(4096, 1);
  auto made = initiator->register_memory(own.data(), own.size(), MemoryLocation::Host());
  ASSERT_TRUE(made.ok());
  std::shared_ptr<MemoryRegistration> last(std::move(*made));
  std::vector<kv::Run> runs = {{0, 0, 64}};
  Batch batch{Op::kPut, last.get(), remote.get(), runs, testing::In(5s)};
  auto first = std::make_shared<std::promise<Status>>();
  ASSERT_TRUE(initiator->post(batch, [first, last](Status s) { first->set_value(s); }).ok());
  last.reset();  // the completion's copy is the last one now
  auto landed = first->get_future();
  ASSERT_EQ(landed.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(landed.get().ok());
  // The progress thread still runs batches. Posted from another thread: with the bug, post()
  // blocks on the lock the deadlocked progress thread holds.
  auto second = std::make_shared<std::promise<Status>>();
  std::thread poster([&, second] {
    Batch next{Op::kPut, src_reg.get(), remote.get(), runs, testing::In(5s)};
    Status posted = initiator->post(next, [second](Status s) { second->set_value(s); });
    if (!posted.ok()) second->set_value(posted);
  });
  auto done = second->get_future();
  if (done.wait_for(10s) != std::future_status::ready) {
    ADD_FAILURE() << "the local transport's progress thread deadlocked";
    std::_Exit(1);  // the transport can neither run nor be destroyed: end the test binary here
  }
  poster.join();
  EXPECT_TRUE(done.get().ok());
}

// Two kvd processes given "local" must not find each other's numbers in their own process.
TEST_F(LocalPair, RefusesAPeerInAnotherProcess) {
  auto s = initiator->connect("local:" + std::to_string(getpid() + 1) + ":0").status();
  EXPECT_EQ(s.code(), Code::kIncompatible) << s.ToString();
  EXPECT_NE(s.message().find("another process"), std::string::npos) << s.ToString();
}

TEST_F(LocalPair, RefusesForeignDescriptorsAndDeviceMemory) {
  EXPECT_EQ(initiator->import_remote(peer, "garbage").status().code(), Code::kInvalidArgument);
  // A descriptor of the initiator's own memory does not belong to the target.
  EXPECT_EQ(initiator->import_remote(peer, src_reg->packed_descriptor()).status().code(),
            Code::kInvalidArgument);
  EXPECT_FALSE(initiator->supports(MemoryKind::kCuda));
  EXPECT_EQ(initiator->allocate_memory(4096, MemoryLocation::Host()).status().code(),
            Code::kUnsupported);
  EXPECT_EQ(initiator->register_memory(src.data(), 16, MemoryLocation::Cuda(0)).status().code(),
            Code::kUnsupported);
}

}  // namespace
}  // namespace kv::transport
