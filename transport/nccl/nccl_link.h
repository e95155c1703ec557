// One side-channel connection between two NCCL backends, and the NCCL data path over it.
//
// A link is symmetric: either side may put (its bytes flow to the other side), get (the other
// side sends) and notify. Data flowing from side X to side Y uses a two-rank communicator of its
// own (X rank 0, Y rank 1), created on the first batch in that direction from a ncclUniqueId
// that X sends over the socket. One communicator per direction keeps each one's operations in a
// single thread and in one order on both ends, which NCCL needs to never deadlock.
//
// Sending a batch: announce it (kData), then per chunk of staging: gather the runs into a
// staging slot (the kernels' run copier) on the gather stream, ncclSend the slot on the send
// stream. Two slots alternate, so the gather of chunk k+1 overlaps the send of chunk k; a slot
// is reused only after its send finished (a device-side event wait, never a host wait). The
// receiver mirrors it: ncclRecv into a slot, scatter on a second stream, ack once the last
// scatter is done. The sender's completion fires on the ack.
//
// Failure: EOF, a malformed message, a batch past its deadline or an NCCL error fail the link:
// every batch in flight completes with kUnavailable (kTimeout for the one that timed out), the
// threads abort their communicators (ncclCommAbort) and later calls are refused. Nothing waits
// without a deadline.
//
// Thread-safety: Put/Get/Notify/Fail may be called from any thread. Three threads per link: the
// sender (gathers and ncclSend on the outgoing communicator), the receive worker (ncclRecv and
// scatter on the incoming one) and the reader (socket, acks, deadlines). The reader never waits
// on the GPU, so it always sees a dead peer and can abort the other two out of NCCL.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "transport/cuda_ipc/side_channel.h"
#include "transport/nccl/region_table.h"
#include "transport/transport.h"

namespace kv::transport::nccl {

struct LinkOptions {
  int device = 0;
  uint64_t chunk_bytes = 32ull << 20;  // one staging slot; two per direction
  std::chrono::milliseconds init_timeout{30000};
};

class Link {
 public:
  // Takes a connected socket whose hello exchange is done and starts the two threads.
  static Result<std::shared_ptr<Link>> Start(gpu::Socket socket, const LinkOptions& options,
                                             std::shared_ptr<RegionTable> regions,
                                             std::shared_ptr<NoteSink> notes);
  ~Link();  // fails what is in flight with kAborted, aborts the communicators, joins
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // runs: src_offset in `local_base`'s region, dst_offset in the peer's region `remote_id`.
  // Validated by the caller. The gathers wait on the device for `start_after` (a cudaEvent_t,
  // its record as of this call) when not null. kUnavailable when the link already failed
  // (`done` not called).
  Status Put(const char* local_base, std::span<const Run> runs, uint64_t remote_id,
             Clock::time_point deadline, void* start_after, Completion done);
  // runs: src_offset in the peer's region `remote_id`, dst_offset in `local_base`'s region.
  Status Get(char* local_base, std::span<const Run> runs, uint64_t remote_id,
             Clock::time_point deadline, Completion done);
  // Sent after the ack of every put posted before it.
  Status Notify(std::string message);

  // Fails the link (idempotent): see the header comment.
  void Fail(Status why);
  bool failed() const;

 private:
  struct Impl;
  explicit Link(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kv::transport::nccl
