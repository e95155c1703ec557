// An owned two-rank NCCL communicator. Init makes it non-blocking, so that every wait on it
// (creation, connection set-up, enqueueing) has a deadline and a dead peer can be abandoned with
// ncclCommAbort instead of hanging a thread. SplitBlocking makes a blocking one from such a
// parent, sharing its connections, for launches on the caller's thread (lanes.h says when that
// is safe).
//
// Thread-safety: one thread issues operations on a communicator; Abort() may come from that
// thread only (the owner aborts on its own thread when told the link failed).
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <string>

#include "base/status.h"

namespace kv::transport::nccl {

using SteadyTime = std::chrono::steady_clock::time_point;

// kIoError naming the NCCL error; kUnavailable for remote/system errors (the peer is gone).
Status NcclStatus(ncclResult_t result, const char* what);

// A fresh unique id (rank 0 makes it and sends it to rank 1 over the side channel).
Result<std::string> NewUniqueId();

// NCCL looks up all its kernels in its first communicator's init; under lazy module loading
// (CUDA's default) that loads them, which may synchronise the whole context and so wait for
// copies gated on an engine's event. A one-rank communicator made and destroyed here, before
// any such copy exists, pays for that once per process.
Status LoadNcclKernels(int device);

class NcclComm {
 public:
  NcclComm() = default;
  ~NcclComm();  // destroys, or aborts when the communicator failed or never came up
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Joins the two-rank communicator `unique_id` as `rank` on `device`, waiting (without
  // blocking inside NCCL) until both ranks joined, `deadline` passed or `cancelled` turned true.
  // `unique_id` must be exactly sizeof(ncclUniqueId) bytes (kInvalidArgument otherwise).
  // `shared_by_splits`: communicators split from this one share its resources (NCCL reads
  // splitShare from the parent's config, not the child's), SplitBlocking needs it.
  Status Init(std::string_view unique_id, int rank, int device, SteadyTime deadline,
              const std::atomic<bool>& cancelled, bool shared_by_splits = false);

  // Makes this a blocking communicator split from `parent` (ready, non-blocking, initialised
  // with shared_by_splits) that shares its
  // resources, connections included (splitShare): its operations launch on the calling thread
  // and connect nothing. The split itself is non-blocking, waited for as Init is; both ranks
  // must call it. Destroy or abort this one before `parent`.
  Status SplitBlocking(NcclComm& parent, int rank, int device, SteadyTime deadline,
                       const std::atomic<bool>& cancelled);

  bool ready() const { return comm_ != nullptr && !failed_; }
  ncclComm_t get() const { return comm_; }

  // After an operation returned ncclInProgress: waits until it is enqueued. On any failure the
  // communicator is marked failed (and aborted on destruction).
  Status WaitEnqueued(SteadyTime deadline, const std::atomic<bool>& cancelled);

  // After an operation failed outright: the communicator is aborted on destruction.
  void MarkFailed() { failed_ = true; }

  // Kills the communicator's kernels and frees it; a later call is a no-op.
  void Abort();

 private:
  ncclComm_t comm_ = nullptr;
  bool failed_ = false;
};

}  // namespace kv::transport::nccl
