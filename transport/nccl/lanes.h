// The communicators ("lanes") that carry one direction of a link. Chunk k of a batch travels on
// lane k % count(), each lane with a stream of its own, so the NCCL kernel of one chunk runs
// while the next one starts: back-to-back operations on a single communicator serialise, with a
// gap between two kernels that costs about 13 µs per 32 MiB chunk on two H200s.
//
// The communicators are non-blocking (every wait has a deadline and an abort frees a thread
// stuck on a dead peer), so operations are enqueued by a thread NCCL starts for each launch after
// the call returns: about 50 µs of host time per launch, whatever it holds. So operations go in
// groups (Post): one ncclGroupStart/End, one launch, for every operation of the group, on any
// lanes. A lane holds at most one such launch in flight, with the events to record on its stream
// once it is enqueued; Settle() waits for that (bounded, cancellable) and records the events.
// A lane is settled before anything else is put on its stream (a wait for an event included),
// so nothing of a later operation is ever ordered in front of an earlier one that NCCL's thread
// has not enqueued yet.
//
// Thread-safety: one owner thread calls everything but Abort(), which any thread may call; it
// waits for the owner to leave NCCL (the owner's waits watch `cancelled`, which the aborting
// thread sets first).
#pragma once

#include <nccl.h>

#include <atomic>
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

  // Adds a lane: joins the two-rank communicator `unique_id` as `rank` (bounded by `deadline`).
  // kInvalidArgument past kMaxLanes.
  Status Join(std::string_view unique_id, int rank, SteadyTime deadline);

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
    NcclComm comm;
    gpu::CudaStream stream;
    bool in_flight = false;
    std::vector<const gpu::CudaEvent*> then;  // to record once the launch is enqueued
  };
  Status SettleLocked(Lane& lane, SteadyTime deadline);

  const int device_;
  const std::atomic<bool>& cancelled_;
  std::mutex mu_;  // held by the owner inside NCCL, and by Abort
  bool aborted_ = false;
  std::vector<std::unique_ptr<Lane>> lanes_;  // grows only in Join, under mu_
};

}  // namespace kv::transport::nccl
