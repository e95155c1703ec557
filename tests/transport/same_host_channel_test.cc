// SameHostChannel, the side channel cuda_ipc and host_ipc share: its address, notifications from
// one channel to another, a peer whose channel closes turning dead (its work failing kUnavailable)
// and a disconnected one (kAborted), the addresses and descriptors it refuses, and the sockets a
// killed process left.
#include "transport/same_host_channel.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tools/testing/child_process.h"

namespace kv::transport {
namespace {

using namespace std::chrono_literals;

// A channel with a gone hook that records what it was told and fails one queued batch.
struct Side {
  explicit Side(std::string tag = "test", const std::string& dir = "/tmp") {
    auto opened = SameHostChannel::Open(
        "test", dir, tag, &mu, [this](PeerId peer, const Status& why, std::vector<Completion>* f) {
          gone.push_back({peer, why.code()});
          f->push_back([this](Status s) { failed.push_back(s.code()); });
        });
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    if (opened.ok()) channel = std::move(*opened);
  }
  std::mutex mu;
  std::vector<std::pair<PeerId, Code>> gone;  // guarded by mu (the hook runs under it)
  std::vector<Code> failed;                   // the completions the channel called
  std::unique_ptr<SameHostChannel> channel;
};

// Polls `side` until `done` or 10 s passed (a failure then, never a hang).
template <typename Done>
bool PollUntil(Side& side, Done done) {
  const auto deadline = Clock::now() + 10s;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    side.channel->Poll(10ms);
  }
  return true;
}

TEST(SameHostChannel, CarriesANoteToThePeerAtItsAddress) {
  Side a, b;
  ASSERT_TRUE(a.channel && b.channel);
  const std::string address = b.channel->address();
  EXPECT_EQ(address.rfind(HostId() + "|unix:/tmp/kvd-test-", 0), 0u) << address;
  const std::string socket = address.substr(address.find("unix:") + 5);
  EXPECT_EQ(b.channel->fd_server()->path(), socket + ".fd");

  std::vector<std::string> got;  // b's poll thread is this one
  b.channel->SetNotificationHandler([&](std::string_view note) { got.emplace_back(note); });
  auto peer = a.channel->Connect(address, Clock::now() + 5s);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  EXPECT_EQ(*a.channel->FdPathOf(*peer), socket + ".fd");
  a.channel->SendNote(*peer, "layer 3", Clock::now() + 5s);
  a.channel->SendNote(*peer, "layer 4", Clock::now() + 5s);
  ASSERT_TRUE(PollUntil(b, [&] { return got.size() == 2; }));
  EXPECT_EQ(got, (std::vector<std::string>{"layer 3", "layer 4"}));
  EXPECT_TRUE(a.gone.empty());
}

TEST(SameHostChannel, APeerWhoseChannelClosesIsDeadUntilDisconnected) {
  Side a;
  auto b = std::make_unique<Side>();
  auto peer = a.channel->Connect(b->channel->address(), Clock::now() + 5s);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  b.reset();  // its process is gone
  ASSERT_TRUE(PollUntil(a, [&] {
    std::lock_guard lock(a.mu);
    return !a.gone.empty();
  }));
  {
    std::lock_guard lock(a.mu);
    EXPECT_EQ(a.gone, (std::vector<std::pair<PeerId, Code>>{{*peer, Code::kUnavailable}}));
    EXPECT_EQ(a.channel->CheckPeerLocked(*peer).code(), Code::kUnavailable);
    EXPECT_EQ(a.channel->GoneLocked(*peer).code(), Code::kUnavailable);
  }
  EXPECT_EQ(a.failed, std::vector<Code>{Code::kUnavailable});
  a.channel->SendNote(*peer, "late", Clock::now() + 1s);  // to a dead peer: nothing, no hook
  a.channel->Disconnect(*peer);
  EXPECT_EQ(a.channel->FdPathOf(*peer).status().code(), Code::kNotFound);
  std::lock_guard lock(a.mu);
  EXPECT_EQ(a.gone.size(), 2u);
  EXPECT_EQ(a.gone.back().second, Code::kAborted);
  EXPECT_EQ(a.failed.back(), Code::kAborted);
  EXPECT_EQ(a.channel->CheckPeerLocked(*peer).code(), Code::kNotFound);
  EXPECT_EQ(a.channel->GoneLocked(*peer).code(), Code::kAborted);
}

TEST(SameHostChannel, RefusesAnotherHostAMalformedAddressAndALongSocketDir) {
  Side a;
  EXPECT_EQ(a.channel->Connect("elsewhere|unix:/tmp/x.sock", Clock::now() + 1s).status().code(),
            Code::kIncompatible);
  EXPECT_EQ(a.channel->Connect("unix:/tmp/x.sock", Clock::now() + 1s).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(a.channel->Connect(HostId() + "|tcp:127.0.0.1:1", Clock::now() + 1s).status().code(),
            Code::kInvalidArgument);
  std::mutex mu;
  auto long_dir = SameHostChannel::Open("test", "/tmp/" + std::string(100, 'd'), "t", &mu,
                                        [](PeerId, const Status&, std::vector<Completion>*) {});
  EXPECT_EQ(long_dir.status().code(), Code::kInvalidArgument);
}

struct TestWire {
  char magic[8];
  char fd_path[kFdPathBytes];
  uint64_t value;
  char host_id[kHostIdBytes];
};
constexpr char kTestMagic[8] = "kvdtst1";

TEST(SameHostChannel, UnpacksOnlyItsOwnDescriptorsOfThisHost) {
  Side a;
  TestWire wire{};
  wire.value = 42;
  const std::string packed = a.channel->Pack(wire, kTestMagic);
  auto back = a.channel->Unpack<TestWire>(packed, kTestMagic);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->value, 42u);
  EXPECT_EQ(std::string(back->host_id), HostId());

  EXPECT_EQ(a.channel->Unpack<TestWire>(packed + "x", kTestMagic).status().code(),
            Code::kInvalidArgument);
  constexpr char kOther[8] = "kvdtst2";
  EXPECT_EQ(a.channel->Unpack<TestWire>(packed, kOther).status().code(), Code::kInvalidArgument);
  TestWire foreign;
  std::memcpy(&foreign, packed.data(), sizeof(foreign));
  foreign.host_id[0] ^= 1;
  const std::string forged(reinterpret_cast<const char*>(&foreign), sizeof(foreign));
  EXPECT_EQ(a.channel->Unpack<TestWire>(forged, kTestMagic).status().code(), Code::kIncompatible);
}

TEST(SameHostChannel, TakeJobsOfTakesOnlyThatPeersJobsAndOnlyBatchesFail) {
  struct Job {
    PeerId peer;
    bool is_note;
    Completion done;
  };
  int called = 0;
  auto count = [&](Status) { ++called; };
  std::deque<Job> queue;
  queue.push_back({1, false, count});
  queue.push_back({2, false, count});
  queue.push_back({1, true, nullptr});
  queue.push_back({1, false, count});
  std::vector<Completion> failed;
  TakeJobsOf(&queue, 1, &failed);
  ASSERT_EQ(queue.size(), 1u);
  EXPECT_EQ(queue.front().peer, 2u);
  ASSERT_EQ(failed.size(), 2u);
  for (Completion& done : failed) done(Status::Ok());
  EXPECT_EQ(called, 2);
}

// A process killed with its channel open leaves the channel's pair of sockets behind; the next
// channel opened in that directory removes them, and never a live channel's.
TEST(SameHostChannel, RemovesTheSocketsOfAKilledProcessAndNoLiveOnes) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvd-left-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto child = harness::ChildProcess::Start([&](harness::Channel& parent) {
    Side killed("left", dir.string());
    if (!killed.channel || !parent.Send(killed.channel->address()).ok()) return 1;
    (void)parent.Receive(Clock::now() + 60s);  // until killed
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  auto address = (*child)->channel().Receive(Clock::now() + 10s);
  ASSERT_TRUE(address.ok()) << address.status().ToString();
  const std::filesystem::path left = address->substr(address->find("unix:") + 5);
  (*child)->Kill();
  ASSERT_TRUE(std::filesystem::exists(left));
  ASSERT_TRUE(std::filesystem::exists(left.string() + ".fd"));

  Side live("left", dir.string());
  ASSERT_TRUE(live.channel);
  EXPECT_FALSE(std::filesystem::exists(left));
  EXPECT_FALSE(std::filesystem::exists(left.string() + ".fd"));
  const std::string live_path = live.channel->fd_server()->path();
  {
    Side another("left", dir.string());
    ASSERT_TRUE(another.channel);
    EXPECT_TRUE(std::filesystem::exists(live_path)) << "a live channel's socket was removed";
  }
  live.channel.reset();
  std::error_code ignored;
  EXPECT_TRUE(std::filesystem::is_empty(dir, ignored)) << "a closed channel left its sockets";
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace kv::transport
