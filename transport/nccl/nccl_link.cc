#include "transport/nccl/nccl_link.h"

#include <cuda_runtime_api.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <utility>

#include "base/thread_name.h"
#include "transport/nccl/link_impl.h"
#include "transport/nccl/nccl_comm.h"

namespace kv::transport::nccl {

// ---- Link::Impl: failing, and the sender thread

void Link::Impl::Fail(Status why) {
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

void Link::Impl::SendLoop() {
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

Status Link::Impl::SendData(SendJob& job) {
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
  const std::vector<PieceStart> at =
      CutIntoPieces(job.data.ranges, job.groups, job.blocks, job.is_put ? options.piece_bytes : 0);
  const size_t pieces = at.size() - 1;
  if (pieces == 1) {  // a get's reply always: its rows are the request's, in job.rows
    SplitGroups(job.groups, job.data.chunk_bytes, &job.data, &job.gather, &job.rows);
    SplitBlocks(job.blocks, job.data.chunk_bytes, &job.data, &job.gather, &job.rows);
    return SendPiece(job, job.data, job.gather, job.rows);
  }
  std::vector<uint64_t> seqs;
  if (!NumberPieces(job.data.seq, pieces, &seqs)) return Status::Ok();
  const std::span<const RunGroup> groups = job.groups;
  const std::span<const GroupBlocks> blocks = job.blocks;
  for (size_t k = 0; k < pieces; ++k) {
    const PieceStart& a = at[k];
    const PieceStart& b = at[k + 1];
    DataMsg msg;
    msg.seq = seqs[k];
    msg.region_id = job.data.region_id;
    msg.chunk_bytes = job.data.chunk_bytes;
    msg.direct_bytes = job.data.direct_bytes;
    msg.ranges.assign(job.data.ranges.begin() + a.ranges, job.data.ranges.begin() + b.ranges);
    std::vector<Range> gather(job.gather.begin() + a.ranges, job.gather.begin() + b.ranges);
    std::vector<Strided> rows;
    SplitGroups(groups.subspan(a.groups, b.groups - a.groups), msg.chunk_bytes, &msg, &gather,
                &rows);
    SplitBlocks(blocks.subspan(a.blocks, b.blocks - a.blocks), msg.chunk_bytes, &msg, &gather,
                &rows);
    if (k > 0) Trace("n_take", msg.seq);  // a batch of its own from here
    KV_RETURN_IF_ERROR(SendPiece(job, msg, gather, rows));
  }
  return Status::Ok();
}

Status Link::Impl::SendPiece(const SendJob& job, const DataMsg& msg, std::span<const Range> gather,
                             std::span<const Strided> rows) {
  KV_RETURN_IF_ERROR(socket.SendFrame(EncodeData(msg), job.deadline));
  Trace("n_announced", msg.seq);
  KV_RETURN_IF_ERROR(out->Send(lanes_out, job.local_base, gather, rows, msg.chunk_bytes,
                               msg.direct_bytes, job.deadline));
  Trace("n_enqueued", msg.seq);
  return Status::Ok();
}

bool Link::Impl::NumberPieces(uint64_t seq, size_t pieces, std::vector<uint64_t>* seqs) {
  std::lock_guard lock(mu);
  auto it = puts.find(seq);
  if (it == puts.end()) return false;
  std::vector<Completion> parts = SplitCompletion(std::move(it->second.done), pieces);
  it->second.done = std::move(parts[0]);
  seqs->push_back(seq);
  for (size_t k = 1; k < pieces; ++k) {
    seqs->push_back(next_seq++);
    puts[seqs->back()] = PendingPut{std::move(parts[k]), it->second.deadline, true};
  }
  return true;
}

Status Link::Impl::SendGet(SendJob& job) {
  std::vector<Range> ranges;
  std::vector<Strided> rows;
  SplitGet(job.runs, job.groups, job.blocks, &job.request, &ranges, &rows);
  {
    std::lock_guard lock(mu);
    auto it = gets.find(job.request.seq);
    if (it == gets.end()) return Status::Ok();  // the reader timed it out while it queued
    it->second.ranges = std::move(ranges);
    it->second.rows = std::move(rows);
    it->second.chunk_bytes = job.request.chunk_bytes;
    it->second.sent = true;
  }
  return socket.SendFrame(EncodeGetRequest(job.request), job.deadline);
}

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
