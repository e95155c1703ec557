#include "transport/nccl/nccl_link.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "base/thread_name.h"
#include "base/waker.h"
#include "gpu/cuda_util.h"
#include "transport/nccl/lanes.h"
#include "transport/nccl/link_work.h"
#include "transport/nccl/nccl_comm.h"
#include "transport/nccl/staging.h"
#include "transport/nccl/wire.h"

namespace kv::transport::nccl {

using gpu::CudaEvent;
using gpu::CudaStatus;
using kv::FrameReader;
using kv::Socket;
using kv::Waker;

// ---- Link::Impl
// -----------------------------------------------------------------------------------

struct Link::Impl {
  explicit Impl(const LinkOptions& o)
      : options(o), waker(o.busy_poll), lanes_out(o.device, failed), lanes_in(o.device, failed) {}

  Socket socket;
  const LinkOptions options;
  std::shared_ptr<RegionTable> regions;
  std::shared_ptr<NoteSink> notes;

  // mu is held only for queue and map updates, never across a CUDA call or a socket write, so
  // Put/Get/Notify (the caller's thread) never wait behind a thread that waits on the GPU.
  std::atomic<bool> failed{false};
  std::mutex mu;
  Waker waker;                          // options.busy_poll: the sender and receive worker spin
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
  FrameReader frames;            // reader thread
  int wake_fd = -1;              // eventfd: the receive stream tells the reader a batch landed
  gpu::CudaStream wake_stream;   // receive worker: where those wake-ups wait for their batches

  Clock::time_point ControlDeadline() const { return Clock::now() + options.init_timeout; }

  void Trace(std::string_view event, uint64_t seq) const {
    if (options.trace) options.trace(event, seq);
  }

  void Fail(Status why) {
    std::map<uint64_t, PendingPut> dead_puts;
    std::map<uint64_t, PendingGet> dead_gets;
    std::deque<SendJob> dead_jobs;  // their completions are in the maps
    {
      std::lock_guard lock(mu);
      if (failed.exchange(true)) return;
      dead_puts.swap(puts);
      dead_gets.swap(gets);
      dead_jobs.swap(jobs);
    }
    waker.Notify();
    ::shutdown(socket.fd(), SHUT_RDWR);  // wakes the reader; the peer sees EOF
    // Both directions at once, for the reason Lanes::Abort gives: each abort waits for the device.
    std::thread abort_in([this] { lanes_in.Abort(); });
    lanes_out.Abort();
    abort_in.join();
    for (auto& [seq, put] : dead_puts) put.done(why);
    for (auto& [seq, get] : dead_gets) get.done(why);
  }

  // ---- sender thread ----

  void SendLoop() {
    cudaSetDevice(options.device);
    while (true) {
      SendJob job;
      {
        std::unique_lock lock(mu);
        waker.Await(lock, [&] { return failed.load() || !jobs.empty(); });
        if (failed) break;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      {
        std::lock_guard lock(mu);
        if (failed) break;
        if (job.is_put) {
          auto it = puts.find(job.data.seq);
          if (it == puts.end()) continue;  // the reader timed it out while it queued
          it->second.sent = true;
        }
      }
      if (job.kind == SendJob::Kind::kData) Trace("n_take", job.data.seq);
      Status sent;
      switch (job.kind) {
        case SendJob::Kind::kFrame:
          sent = socket.SendFrame(job.frame, ControlDeadline());
          break;
        case SendJob::Kind::kGet:
          sent = SendGet(job);
          break;
        case SendJob::Kind::kData:
          sent = SendData(job);
          break;
      }
      if (!sent.ok()) Fail(Status::Unavailable("nccl send: " + sent.ToString()));
    }
  }

  StagingOptions Staged() const {
    return {options.device, options.chunk_bytes, options.slots, options.copy_ctas,
            options.group_ops};
  }

  Status SendData(SendJob& job) {
    if (lanes_out.count() == 0) {
      std::vector<std::string> ids;
      for (int i = 0; i < options.lanes; ++i) {
        KV_ASSIGN_OR_RETURN(std::string id, NewUniqueId());
        KV_RETURN_IF_ERROR(
            socket.SendFrame(EncodeCommInit({id, options.blocking_launch}), ControlDeadline()));
        ids.push_back(std::move(id));
      }
      for (const std::string& id : ids) {
        KV_RETURN_IF_ERROR(
            lanes_out.Join(id, /*rank=*/0, options.blocking_launch, ControlDeadline()));
      }
    }
    if (!out) {
      KV_ASSIGN_OR_RETURN(out, Staging::Create(Staged(), failed));
    }
    SplitGroups(job.groups, job.data.chunk_bytes, &job.data, &job.gather, &job.rows);
    SplitBlocks(job.blocks, job.data.chunk_bytes, &job.data, &job.gather, &job.rows);
    job.groups = {};
    job.blocks = {};
    std::vector<Piece> pieces =
        CutIntoPieces(std::move(job.data), std::move(job.gather), std::move(job.rows),
                      job.is_put ? options.piece_bytes : 0);
    if (pieces.size() > 1 && !NumberPieces(pieces)) return Status::Ok();
    for (const Piece& piece : pieces) {
      if (&piece != &pieces[0]) Trace("n_take", piece.msg.seq);  // a batch of its own from here
      KV_RETURN_IF_ERROR(socket.SendFrame(EncodeData(piece.msg), job.deadline));
      Trace("n_announced", piece.msg.seq);
      KV_RETURN_IF_ERROR(out->Send(lanes_out, job.local_base, piece.gather, piece.rows,
                                   piece.msg.chunk_bytes, piece.msg.direct_bytes, job.deadline));
      Trace("n_enqueued", piece.msg.seq);
    }
    return Status::Ok();
  }

  // A put's pieces after the first become batches of their own (a seq and a PendingPut each), and
  // the put completes once every piece has. False if the put is gone (the reader expired it).
  bool NumberPieces(std::vector<Piece>& pieces) {
    std::lock_guard lock(mu);
    auto it = puts.find(pieces[0].msg.seq);
    if (it == puts.end()) return false;
    std::vector<Completion> parts = SplitCompletion(std::move(it->second.done), pieces.size());
    it->second.done = std::move(parts[0]);
    for (size_t i = 1; i < pieces.size(); ++i) {
      pieces[i].msg.seq = next_seq++;
      puts[pieces[i].msg.seq] = PendingPut{std::move(parts[i]), it->second.deadline, true};
    }
    return true;
  }

  // A get's request. Its rows are named here, off the thread that posted it, and its PendingGet
  // learns where they land before the request leaves: no reply can come sooner.
  Status SendGet(SendJob& job) {
    std::vector<Range> ranges;
    std::vector<Strided> rows;
    SplitGet(job.runs, job.groups, job.blocks, &job.request, &ranges, &rows);
    Result<uint64_t> bytes = TotalBytes(ranges, rows);
    Completion refused;
    {
      std::lock_guard lock(mu);
      auto it = gets.find(job.request.seq);
      if (it == gets.end()) return Status::Ok();  // the reader timed it out while it queued
      if (bytes.ok()) {
        it->second.ranges = std::move(ranges);
        it->second.rows = std::move(rows);
        it->second.chunk_bytes = job.request.chunk_bytes;
        it->second.bytes = *bytes;
        it->second.named = true;
      } else {
        refused = std::move(it->second.done);
        gets.erase(it);
      }
    }
    if (refused) {
      refused(bytes.status());  // it fails alone: nothing was asked of the peer
      return Status::Ok();
    }
    return socket.SendFrame(EncodeGetRequest(job.request), job.deadline);
  }

  // ---- reader thread ----

  void ReadLoop() {
    cudaSetDevice(options.device);
    Clock::time_point next_deadline_check = Clock::now();
    while (!failed) {
      bool busy = false;
      if (!options.busy_poll) {
        std::lock_guard lock(mu);
        busy = !recvs.empty() || !inbound.empty() || !puts.empty() || !gets.empty();
      }
      // Finished scatters wake us through wake_fd; the timeout only paces deadline checks.
      pollfd fds[2] = {{socket.fd(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
      ::poll(fds, 2, options.busy_poll ? 0 : busy ? 1 : 50);
      uint64_t drained;
      while (fds[1].revents != 0 && ::read(wake_fd, &drained, sizeof(drained)) > 0) {
      }
      // Frames the reader already holds (read with the hello) are handled on the first turn. A
      // sealed frame that does not open fails the read, after the frames before it.
      const Status read = fds[0].revents != 0 ? frames.ReadAvailable(socket.fd()) : Status::Ok();
      while (auto frame = frames.Next()) {
        Status handled = HandleFrame(*frame);
        if (!handled.ok()) {
          Fail(Status::Unavailable("nccl: " + handled.ToString()));
          break;
        }
      }
      if (!read.ok()) Fail(Status::Unavailable("nccl: " + read.ToString()));
      if (failed) break;
      FinishReceives();
      // About once a millisecond when spinning too: walking `puts` under mu on every turn would
      // hold up the threads that post.
      const Clock::time_point now = Clock::now();
      if (!options.busy_poll || now >= next_deadline_check) {
        CheckDeadlines();
        next_deadline_check = now + std::chrono::milliseconds(1);
      }
    }
  }

  // ---- receive worker: ncclRecv and scatter, in the order the batches were announced ----

  void ReceiveLoop() {
    cudaSetDevice(options.device);
    while (true) {
      Inbound item;
      bool finish = false;  // nothing queued: enqueue the scatters the last batch left waiting
      {
        std::unique_lock lock(mu);
        finish = in != nullptr && in->pending() && inbound.empty() && !failed;
        if (!finish) {
          waker.Await(lock, [&] { return failed.load() || !inbound.empty(); });
          if (failed) break;
          item = std::move(inbound.front());
          inbound.pop_front();
        }
      }
      Status done = finish              ? in->FinishPending(lanes_in, ControlDeadline())
                    : item.is_comm_init ? JoinIncoming(item.comm_init)
                                        : ReceiveData(item.data);
      if (!done.ok()) Fail(Status::Unavailable("nccl receive: " + done.ToString()));
    }
  }

  Status JoinIncoming(const CommInitMsg& lane) {
    return lanes_in.Join(lane.unique_id, /*rank=*/1, lane.blocking_launch, ControlDeadline());
  }

  void Enqueue(Inbound item) {
    {
      std::lock_guard lock(mu);
      inbound.push_back(std::move(item));
    }
    waker.Notify();
  }

  Status HandleFrame(const std::string& frame) {
    KV_ASSIGN_OR_RETURN(MsgType type, PeekType(frame));
    switch (type) {
      case MsgType::kHello:
        return Status::InvalidArgument("unexpected hello");
      case MsgType::kCommInit: {
        KV_ASSIGN_OR_RETURN(CommInitMsg lane, DecodeCommInit(frame));
        Enqueue(Inbound{true, std::move(lane), {}});
        return Status::Ok();
      }
      case MsgType::kData: {
        KV_ASSIGN_OR_RETURN(DataMsg msg, DecodeData(frame));
        Trace("n_in", msg.seq);
        ++announced;
        Enqueue(Inbound{false, {}, std::move(msg)});
        return Status::Ok();
      }
      case MsgType::kAck:
      case MsgType::kGetError: {
        KV_ASSIGN_OR_RETURN(AckMsg ack, DecodeAck(frame));
        Completion done;
        if (type == MsgType::kAck) Trace("n_acked", ack.seq);  // not under mu: it writes a log
        {
          std::lock_guard lock(mu);
          if (type == MsgType::kAck) {
            auto it = puts.find(ack.seq);
            if (it == puts.end()) return Status::InvalidArgument("ack for an unknown batch");
            done = std::move(it->second.done);
            puts.erase(it);
          } else {
            auto it = gets.find(ack.seq);
            if (it == gets.end()) return Status::InvalidArgument("error for an unknown get");
            done = std::move(it->second.done);
            gets.erase(it);
          }
        }
        waker.Notify();
        if (done) done(ack.status);
        return Status::Ok();
      }
      case MsgType::kGetRequest: {
        KV_ASSIGN_OR_RETURN(GetRequestMsg req, DecodeGetRequest(frame));
        return AnswerGet(std::move(req));
      }
      case MsgType::kNote: {
        KV_ASSIGN_OR_RETURN(std::string text, DecodeNote(frame));
        held_notes.emplace_back(announced, std::move(text));
        DeliverNotes();
        return Status::Ok();
      }
    }
    return Status::InvalidArgument("unknown message");
  }

  // The reply is laid out in the request's chunks where it has rows (they are cut to fit those),
  // else in chunks of at most ours. It names no ranges: the requester knows them.
  Status AnswerGet(GetRequestMsg req) {
    auto region = regions->Find(req.region_id);
    const uint64_t chunk_bytes =
        req.strided.empty() ? std::min(req.chunk_bytes, options.chunk_bytes) : req.chunk_bytes;
    Status ok = region.ok() ? CheckRanges(req.ranges, region->second) : region.status();
    if (ok.ok()) ok = CheckStrided(req.strided, region->second, chunk_bytes);
    if (ok.ok()) {
      Result<uint64_t> bytes = TotalBytes(req.ranges, req.strided);
      ok = bytes.ok() ? CheckBatchSize(*bytes, region->second) : bytes.status();
    }
    if (ok.ok() && chunk_bytes > options.chunk_bytes) {
      ok = Status::Incompatible("a get's rows staged in chunks of " + std::to_string(chunk_bytes) +
                                " bytes; this side stages at most " +
                                std::to_string(options.chunk_bytes));
    }
    if (!ok.ok()) return socket.SendFrame(EncodeGetError({req.seq, ok}), ControlDeadline());
    SendJob job;
    job.kind = SendJob::Kind::kData;
    job.data.reply_to = req.seq;
    job.data.chunk_bytes = chunk_bytes;
    job.data.direct_bytes = options.direct_bytes;
    job.gather = std::move(req.ranges);
    job.rows = std::move(req.strided);
    job.local_base = region->first;
    job.deadline = ControlDeadline();
    {
      std::lock_guard lock(mu);
      if (failed) return Status::Ok();
      job.data.seq = next_seq++;
      jobs.push_back(std::move(job));
    }
    waker.Notify();
    return Status::Ok();
  }

  Status ReceiveData(const DataMsg& msg) {
    Trace("n_recv", msg.seq);
    char* base = nullptr;
    std::span<const Range> scatter = msg.ranges;
    std::span<const Strided> rows = msg.strided;
    // A get's own, taken from it (nothing else reads them once the reply came): the reader may
    // expire the get meanwhile.
    std::vector<Range> get_ranges;
    std::vector<Strided> get_rows;
    if (msg.reply_to == 0) {
      KV_ASSIGN_OR_RETURN(uint64_t bytes, TotalBytes(msg.ranges, msg.strided));
      KV_ASSIGN_OR_RETURN(auto region, regions->Find(msg.region_id));
      KV_RETURN_IF_ERROR(CheckBatchSize(bytes, region.second));
      KV_RETURN_IF_ERROR(CheckRanges(msg.ranges, region.second));
      KV_RETURN_IF_ERROR(CheckStrided(msg.strided, region.second, msg.chunk_bytes));
      base = region.first;
    } else {
      // A get's reply lands where the get said, in the chunks it asked for where it has rows.
      if (!msg.ranges.empty() || !msg.strided.empty()) {
        return Status::InvalidArgument("a get's reply names ranges");
      }
      std::lock_guard lock(mu);
      auto it = gets.find(msg.reply_to);
      if (it == gets.end() || !it->second.named) {
        return Status::InvalidArgument("data for an unknown get");
      }
      PendingGet& get = it->second;
      const bool chunks_fit = get.rows.empty() ? msg.chunk_bytes <= get.chunk_bytes
                                               : msg.chunk_bytes == get.chunk_bytes;
      if (!chunks_fit) {
        return Status::InvalidArgument("a get's reply in chunks of " +
                                       std::to_string(msg.chunk_bytes) + " bytes, not " +
                                       std::to_string(get.chunk_bytes));
      }
      base = get.local_base;
      get_ranges = std::move(get.ranges);
      get_rows = std::move(get.rows);
      scatter = get_ranges;
      rows = get_rows;
    }
    if (!in) {
      KV_ASSIGN_OR_RETURN(in, Staging::Create(Staged(), failed));
    }
    const uint64_t seq = msg.seq, reply_to = msg.reply_to;
    KV_RETURN_IF_ERROR(in->Receive(
        lanes_in, base, scatter, rows, msg.chunk_bytes, msg.direct_bytes, ControlDeadline(),
        [this, seq, reply_to](cudaStream_t copy) { return Landed(seq, reply_to, copy); }));
    Trace("n_posted", seq);
    return Status::Ok();
  }

  // The batch `seq` is in place once `copy` gets here: the reader acks it then.
  Status Landed(uint64_t seq, uint64_t reply_to, cudaStream_t copy) {
    Trace("n_scattered", seq);
    KV_ASSIGN_OR_RETURN(CudaEvent landed, CudaEvent::Create(options.device));
    KV_RETURN_IF_ERROR(landed.Record(copy));
    // Acks leave the moment the last scatter finishes, not at the reader's next timeout. The
    // wake-up runs on a stream of its own: a host function holds up its stream until CUDA's
    // callback thread has run it, and on the copy stream that stalled every batch's next scatters
    // (and so, through the slots, its receives) by a callback round trip.
    if (!wake_stream.get()) {
      KV_ASSIGN_OR_RETURN(wake_stream, gpu::CudaStream::Create(options.device));
    }
    KV_RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(wake_stream.get(), landed.get(), 0), "cudaStreamWaitEvent"));
    {
      std::lock_guard lock(mu);
      recvs.push_back(PendingRecv{seq, reply_to, std::move(landed)});
    }
    return CudaStatus(cudaLaunchHostFunc(wake_stream.get(), &WakeReader, this),
                      "cudaLaunchHostFunc");
  }

  static void CUDART_CB WakeReader(void* self) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(static_cast<Impl*>(self)->wake_fd, &one, sizeof(one));
  }

  // Acks every batch whose scatter finished, in order, and releases the notes behind it; the
  // reader never waits on the GPU. Only this thread pops `recvs`, so the front's event stays
  // valid while it is queried outside the lock.
  void FinishReceives() {
    while (true) {
      const CudaEvent* front = nullptr;
      {
        std::lock_guard lock(mu);
        if (recvs.empty()) return;
        front = &recvs.front().landed;
      }
      Result<bool> done = front->Query();
      if (!done.ok()) return Fail(Status::Unavailable("nccl: " + done.status().ToString()));
      if (!*done) return;
      PendingRecv batch;
      Completion get_done;
      {
        std::lock_guard lock(mu);
        batch = std::move(recvs.front());
        recvs.pop_front();
        auto it = batch.reply_to != 0 ? gets.find(batch.reply_to) : gets.end();
        if (it != gets.end()) {
          get_done = std::move(it->second.done);
          gets.erase(it);
        }
      }
      Trace("n_landed", batch.seq);
      if (get_done) get_done(Status::Ok());
      ++landed;
      DeliverNotes();
      Status acked = socket.SendFrame(EncodeAck({batch.seq, Status::Ok()}), ControlDeadline());
      if (!acked.ok()) return Fail(Status::Unavailable("nccl: " + acked.ToString()));
    }
  }

  void DeliverNotes() {
    while (!held_notes.empty() && held_notes.front().first <= landed) {
      notes->Deliver(held_notes.front().second);
      held_notes.pop_front();
    }
  }

  void CheckDeadlines() {
    std::vector<Completion> expired, unsent;
    const auto now = Clock::now();
    {
      std::lock_guard lock(mu);
      for (auto it = puts.begin(); it != puts.end();) {
        if (now < it->second.deadline) {
          ++it;
          continue;
        }
        if (!it->second.sent) {  // never announced: it fails alone and the link stays
          unsent.push_back(std::move(it->second.done));
        } else {
          expired.push_back(std::move(it->second.done));
        }
        it = puts.erase(it);
      }
      for (auto it = gets.begin(); it != gets.end();) {
        if (now < it->second.deadline) {
          ++it;
          continue;
        }
        if (!it->second.named) {  // never asked for: it fails alone and the link stays
          unsent.push_back(std::move(it->second.done));
        } else {
          expired.push_back(std::move(it->second.done));
        }
        it = gets.erase(it);
      }
    }
    for (Completion& done : unsent) {
      done(Status::Timeout("nccl: batch passed its deadline before it was sent"));
    }
    if (expired.empty()) return;
    for (Completion& done : expired) done(Status::Timeout("nccl: batch passed its deadline"));
    // The communicator's state is unknown after a lost batch: start over.
    Fail(Status::Unavailable("nccl: a batch timed out; the link was reset"));
  }
};

// ---- Link
// -----------------------------------------------------------------------------------------

Link::Link(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::shared_ptr<Link>> Link::Start(Socket socket, FrameReader frames,
                                          const LinkOptions& options,
                                          std::shared_ptr<RegionTable> regions,
                                          std::shared_ptr<NoteSink> notes) {
  if (options.lanes < 1 || options.lanes > kMaxLanes || options.slots < 1 ||
      options.chunk_bytes < kMinChunkBytes) {
    return Status::InvalidArgument("nccl: bad link options");
  }
  auto impl = std::make_unique<Impl>(options);
  impl->socket = std::move(socket);
  impl->frames = std::move(frames);
  impl->regions = std::move(regions);
  impl->notes = std::move(notes);
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0) return Status::IoError("eventfd failed");
  Impl* raw = impl.get();
  std::shared_ptr<Link> link(new Link(std::move(impl)));
  raw->sender = std::thread([raw] {
    NameThisThread("nccl-send");
    raw->SendLoop();
  });
  raw->reader = std::thread([raw] {
    NameThisThread("nccl-read");
    raw->ReadLoop();
  });
  raw->receiver = std::thread([raw] {
    NameThisThread("nccl-recv");
    raw->ReceiveLoop();
  });
  return link;
}

Link::~Link() {
  impl_->Fail(Status::Aborted("nccl: peer disconnected"));
  impl_->sender.join();
  impl_->reader.join();
  impl_->receiver.join();
  // Host callbacks still queued behind the scatters write to wake_fd.
  if (impl_->wake_stream.get()) cudaStreamSynchronize(impl_->wake_stream.get());
  ::close(impl_->wake_fd);
}

Status Link::Put(const char* local_base, std::span<const Run> runs,
                 std::span<const RunGroup> groups, std::span<const GroupBlocks> blocks,
                 uint64_t remote_id, Clock::time_point deadline, Completion done) {
  SendJob job;
  job.kind = SendJob::Kind::kData;
  job.is_put = true;
  job.data.region_id = remote_id;
  job.data.chunk_bytes = impl_->options.chunk_bytes;
  job.data.direct_bytes = impl_->options.direct_bytes;
  job.data.ranges.reserve(runs.size());
  job.gather.reserve(runs.size());
  for (const Run& r : runs) {
    job.data.ranges.push_back({r.dst_offset, r.length});
    job.gather.push_back({r.src_offset, r.length});
  }
  job.groups.assign(groups.begin(), groups.end());
  job.blocks.assign(blocks.begin(), blocks.end());
  job.local_base = local_base;
  job.deadline = deadline;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->failed) return Status::Unavailable("nccl: link to peer failed");
    job.data.seq = impl_->next_seq++;
    impl_->puts[job.data.seq] = PendingPut{std::move(done), deadline, false};
    impl_->jobs.push_back(std::move(job));
  }
  impl_->waker.Notify();
  return Status::Ok();
}

Status Link::Get(char* local_base, std::span<const Run> runs, std::span<const RunGroup> groups,
                 std::span<const GroupBlocks> blocks, uint64_t remote_id,
                 Clock::time_point deadline, Completion done) {
  SendJob job;
  job.kind = SendJob::Kind::kGet;
  job.request.region_id = remote_id;
  job.request.chunk_bytes = impl_->options.chunk_bytes;
  job.runs.assign(runs.begin(), runs.end());
  job.groups.assign(groups.begin(), groups.end());
  job.blocks.assign(blocks.begin(), blocks.end());
  job.deadline = deadline;
  PendingGet get;
  get.local_base = local_base;
  get.done = std::move(done);
  get.deadline = deadline;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->failed) return Status::Unavailable("nccl: link to peer failed");
    job.request.seq = impl_->next_seq++;
    impl_->gets[job.request.seq] = std::move(get);
    impl_->jobs.push_back(std::move(job));
  }
  impl_->waker.Notify();
  return Status::Ok();
}

Status Link::Notify(std::string message) {
  SendJob job;
  job.frame = EncodeNote(message);
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->failed) return Status::Unavailable("nccl: link to peer failed");
    impl_->jobs.push_back(std::move(job));
  }
  impl_->waker.Notify();
  return Status::Ok();
}

void Link::Fail(Status why) {
  impl_->Fail(std::move(why));
}

bool Link::failed() const {
  return impl_->failed;
}

}  // namespace kv::transport::nccl
