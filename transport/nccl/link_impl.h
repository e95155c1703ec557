// Link::Impl (nccl_link.h): a link's state and its three threads' work, shared by the files
// that define them: nccl_link.cc (the sender thread, and Link itself), link_receive.cc (the
// reader thread and the receive worker). Internal to the backend.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/framed_socket.h"
#include "base/waker.h"
#include "gpu/cuda_util.h"
#include "transport/nccl/lanes.h"
#include "transport/nccl/link_work.h"
#include "transport/nccl/nccl_link.h"
#include "transport/nccl/staging.h"
#include "transport/nccl/wire.h"

namespace kv::transport::nccl {

struct Link::Impl {
  explicit Impl(const LinkOptions& o)
      : options(o), waker(o.busy_poll), lanes_out(o.device, failed), lanes_in(o.device, failed) {}

  kv::Socket socket;
  const LinkOptions options;
  std::shared_ptr<RegionTable> regions;
  std::shared_ptr<NoteSink> notes;

  // mu is held only for queue and map updates, never across a CUDA call or a socket write, so
  // Put/Get/Notify (the caller's thread) never wait behind a thread that waits on the GPU.
  std::atomic<bool> failed{false};
  std::mutex mu;
  kv::Waker waker;                      // options.busy_poll: the sender and receive worker spin
  std::deque<SendJob> jobs;             // guarded by mu
  std::map<uint64_t, PendingPut> puts;  // from post to ack; guarded by mu
  std::map<uint64_t, PendingGet> gets;  // awaiting data; guarded by mu
  uint64_t next_seq = 1;                // guarded by mu
  std::deque<Inbound> inbound;          // reader -> receive worker; guarded by mu
  std::deque<PendingRecv> recvs;        // receive worker -> reader, to ack; guarded by mu
  // Reader thread only: notes wait until every batch announced before them has landed.
  uint64_t announced = 0;
  uint64_t landed = 0;
  std::deque<std::pair<uint64_t, std::string>> held_notes;  // (batches announced before, text)
  std::thread sender;
  std::thread reader;
  std::thread receiver;

  // Each direction's lanes are used by one thread and aborted by Fail() from any thread; every
  // wait of those threads polls `failed`, so they let go when the link fails.
  Lanes lanes_out;               // sender thread
  Lanes lanes_in;                // receive worker
  std::unique_ptr<Staging> out;  // sender thread
  std::unique_ptr<Staging> in;   // receive worker
  kv::FrameReader frames;        // reader thread
  int wake_fd = -1;              // eventfd: the receive stream tells the reader a batch landed
  gpu::CudaStream wake_stream;   // receive worker: where those wake-ups wait for their batches

  Clock::time_point ControlDeadline() const { return Clock::now() + options.init_timeout; }

  void Trace(std::string_view event, uint64_t seq) const {
    if (options.trace) options.trace(event, seq);
  }

  StagingOptions Staged() const {
    return {options.device, options.chunk_bytes, options.slots, options.copy_ctas,
            options.group_ops};
  }

  // Fails the link (idempotent): fails every put and get in flight, aborts both directions'
  // lanes, and shuts the socket so the reader and the peer see it.
  void Fail(Status why);

  // ---- sender thread (nccl_link.cc) ----

  void SendLoop();
  // A put, or a get's reply: cut into pieces (a put larger than piece_bytes), each split into
  // rows as it goes, announced, and its sends enqueued.
  Status SendData(SendJob& job);
  // One batch (a put's piece, or a get's reply): announced, and its sends enqueued.
  Status SendPiece(const SendJob& job, const DataMsg& msg, std::span<const Range> gather,
                   std::span<const Strided> rows);
  // The seqs of put `seq`'s pieces, in `seqs`: the first is `seq`, the others batches of their
  // own (a PendingPut each), and the put completes once every piece has. False if the put is gone
  // (the reader expired it).
  bool NumberPieces(uint64_t seq, size_t pieces, std::vector<uint64_t>* seqs);
  // A get's request. Its rows are named here, off the thread that posted it, and its PendingGet
  // learns where they land before the request leaves: no reply can come sooner.
  Status SendGet(SendJob& job);

  // ---- reader thread (link_receive.cc) ----

  void ReadLoop();
  // One frame from the peer; an error fails the link (a peer that sends a malformed one).
  Status HandleFrame(const std::string& frame);
  // The reply is laid out in the request's chunks where it has rows (they are cut to fit those),
  // else in chunks of at most ours. It names no ranges: the requester knows them.
  Status AnswerGet(GetRequestMsg req);
  // Acks every batch whose scatter finished, in order, and releases the notes behind it; the
  // reader never waits on the GPU. Only this thread pops `recvs`, so the front's event stays
  // valid while it is queried outside the lock.
  void FinishReceives();
  // Hands the peer's notes to `notes` once every batch announced before each has landed.
  void DeliverNotes();
  // A put or get past its deadline fails; one already announced also fails the link, whose
  // communicators' state is then unknown.
  void CheckDeadlines();

  // ---- receive worker: ncclRecv and scatter, in the order the batches were announced
  // (link_receive.cc) ----

  void ReceiveLoop();
  void Enqueue(Inbound item);  // from the reader
  Status JoinIncoming(const CommInitMsg& lane);
  // A put's announcement (checked against the region) or a get's reply: receives and scatters
  // enqueued.
  Status ReceiveData(const DataMsg& msg);
  // The batch `seq` is in place once `copy` gets here: the reader acks it then.
  Status Landed(uint64_t seq, uint64_t reply_to, cudaStream_t copy);
  static void CUDART_CB WakeReader(void* self);
};

}  // namespace kv::transport::nccl
