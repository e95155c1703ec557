// Link::Impl's reader thread (frames from the peer, acks, notes, deadlines) and receive worker
// (ncclRecv and scatter); link_impl.h.
#include <cuda_runtime_api.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "transport/nccl/link_impl.h"

namespace kv::transport::nccl {

using gpu::CudaEvent;
using gpu::CudaStatus;

// ---- reader thread

void Link::Impl::ReadLoop() {
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

Status Link::Impl::HandleFrame(const std::string& frame) {
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

Status Link::Impl::AnswerGet(GetRequestMsg req) {
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

void Link::Impl::FinishReceives() {
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

void Link::Impl::DeliverNotes() {
  while (!held_notes.empty() && held_notes.front().first <= landed) {
    notes->Deliver(held_notes.front().second);
    held_notes.pop_front();
  }
}

void Link::Impl::CheckDeadlines() {
  std::vector<Completion> expired, unsent;
  const auto now = Clock::now();
  // Puts and gets alike: one never sent fails alone and the link stays.
  const auto take_expired = [&](auto& pending) {
    for (auto it = pending.begin(); it != pending.end();) {
      if (now < it->second.deadline) {
        ++it;
        continue;
      }
      (it->second.sent ? expired : unsent).push_back(std::move(it->second.done));
      it = pending.erase(it);
    }
  };
  {
    std::lock_guard lock(mu);
    take_expired(puts);
    take_expired(gets);
  }
  for (Completion& done : unsent) {
    done(Status::Timeout("nccl: batch passed its deadline before it was sent"));
  }
  if (expired.empty()) return;
  for (Completion& done : expired) done(Status::Timeout("nccl: batch passed its deadline"));
  // The communicator's state is unknown after a lost batch: start over.
  Fail(Status::Unavailable("nccl: a batch timed out; the link was reset"));
}

// ---- receive worker

void Link::Impl::ReceiveLoop() {
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

void Link::Impl::Enqueue(Inbound item) {
  {
    std::lock_guard lock(mu);
    inbound.push_back(std::move(item));
  }
  waker.Notify();
}

Status Link::Impl::JoinIncoming(const CommInitMsg& lane) {
  return lanes_in.Join(lane.unique_id, /*rank=*/1, lane.blocking_launch, ControlDeadline());
}

Status Link::Impl::ReceiveData(const DataMsg& msg) {
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
    if (it == gets.end() || !it->second.sent) {
      return Status::InvalidArgument("data for an unknown get");
    }
    PendingGet& get = it->second;
    const bool chunks_fit =
        get.rows.empty() ? msg.chunk_bytes <= get.chunk_bytes : msg.chunk_bytes == get.chunk_bytes;
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

Status Link::Impl::Landed(uint64_t seq, uint64_t reply_to, cudaStream_t copy) {
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
  return CudaStatus(cudaLaunchHostFunc(wake_stream.get(), &WakeReader, this), "cudaLaunchHostFunc");
}

void CUDART_CB Link::Impl::WakeReader(void* self) {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(static_cast<Impl*>(self)->wake_fd, &one, sizeof(one));
}

}  // namespace kv::transport::nccl
