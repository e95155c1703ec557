// The protocol the multi-process transport tests share with their target child: the target
// announces its transport address and one region's descriptor over the channel; notifications
// "check COUNT LENGTH GAP" ask it whether the runs of SpreadRuns(COUNT, LENGTH, GAP) hold the
// initiator's pattern. Every receive is bounded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tests/transport/test_support.h"
#include "transport/child_process.h"
#include "transport/transport.h"

namespace kv::transport::testing {

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

}  // namespace kv::transport::testing
