// One side-channel connection between two NCCL backends, and the NCCL data path over it.
//
// A link is symmetric: either side may put (its bytes flow to the other side), get (the other
// side sends) and notify. Data flowing from side X to side Y uses two-rank communicators of its
// own (X rank 0, Y rank 1), `lanes` of them (lanes.h), created on the first batch in that
// direction from ncclUniqueIds that X sends over the socket. Each direction's communicators are
// used by one thread, in one order on both ends, which NCCL needs to never deadlock.
//
// Sending a batch: announce it (kData: its ranges, chunk size and direct threshold, so the
// receiver knows every operation's size and lane up front and none needs a message of its own),
// then enqueue the whole pipeline of gathers into staging slots and sends, chunk after chunk,
// and the direct sends of large ranges (staging.h). Slots are reused in device order (events),
// never by host waits. The receiver mirrors it with receives and scatters and acks once the
// batch is in place, learnt from an event; the sender's completion fires on the ack. A
// notification travels as a frame behind the batches posted before it, and the receiver holds
// it until they have landed, so nothing waits for acks on the sending side.
//
// The side channel's frames are sealed when kvd has a secret (channel_auth.h, SealChannel): the
// unique ids, announcements, acks and notes cross encrypted, and a frame that does not open
// (altered, injected, replayed, reordered) fails the link like a malformed message.
//
// Failure: EOF, a malformed message, an announced batch past its deadline or an NCCL error fail
// the link: every batch in flight completes with kUnavailable (kTimeout for the one that timed
// out), the threads abort their communicators (ncclCommAbort) and later calls are refused. A put
// that never got announced (past its deadline in the queue) fails alone and the link stays.
// Nothing waits without a deadline, and nothing waits for an engine: kvd posts a put out of an
// engine's cache only once the engine's event fired (daemon/event_gate.h).
//
// Thread-safety: Put/Get/Notify/Fail may be called from any thread; Put/Get/Notify only encode
// and queue, so they never wait for the GPU, the peer or a lock held across either. Three threads
// per link: the sender (gathers and ncclSend on the outgoing lanes), the receive worker (ncclRecv
// and scatter on the incoming ones) and the reader (socket, acks, deadlines). The reader never
// waits on the GPU, so it always sees a dead peer and can abort the other two out of NCCL.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/framed_socket.h"
#include "transport/nccl/region_table.h"
#include "transport/transport.h"

namespace kv::transport::nccl {

// Defaults measured on two H200s (benchmarks/gpu.md, pd_gpu.md): fewer, larger chunks because
// each NCCL launch on a non-blocking communicator costs the host ~50 µs; four lanes, so that two
// launches (of group_ops operations on two lanes each) are in flight while the owner thread posts
// the next batch: two lanes left each launch waiting for the last one's, and a TP split's small
// batches at 0.74-0.91 of the wire, four at 0.98-0.99 (eight slots measured no better than four,
// benchmarks/gpu.md); a small copy grid leaves SMs to NCCL and the engines.
struct LinkOptions {
  int device = 0;
  uint64_t chunk_bytes = 32ull << 20;  // one staging slot; a batch moves in chunks of this
  // Ranges at least this long go straight between the regions in pieces of chunk_bytes (0: never):
  // one NCCL operation each, so only ranges that keep the wire busy longer than an operation
  // costs the host (~50 µs) are worth it.
  uint64_t direct_bytes = 8ull << 20;
  // A put of more bytes moves as pieces of about this many (CutIntoPieces; 0: never cut): the
  // first piece's bytes move while the sender lays out the next, where a pulled request's 512 MiB
  // otherwise waited for the whole batch's announcement and its decoding.
  uint64_t piece_bytes = 64ull << 20;
  int slots = 4;       // staging slots per side and direction
  int lanes = 4;       // communicators per direction, 1..kMaxLanes
  int copy_ctas = 16;  // grid of the gather/scatter kernels; 0 = all SMs
  int group_ops = 2;   // operations per NCCL launch, 1..slots/2 (staging.h)
  std::chrono::milliseconds init_timeout{30000};
  // The sender, the receive worker and the reader spin instead of sleeping (kvd --busy-poll):
  // each hand-off between them then costs no thread wake-up, for three busy cores per link.
  bool busy_poll = false;
  // Launch NCCL operations on the link's threads, on blocking communicators split from the
  // non-blocking ones (lanes.h): no thread of NCCL's per launch. The sender decides for both ends.
  bool blocking_launch = false;
  // Each batch's steps by seq (TransportOptions::trace), where set: sender n_take, n_announced,
  // n_enqueued, n_acked; receiver n_in, n_recv, n_posted, n_scattered, n_landed.
  TraceFn trace = {};
};

class Link {
 public:
  // Takes a connected socket whose hello exchange is done, and the reader that read its frames
  // so far (frames it already holds are handled first); both sealed where the handshake sealed
  // the channel (channel_auth.h). Starts the threads.
  static Result<std::shared_ptr<Link>> Start(kv::Socket socket, kv::FrameReader frames,
                                             const LinkOptions& options,
                                             std::shared_ptr<RegionTable> regions,
                                             std::shared_ptr<NoteSink> notes);
  ~Link();  // fails what is in flight with kAborted, aborts the communicators, joins
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // runs, and the rows of groups: src_offset in `local_base`'s region, dst_offset in the peer's
  // region `remote_id`. Validated by the caller. kUnavailable when the link already failed
  // (`done` not called).
  Status Put(const char* local_base, std::span<const Run> runs, std::span<const RunGroup> groups,
             std::span<const GroupBlocks> blocks, uint64_t remote_id, Clock::time_point deadline,
             Completion done);
  // runs, and the rows of groups: src_offset in the peer's region `remote_id`, dst_offset in
  // `local_base`'s region. The request names the groups' rows in a few entries (SplitGet), not
  // one range per row.
  Status Get(char* local_base, std::span<const Run> runs, std::span<const RunGroup> groups,
             std::span<const GroupBlocks> blocks, uint64_t remote_id, Clock::time_point deadline,
             Completion done);
  // Delivered to the peer's handler once every batch posted before it has landed there.
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
