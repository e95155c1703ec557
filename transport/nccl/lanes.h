// The communicators ("lanes") that carry one direction of a link. Chunk k of a batch travels on
// lane k % count(), each lane with a stream of its own, so the NCCL kernel of one chunk runs
// while the next one starts: back-to-back operations on a single communicator serialise, with a
// gap between two kernels that costs about 13 µs per 32 MiB chunk on two H200s.
//
// The communicators are non-blocking (every wait has a deadline and an abort frees a thread
// stuck on a dead peer), so an operation is enqueued by an NCCL thread after the call returns.
// A lane holds at most one such operation in flight, with the event to record on its stream
// once it is enqueued; Settle() waits for that (bounded, cancellable) and records the event.
// The caller can meanwhile enqueue work on other lanes: their NCCL threads overlap.
//
// Thread-safety: one owner thread calls everything but Abort(), which any thread may call; it
// waits for the owner to leave NCCL (the owner's waits watch `cancelled`, which the aborting
// thread sets first).
#pragma once

#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
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

  // ncclSend to / ncclRecv from the other rank on `lane`'s stream, after settling the lane's
  // previous operation. `then` (may be null; must outlive the next Settle of this lane) is
  // recorded on the lane's stream behind this operation.
  Status Send(size_t lane, const void* data, uint64_t bytes, const gpu::CudaEvent* then,
              SteadyTime deadline);
  Status Recv(size_t lane, void* data, uint64_t bytes, const gpu::CudaEvent* then,
              SteadyTime deadline);

  // Waits until the lane's operation in flight is enqueued and records its event.
  Status Settle(size_t lane, SteadyTime deadline);
  Status SettleAll(SteadyTime deadline);

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
    const gpu::CudaEvent* then = nullptr;
  };
  Status Post(size_t lane, bool send, void* data, uint64_t bytes, const gpu::CudaEvent* then,
              SteadyTime deadline);
  Status SettleLocked(Lane& lane, SteadyTime deadline);

  const int device_;
  const std::atomic<bool>& cancelled_;
  std::mutex mu_;  // held by the owner inside NCCL, and by Abort
  bool aborted_ = false;
  std::vector<std::unique_ptr<Lane>> lanes_;  // grows only in Join, under mu_
};

}  // namespace kv::transport::nccl
