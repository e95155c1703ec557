// The protocol the multi-process transport tests share with their target child: the target
// announces its transport address and one region's descriptor over the channel; notifications
// "check COUNT LENGTH GAP" ask it whether the runs of SpreadRuns(COUNT, LENGTH, GAP) hold the
// initiator's pattern. Every receive is bounded.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/test_support.h"
#include "tools/testing/child_process.h"
#include "transport/transport.h"

namespace kv::transport::testing {

using harness::Channel;
using harness::ChildProcess;

// The initiator's view of one target process.
struct TargetConnection {
  std::string address;     // the target transport's address
  std::string descriptor;  // its region's packed descriptor
  PeerId peer = 0;
  std::unique_ptr<RemoteMemory> remote;
};

inline Result<TargetConnection> ConnectToTarget(Transport& transport, ChildProcess& child) {
  TargetConnection c;
  KV_ASSIGN_OR_RETURN(c.address, child.channel().Receive(Clock::now() + std::chrono::seconds(30)));
  KV_ASSIGN_OR_RETURN(c.descriptor,
                      child.channel().Receive(Clock::now() + std::chrono::seconds(30)));
  KV_ASSIGN_OR_RETURN(c.peer, transport.connect(c.address));
  KV_ASSIGN_OR_RETURN(c.remote, transport.import_remote(c.peer, c.descriptor));
  return c;
}

inline std::string CheckMessage(uint64_t count, uint64_t length, uint64_t gap) {
  return "check " + std::to_string(count) + " " + std::to_string(length) + " " +
         std::to_string(gap);
}

// Target side: whether `memory` holds PatternByte(src offset, seed) at every destination byte
// of SpreadRuns(count, length, gap).
inline bool SpreadRunsArrived(const std::vector<uint8_t>& memory, uint64_t count, uint64_t length,
                              uint64_t gap, uint32_t seed) {
  for (const kv::Run& r : SpreadRuns(count, length, gap)) {
    if (r.dst_offset + r.length > memory.size()) return false;
    for (uint64_t i = 0; i < r.length; ++i) {
      if (memory[r.dst_offset + i] != PatternByte(r.src_offset + i, seed)) return false;
    }
  }
  return true;
}

// A target child's body: creates a "ucx" transport with `options`, registers `bytes` (the pattern
// PatternByte(i, seed) when `filled`, else `untouched` bytes), sends its address and descriptor,
// and answers each notification: "check COUNT LENGTH GAP" with "ok" or "bad" after comparing its
// memory with what the initiator put there, "untouched" with "ok" when no byte changed, anything
// else with "note:" and the message. Exits 0 on "quit" (120 s at most).
inline int RunTarget(Channel& channel, const TransportOptions& options, uint64_t bytes,
                     uint32_t seed, bool filled, uint8_t untouched) {
  auto transport = CreateTransport("ucx", options);
  if (!transport.ok()) return 2;
  std::vector<uint8_t> memory(bytes, untouched);
  if (filled) Fill(memory, seed);
  auto registration =
      (*transport)->register_memory(memory.data(), memory.size(), MemoryLocation::Host());
  if (!registration.ok()) return 3;
  (*transport)->set_notification_handler([&](std::string_view message) {
    std::istringstream in{std::string(message)};
    std::string verb;
    uint64_t count = 0, length = 0, gap = 0;
    in >> verb >> count >> length >> gap;
    bool good = true;
    if (verb == "check") {
      good = SpreadRunsArrived(memory, count, length, gap, seed);
    } else if (verb == "untouched") {
      for (uint8_t b : memory) good = good && b == untouched;
    } else {
      (void)channel.Send("note:" + std::string(message));
      return;
    }
    (void)channel.Send(good ? "ok" : "bad");
  });
  if (!channel.Send((*transport)->address()).ok()) return 4;
  if (!channel.Send((*registration)->packed_descriptor()).ok()) return 4;
  auto quit = channel.Receive(Clock::now() + std::chrono::seconds(120));
  return quit.ok() && *quit == "quit" ? 0 : 5;
}

// RunTarget in a child process; null (and a test failure) when it cannot start.
inline std::unique_ptr<ChildProcess> StartTarget(const TransportOptions& options, uint64_t bytes,
                                                 uint32_t seed, bool filled = false,
                                                 uint8_t untouched = 0xEE) {
  auto child = ChildProcess::Start([=](Channel& channel) {
    return RunTarget(channel, options, bytes, seed, filled, untouched);
  });
  EXPECT_TRUE(child.ok()) << child.status().ToString();
  return child.ok() ? std::move(*child) : nullptr;
}

}  // namespace kv::transport::testing
