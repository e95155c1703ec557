// The communicators ("lanes") that carry one direction of a link. Chunk k of a batch travels on
// lane k % count(), each lane with a stream of its own, so the NCCL kernel of one chunk runs
// while the next one starts: back-to-back operations on a single communicator serialise, with a
// gap between two kernels that costs about 13 µs per 32 MiB chunk on two H200s.
//
// A lane's communicator is non-blocking, so creating and connecting it has a deadline and an
// abort frees a thread stuck on a dead peer. Operations go in groups (Post): one
// ncclGroupStart/End, one launch, for every operation of the group, on any lanes. A lane
// launches in one of two ways, which its two ends agree on (the sender says, kCommInit):
//
//  - On the non-blocking communicator (the default): NCCL enqueues each launch on a thread it
//    starts for it after the call returns (about 50 µs of host time, more when cores sleep). A
//    lane holds at most one such launch in flight, with the events to record on its stream once
//    it is enqueued; Settle() waits for that (bounded, cancellable) and records the events. A
//    lane is settled before anything else is put on its stream, so nothing of a later operation
//    is ordered in front of an earlier one that NCCL's thread has not enqueued yet.
//  - blocking_launch=1: Join connects the lane with a one-byte operation on the non-blocking
//    communicator, then splits a blocking one from it that shares its connections
//    (NcclComm::SplitBlocking; NCCL_COMM_SPLIT_SHARE_RESOURCES in the environment would override
//    that, so kvd's and kvbench's main() remove it), and Post launches on the owner's thread.
//    Blocking is safe there because no launch waits for the peer any more: the lane is
//    connected, and a lane keeps at most kLaunchesAhead launches unfinished on the device (a
//    bounded, cancellable wait before the next). So NCCL's work FIFO (1 MiB; a launch of
//    kMaxGroupOps takes under 4 KiB) cannot fill, and the host stays a bounded way ahead of
//    kernels spinning on a dead peer (these launches and the gathers that feed them), not the
//    whole queue of batches (the dead-peer conformance test kills the target with a gigabyte
//    queued).
//
// Thread-safety: one owner thread calls everything but Abort(), which any thread may call; it
// waits for the owner to leave NCCL (the owner's waits watch `cancelled`, which the aborting
// thread sets first).
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gpu/cuda_util.h"
#include "transport/nccl/nccl_comm.h"

namespace kv::transport::nccl {

inline constexpr int kMaxLanes = 4;

class Lanes {
 public:
  // `cancelled`: set (before Abort) when the owner must give up; every wait returns then.
  Lanes(int device, const std::atomic<bool>& cancelled);
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  // Adds a lane: joins the two-rank communicator `unique_id` as `rank` (bounded by `deadline`),
  // and with `blocking_launch` connects it and splits the blocking one (see above); both ranks
  // must pass the same. kInvalidArgument past kMaxLanes.
  Status Join(std::string_view unique_id, int rank, bool blocking_launch, SteadyTime deadline);

  size_t count() const { return lanes_.size(); }
  cudaStream_t stream(size_t lane) const { return lanes_[lane]->stream.get(); }

  // One ncclSend to (send) or ncclRecv from the other rank on `lane`'s stream. `wait` (may be
  // null) is waited for on that stream first; `then` (may be null) is recorded on it behind the
  // operation once the launch is settled. Both must outlive the next Settle of the lane.
  struct Op {
    size_t lane = 0;
    bool send = true;
    void* data = nullptr;
    uint64_t bytes = 0;
    const gpu::CudaEvent* wait = nullptr;
    const gpu::CudaEvent* then = nullptr;
  };
  static constexpr size_t kMaxGroupOps = 64;
  static constexpr size_t kLaunchesAhead = 8;  // per lane, with blocking_launch

  // Launches `ops` (1..kMaxGroupOps, in order per lane) as one NCCL group, after settling every
  // lane they name. On an NCCL error every communicator of the group is marked failed.
  Status Post(std::span<const Op> ops, SteadyTime deadline);

  // Waits until the lane's launch in flight is enqueued and records its events.
  Status Settle(size_t lane, SteadyTime deadline);

  // Aborts every communicator (their kernels stop); later calls fail with kAborted. The aborts run
  // at once, each on a thread of its own: ncclCommAbort raises its communicator's abort flag and
  // then waits for the device, so aborting one lane while another still spins on the dead peer
  // would wait forever.
  void Abort();

 private:
  struct Lane {
    NcclComm comm;      // non-blocking: created first, aborted last
    NcclComm blocking;  // split from `comm` when blocking_launch; destroyed before it
    bool blocking_launch = false;
    gpu::CudaStream stream;
    bool in_flight = false;                   // a launch on `comm` not yet known enqueued
    std::vector<const gpu::CudaEvent*> then;  // to record once the launch is enqueued
    // blocking_launch: a ring of events, each recorded behind a launch; the next one to record
    // marks the launch kLaunchesAhead back (never recorded yet: it reads as finished).
    std::vector<gpu::CudaEvent> launched;
    size_t next_launched = 0;
    NcclComm& launcher() { return blocking_launch ? blocking : comm; }
  };
  Status Connect(Lane& lane, int rank, SteadyTime deadline);
  Status SettleLocked(Lane& lane, SteadyTime deadline);
  // blocking_launch: waits (bounded, cancellable) until at most kLaunchesAhead - 1 of the
  // lane's launches are unfinished on the device. It yields for kRoomSpin, then sleeps
  // kRoomNap between looks: a lane that far ahead has milliseconds of queued work (streaming
  // layers wait there for the engine's forward pass), so the naps cost nothing measurable
  // while the thread no longer holds a core for the length of a prefill.
  Status WaitForRoom(Lane& lane, SteadyTime deadline);
  static constexpr auto kRoomSpin = std::chrono::microseconds(50);
  static constexpr auto kRoomNap = std::chrono::microseconds(50);

  const int device_;
  const std::atomic<bool>& cancelled_;
  std::mutex mu_;  // held by the owner inside NCCL, and by Abort
  bool aborted_ = false;
  std::vector<std::unique_ptr<Lane>> lanes_;  // grows only in Join, under mu_
  gpu::DeviceBuffer scratch_;                 // the connecting operation's byte
};

}  // namespace kv::transport::nccl
