#include "transport/cuda_ipc/poster.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "base/thread_name.h"
#include "transport/same_host_channel.h"

namespace kv::transport::cuda_ipc {

namespace {

// Spare events kept for later batches (each batch records one).
constexpr size_t kSpareEvents = 256;

// Waits for `stream`'s work, polling, for at most `timeout`; false when it did not finish (or
// failed) in time.
bool DrainStream(cudaStream_t stream, std::chrono::nanoseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      cudaGetLastError();  // reported by the failed batch's own event, not left to a later call
      return false;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

Result<std::unique_ptr<Poster>> Poster::Start(int device, std::optional<kernels::CopyPath> forced,
                                              bool busy_poll, Launched launched, TraceFn trace) {
  std::unique_ptr<Poster> poster(
      new Poster(device, busy_poll, std::move(launched), std::move(trace)));
  poster->channels_.resize(kChannels);
  for (Channel& channel : poster->channels_) {
    KV_ASSIGN_OR_RETURN(channel.stream, CudaStream::Create(device));
    KV_ASSIGN_OR_RETURN(channel.copier, RunCopier::Create(device, forced));
  }
  poster->thread_ = std::thread([p = poster.get()] {
    NameThisThread("ipc-poster");
    p->Loop();
  });
  return poster;
}

Poster::~Poster() {
  std::deque<PostJob> left;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    stopping_.store(true, std::memory_order_release);
    left.swap(queue_);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (PostJob& job : left) {
    if (!job.is_note && job.done) job.done(Status::Aborted("cuda_ipc transport destroyed"));
  }
  DeviceGuard guard(device_);
  for (Channel& channel : channels_) {
    if (channel.stream.get() != nullptr) DrainStream(channel.stream.get(), kDrainTimeout);
  }
}

void Poster::Submit(PostJob job) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(job));
    submitted_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_one();
}

void Poster::TakeQueued(PeerId peer, std::vector<Completion>* failed) {
  std::lock_guard lock(mu_);
  TakeJobsOf(&queue_, peer, failed);
}

void Poster::Recycle(CudaEvent event) {
  std::lock_guard lock(mu_);
  if (spare_events_.size() < kSpareEvents) spare_events_.push_back(std::move(event));
}

Result<CudaEvent> Poster::TakeEvent() {
  {
    std::lock_guard lock(mu_);
    if (!spare_events_.empty()) {
      CudaEvent event = std::move(spare_events_.back());
      spare_events_.pop_back();
      return event;
    }
  }
  return CudaEvent::Create(device_);
}

void Poster::Loop() {
  DeviceGuard guard(device_);
  while (true) {
    PostJob next;
    {
      std::unique_lock lock(mu_);
      if (busy_poll_) {
        while (!stop_ && queue_.empty()) {
          const uint64_t seen = submitted_.load(std::memory_order_relaxed);
          lock.unlock();
          SpinPast(seen);
          lock.lock();
        }
      } else {
        wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      }
      if (stop_) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    Dispatch(std::move(next));
  }
}

void Poster::SpinPast(uint64_t seen) const {
  while (submitted_.load(std::memory_order_acquire) == seen &&
         !stopping_.load(std::memory_order_acquire)) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }
}

void Poster::Dispatch(PostJob job) {
  if (job.is_note) {
    launched_(std::move(job), Launch{});  // the caller holds it to the batches before it
    return;
  }
  if (trace_) trace_("i_take", job.seq);
  if (Clock::now() >= job.deadline) {
    launched_(
        std::move(job),
        Launch{
            -1, {}, Status::Timeout("cuda_ipc: batch passed its deadline before it was launched")});
    return;
  }
  LaunchCoalesced(std::move(job));
}

void Poster::LaunchCoalesced(PostJob job) {
  std::vector<PostJob>& jobs = coalesced_;
  jobs.clear();
  jobs.push_back(std::move(job));
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    for (auto it = queue_.begin(); it != queue_.end() && jobs.size() < kMaxCoalesced;) {
      if (it->is_note) break;  // launches may pass each other, but not beyond a note
      const bool ready = it->src == jobs[0].src && it->dst == jobs[0].dst && now < it->deadline;
      if (!ready) {
        ++it;
        continue;
      }
      jobs.push_back(std::move(*it));
      it = queue_.erase(it);
    }
  }
  if (jobs.size() == 1) {
    Launch launch = LaunchBatch(jobs[0]);
    launched_(std::move(jobs[0]), std::move(launch));
    return;
  }
  merged_.src = jobs[0].src;
  merged_.dst = jobs[0].dst;
  merged_.runs.clear();
  merged_.groups.clear();
  merged_.blocks.clear();
  for (const PostJob& j : jobs) {
    merged_.runs.insert(merged_.runs.end(), j.runs.begin(), j.runs.end());
    merged_.groups.insert(merged_.groups.end(), j.groups.begin(), j.groups.end());
    merged_.blocks.insert(merged_.blocks.end(), j.blocks.begin(), j.blocks.end());
  }
  // The first batch's event is the merged copy's; each follower's is recorded right behind it.
  std::vector<Launch> launches;
  launches.reserve(jobs.size());  // `first` below stays valid
  launches.push_back(LaunchBatch(merged_));
  const Launch& first = launches.front();
  for (size_t i = 1; i < jobs.size(); ++i) {
    launches.push_back(first.event.get() != nullptr ? RecordBehind(first.channel, first.status)
                                                    : Launch{first.channel, {}, first.status});
  }
  for (size_t i = 0; i < jobs.size(); ++i) launched_(std::move(jobs[i]), std::move(launches[i]));
}

Launch Poster::RecordBehind(int channel, Status status) {
  cudaStream_t stream = channels_[channel].stream.get();
  Launch launch{channel, {}, std::move(status)};
  auto event = TakeEvent();
  Status recorded = event.ok() ? event->Record(stream) : event.status();
  if (recorded.ok()) {
    launch.event = std::move(event).value();
    return launch;
  }
  if (launch.status.ok()) launch.status = recorded;
  if (!DrainStream(stream, kDrainTimeout)) {
    launch.status = launch.status.WithContext("copies still ran after " +
                                              std::to_string(kDrainTimeout.count()) + " s");
  }
  return launch;
}

Launch Poster::LaunchBatch(const PostJob& job) {
  const int index = next_channel_;
  next_channel_ = (next_channel_ + 1) % kChannels;
  Channel& channel = channels_[index];
  cudaStream_t stream = channel.stream.get();
  Status s = Status::Ok();
  bool enqueued = false;  // whether any copy may be on the stream
  if (!job.runs.empty()) {
    enqueued = true;
    s = channel.copier->Copy(job.src, job.dst, job.runs, kernels::CopyDirection::kPeer, stream);
  }
  if (s.ok() && !job.groups.empty()) {
    enqueued = true;
    s = channel.copier->CopyGroups(job.src, job.dst, job.groups, kernels::CopyDirection::kPeer,
                                   stream);
  }
  if (s.ok() && !job.blocks.empty()) {
    enqueued = true;
    s = channel.copier->CopyBlocks(job.src, job.dst, job.blocks, kernels::CopyDirection::kPeer,
                                   stream);
  }
  // Behind every successful launch, and behind a failed one that may have enqueued copies: the
  // batch completes only once they stopped writing.
  if (s.ok() || enqueued) return RecordBehind(index, std::move(s));
  return Launch{index, {}, std::move(s)};  // nothing enqueued
}

}  // namespace kv::transport::cuda_ipc
