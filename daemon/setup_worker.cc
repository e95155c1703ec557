#include "daemon/setup_worker.h"

#include "base/thread_name.h"

namespace kv::daemon {

SetupWorker::SetupWorker(boost::asio::io_context& io, int threads, size_t max_jobs)
    : io_(io), max_jobs_(max_jobs) {
  for (int i = 0; i < std::max(threads, 1); ++i)
    threads_.emplace_back([this] {
      NameThisThread("kvd-setup");
      Loop();
    });
}

SetupWorker::~SetupWorker() {
  Shutdown();
}

Status SetupWorker::Enqueue(std::unique_ptr<Job> job) {
  std::lock_guard lock(mu_);
  if (stopping_) return Status::Unavailable("kvd is stopping");
  if (jobs_ >= max_jobs_) {
    return Status::ResourceExhausted("kvd has " + std::to_string(jobs_) +
                                     " setup steps in flight, the limit");
  }
  ++jobs_;
  queue_.emplace_back(next_id_++, std::move(job));
  wake_.notify_one();
  return Status::Ok();
}

void SetupWorker::Loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    auto [id, job] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    job->Run(Clock::now() > job->deadline);
    lock.lock();
    if (stopping_) return;  // `job` dies here, on this thread; Shutdown waits for it
    finished_.emplace(id, std::move(job));
    boost::asio::post(io_, [this, id = id] { Deliver(id); });  // clang 14: no binding capture
  }
}

void SetupWorker::Deliver(uint64_t id) {
  std::unique_ptr<Job> job;
  {
    std::lock_guard lock(mu_);
    auto it = finished_.find(id);
    if (it == finished_.end()) return;
    job = std::move(it->second);
    finished_.erase(it);
    --jobs_;
  }
  job->Finish();
}

void SetupWorker::Shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::lock_guard lock(mu_);
  queue_.clear();
  finished_.clear();
  jobs_ = 0;
}

}  // namespace kv::daemon
