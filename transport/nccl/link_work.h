// The work items of one nccl Link (link_impl.h): what its threads queue for each other.
// Internal to the backend; not thread-safe by themselves (the link guards them with its mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/cuda_util.h"
#include "transport/nccl/wire.h"
#include "transport/transport.h"

namespace kv::transport::nccl {

struct SendJob {
  enum class Kind { kData, kFrame, kGet } kind = Kind::kFrame;
  std::string frame;  // kFrame: sent as is
  // kGet: the request, its ranges and rows still to name (SplitGet, on the sender thread, from
  // `runs`, `groups` and `blocks`), and the PendingGet it fills in.
  GetRequestMsg request;
  std::vector<Run> runs;
  DataMsg data;               // kData: the announcement (ranges in the receiver's view)
  std::vector<Range> gather;  // kData: the same bytes in our region, same order
  // kData of a put, and kGet: its run groups and blocks of them, split by the sender thread, off
  // the thread that posts (SplitGroups and SplitBlocks into data.strided and `rows`; SplitGet
  // into the request and its PendingGet).
  std::vector<RunGroup> groups;
  std::vector<GroupBlocks> blocks;
  std::vector<Strided> rows;  // kData: data.strided's rows in our region, same order
  const char* local_base = nullptr;
  bool is_put = false;  // kData of a put (its completion waits in `puts`), not a get's reply
  Clock::time_point deadline;
};

// `done` split into `parts` completions: it runs once every part has, with the first error among
// them (OK if none). The parts may run on any threads.
inline std::vector<Completion> SplitCompletion(Completion done, size_t parts) {
  struct Joined {
    std::mutex mu;
    size_t left;
    Status first;
    Completion done;
  };
  auto joined = std::make_shared<Joined>();
  joined->left = parts;
  joined->done = std::move(done);
  std::vector<Completion> out;
  out.reserve(parts);
  for (size_t i = 0; i < parts; ++i) {
    out.push_back([joined](Status status) {
      {
        std::lock_guard lock(joined->mu);
        if (joined->first.ok() && !status.ok()) joined->first = std::move(status);
        if (--joined->left > 0) return;
      }
      joined->done(std::move(joined->first));
    });
  }
  return out;
}

struct PendingPut {
  Completion done;
  Clock::time_point deadline;
  bool sent = false;  // announced to the peer: a loss past the deadline then resets the link
};

struct PendingGet {
  char* local_base = nullptr;
  // Where the bytes go, in order, in chunks of chunk_bytes: filled in when the request is sent.
  std::vector<Range> ranges;
  std::vector<Strided> rows;
  uint64_t chunk_bytes = 0;
  bool sent = false;  // asked of the peer: a loss past the deadline then resets the link
  Completion done;
  Clock::time_point deadline;
};

struct PendingRecv {
  uint64_t seq = 0;
  uint64_t reply_to = 0;
  gpu::CudaEvent landed;
};

// What the reader hands the receive worker, in arrival order.
struct Inbound {
  bool is_comm_init = false;
  CommInitMsg comm_init;
  DataMsg data;
};

}  // namespace kv::transport::nccl
