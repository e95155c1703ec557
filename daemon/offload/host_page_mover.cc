#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "daemon/offload/page_mover.h"
#include "kernels/plan_copy.h"

namespace kv::offload {
namespace {

class HostPageMover final : public PageMover {
 public:
  HostPageMover() : worker_([this] { Work(); }) {}

  ~HostPageMover() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_.notify_one();
    worker_.join();
  }

  Status Submit(CopyJob job) override {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return Status::Aborted("host page mover is shutting down");
      queue_.push_back(std::move(job));
    }
    wake_.notify_one();
    return Status::Ok();
  }

 private:
  void Work() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every accepted job is done
      CopyJob job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      for (size_t p = 0; p < job.phases.size(); ++p) {
        kernels::CopyRunsHost(job.src_base, job.dst_base, job.phases[p]);
        if (job.on_phase) job.on_phase(p);
      }
      job.done(Status::Ok());
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<CopyJob> queue_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after every member it uses exists
};

}  // namespace

std::unique_ptr<PageMover> CreateHostPageMover() {
  return std::make_unique<HostPageMover>();
}

}  // namespace kv::offload
