#include "transport/cuda_ipc/poster.h"

#include <cuda_runtime_api.h>
#include <sys/prctl.h>

#include <utility>

namespace kv::transport::gpu {

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
                                              Launched launched) {
  std::unique_ptr<Poster> poster(new Poster(device, std::move(launched)));
  poster->channels_.resize(kChannels);
  for (Channel& channel : poster->channels_) {
    KV_ASSIGN_OR_RETURN(channel.stream, CudaStream::Create(device));
    KV_ASSIGN_OR_RETURN(channel.copier, RunCopier::Create(device, forced));
  }
  poster->thread_ = std::thread([p = poster.get()] { p->Loop(); });
  return poster;
}

Poster::~Poster() {
  std::deque<PostJob> left;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    left.swap(queue_);
    for (PostJob& job : held_) left.push_back(std::move(job));
    held_.clear();
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
  }
  wake_.notify_one();
}

void Poster::TakeQueued(PeerId peer, std::vector<Completion>* failed) {
  std::lock_guard lock(mu_);
  for (std::deque<PostJob>* jobs : {&queue_, &held_}) {
    for (auto it = jobs->begin(); it != jobs->end();) {
      if (it->peer != peer) {
        ++it;
        continue;
      }
      if (!it->is_note && it->done) failed->push_back(std::move(it->done));
      it = jobs->erase(it);
    }
  }
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
  // So that a wait of kGatePoll lasts about that, not the default 50 us of timer slack more.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  std::vector<PostJob> open;
  while (true) {
    std::optional<PostJob> next;
    {
      std::unique_lock lock(mu_);
      auto ready = [&] { return stop_ || !queue_.empty(); };
      if (held_.empty()) {
        wake_.wait(lock, ready);
      } else {
        wake_.wait_for(lock, kGatePoll, ready);
      }
      if (stop_) return;
      OpenGatesLocked(&open);
      if (!queue_.empty()) {
        next = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    for (PostJob& job : open) Dispatch(std::move(job));
    open.clear();
    if (next) Dispatch(std::move(*next));
  }
}

void Poster::OpenGatesLocked(std::vector<PostJob>* open) {
  const auto now = Clock::now();
  for (auto it = held_.begin(); it != held_.end();) {
    Result<bool> fired = QueryEvent(static_cast<cudaEvent_t>(it->wait_event));
    if (fired.ok() && !*fired && now < it->deadline) {
      ++it;
      continue;
    }
    open->push_back(std::move(*it));
    it = held_.erase(it);
  }
}

void Poster::Dispatch(PostJob job) {
  Launch launch;
  if (job.is_note) {
    // nothing to launch: the caller holds the note to the batches before it
  } else if (Clock::now() >= job.deadline) {
    launch.status = Status::Timeout(
        "cuda_ipc: batch passed its deadline before it was launched (queued, or waiting for its "
        "event)");
  } else if (job.wait_event != nullptr) {
    Result<bool> fired = QueryEvent(static_cast<cudaEvent_t>(job.wait_event));
    if (fired.ok() && !*fired) {
      std::lock_guard lock(mu_);
      held_.push_back(std::move(job));
      return;
    }
    if (!fired.ok()) {
      launched_(std::move(job), Launch{-1, {}, fired.status()});
      return;
    }
    LaunchCoalesced(std::move(job));
    return;
  } else {
    LaunchCoalesced(std::move(job));
    return;
  }
  launched_(std::move(job), std::move(launch));
}

void Poster::LaunchCoalesced(PostJob job) {
  std::vector<PostJob> jobs;
  jobs.push_back(std::move(job));
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    for (auto it = queue_.begin(); it != queue_.end() && jobs.size() < kMaxCoalesced;) {
      if (it->is_note) break;  // launches may pass each other, but not beyond a note
      bool ready = it->src == jobs[0].src && it->dst == jobs[0].dst && now < it->deadline;
      if (ready && it->wait_event != nullptr) {
        Result<bool> fired = QueryEvent(static_cast<cudaEvent_t>(it->wait_event));
        ready = fired.ok() && *fired;
      }
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
  PostJob merged;
  merged.src = jobs[0].src;
  merged.dst = jobs[0].dst;
  for (const PostJob& j : jobs) {
    merged.runs.insert(merged.runs.end(), j.runs.begin(), j.runs.end());
    merged.groups.insert(merged.groups.end(), j.groups.begin(), j.groups.end());
  }
  Launch first = LaunchBatch(merged);
  std::vector<Launch> launches;
  for (size_t i = 1; i < jobs.size(); ++i) {
    Launch follower{first.channel, {}, first.status};
    if (first.event.get() != nullptr) {
      cudaStream_t stream = channels_[first.channel].stream.get();
      auto event = TakeEvent();
      Status recorded = event.ok() ? event->Record(stream) : event.status();
      if (recorded.ok()) {
        follower.event = std::move(event).value();
      } else {
        // No event behind copies that may still run: wait for them here, bounded.
        DrainStream(stream, kDrainTimeout);
        if (follower.status.ok()) follower.status = recorded;
      }
    }
    launches.push_back(std::move(follower));
  }
  launched_(std::move(jobs[0]), std::move(first));
  for (size_t i = 1; i < jobs.size(); ++i)
    launched_(std::move(jobs[i]), std::move(launches[i - 1]));
}

Launch Poster::LaunchBatch(const PostJob& job) {
  Launch launch;
  launch.channel = next_channel_;
  next_channel_ = (next_channel_ + 1) % kChannels;
  Channel& channel = channels_[launch.channel];
  cudaStream_t stream = channel.stream.get();
  auto event = TakeEvent();
  if (!event.ok()) {
    launch.status = event.status();  // nothing enqueued yet
    return launch;
  }
  Status s = Status::Ok();  // the job's event, if any, fired: nothing waits for it here
  bool enqueued = false;    // whether any copy may be on the stream
  if (s.ok() && !job.runs.empty()) {
    enqueued = true;
    s = channel.copier->Copy(job.src, job.dst, job.runs, kernels::CopyDirection::kPeer, stream);
  }
  if (s.ok() && !job.groups.empty()) {
    enqueued = true;
    s = channel.copier->CopyGroups(job.src, job.dst, job.groups, kernels::CopyDirection::kPeer,
                                   stream);
  }
  launch.status = s;
  // Behind every successful launch, and behind a failed one that may have enqueued copies:
  // the batch completes only once they stopped writing.
  if (s.ok() || enqueued) {
    Status recorded = event->Record(stream);
    if (recorded.ok()) {
      launch.event = std::move(event).value();
    } else if (s.ok()) {
      launch.status = recorded;
    }
  }
  if (!launch.status.ok() && enqueued && launch.event.get() == nullptr) {
    // No event behind copies that may still run: wait for the channel here, bounded.
    if (!DrainStream(stream, kDrainTimeout)) {
      launch.status = launch.status.WithContext("copies of the failed batch still ran after " +
                                                std::to_string(kDrainTimeout.count()) + " s");
    }
  }
  return launch;
}

}  // namespace kv::transport::gpu
