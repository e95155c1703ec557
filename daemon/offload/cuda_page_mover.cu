// The GPU side of the pool's copies. Kept free of spdlog/fmt: nvcc cannot compile them.
#include <cuda_runtime.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/offload/page_mover.h"
#include "kernels/plan_copy.h"

namespace kv::offload {
namespace {

Status CudaError(const char* what, cudaError_t err) {
  cudaGetLastError();
  return Status::Unavailable(std::string(what) + ": " + cudaGetErrorString(err));
}

#define KV_CUDA_RETURN(what, call)                               \
  do {                                                           \
    cudaError_t kv_err_ = (call);                                \
    if (kv_err_ != cudaSuccess) return CudaError(what, kv_err_); \
  } while (0)

// One submitted job, shared by the completion entries of its phases.
struct JobState {
  std::function<void(size_t)> on_phase;
  std::function<void(Status)> done;
  bool finished = false;  // touched only by the completion thread
};

// The completion thread's unit of work: wait for `event`, then report `phase` of `job`; the
// entry that carries `last` (or an error) also finishes the job.
struct Pending {
  std::shared_ptr<JobState> job;
  cudaEvent_t event = nullptr;
  size_t phase = 0;
  bool last = false;
  Status error;
};

class CudaPageMover final : public PageMover {
 public:
  static Result<std::unique_ptr<PageMover>> Create(int device, DeviceCopy how) {
    KV_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device));
    cudaStream_t stream;
    KV_CUDA_RETURN("cudaStreamCreate", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto copier = kernels::PlanCopier::Create();
    if (!copier.ok()) {
      cudaStreamDestroy(stream);
      return copier.status();
    }
    return std::unique_ptr<PageMover>(
        new CudaPageMover(device, how, stream, std::move(copier).value()));
  }

  ~CudaPageMover() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_.notify_one();
    completer_.join();
    copier_.reset();
    cudaStreamDestroy(stream_);
  }

  Status Submit(CopyJob job) override {
    std::lock_guard submit_lock(submit_mu_);  // PlanCopier is single-threaded
    {
      std::lock_guard lock(mu_);
      if (stopping_) return Status::Aborted("cuda page mover is shutting down");
    }
    KV_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
    cudaPointerAttributes attrs{};
    KV_CUDA_RETURN("cudaPointerGetAttributes", cudaPointerGetAttributes(&attrs, job.src_base));
    const auto direction = attrs.type == cudaMemoryTypeDevice
                               ? kernels::CopyDirection::kDeviceToHost
                               : kernels::CopyDirection::kHostToDevice;
    if (job.ready_event != nullptr) {
      KV_CUDA_RETURN("cudaStreamWaitEvent",
                     cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(job.ready_event), 0));
    }
    auto state = std::make_shared<JobState>();
    state->on_phase = std::move(job.on_phase);
    state->done = std::move(job.done);
    // From here on the job is accepted: a failure finishes it through the completion thread,
    // after the phases already on the stream have landed.
    std::deque<Pending> entries;
    for (size_t p = 0; p < job.phases.size(); ++p) {
      cudaEvent_t event = nullptr;
      Status error = EnqueuePhase(job.src_base, job.dst_base, job.phases[p], direction, &event);
      const bool failed = !error.ok();
      // A phase that failed part-way may already have copies on the stream: fence them, so the
      // job reports its error only once nothing can still write the slots it is about to free.
      if (failed && event == nullptr && !RecordEvent(&event).ok()) cudaStreamSynchronize(stream_);
      entries.push_back({state, event, p, failed || p + 1 == job.phases.size(), std::move(error)});
      if (failed) break;
    }
    if (entries.empty()) entries.push_back({state, nullptr, 0, true, Status::Ok()});
    {
      std::lock_guard lock(mu_);
      for (auto& e : entries) pending_.push_back(std::move(e));
    }
    wake_.notify_one();
    return Status::Ok();
  }

 private:
  CudaPageMover(int device, DeviceCopy how, cudaStream_t stream,
                std::unique_ptr<kernels::PlanCopier> copier)
      : device_(device),
        how_(how),
        stream_(stream),
        copier_(std::move(copier)),
        completer_([this] { Complete(); }) {}

  // Puts one phase's copies on the stream and records the event that marks their end.
  Status EnqueuePhase(const std::byte* src, std::byte* dst, const std::vector<Run>& runs,
                      kernels::CopyDirection direction, cudaEvent_t* event) {
    if (!runs.empty()) {
      const bool dma =
          how_ == DeviceCopy::kCopyEngine ||
          (how_ == DeviceCopy::kAuto &&
           kernels::ChooseCopyPath(runs, direction, stream_) == kernels::CopyPath::kCopyEngine);
      KV_RETURN_IF_ERROR(dma ? kernels::LaunchBatchCopy(src, dst, runs, stream_)
                             : copier_->Copy(src, dst, runs, stream_));
    }
    return RecordEvent(event);
  }

  Status RecordEvent(cudaEvent_t* event) {
    // Blocking sync: the completion thread sleeps in the driver instead of spinning a core.
    KV_CUDA_RETURN("cudaEventCreate",
                   cudaEventCreateWithFlags(event, cudaEventDisableTiming | cudaEventBlockingSync));
    cudaError_t err = cudaEventRecord(*event, stream_);
    if (err != cudaSuccess) {
      cudaEventDestroy(*event);
      *event = nullptr;
      return CudaError("cudaEventRecord", err);
    }
    return Status::Ok();
  }

  // A null event (a job with nothing to copy) has nothing to wait for.
  static Status WaitAndDestroy(cudaEvent_t event) {
    if (event == nullptr) return Status::Ok();
    cudaError_t err = cudaEventSynchronize(event);
    cudaEventDestroy(event);
    return err == cudaSuccess ? Status::Ok() : CudaError("copy on the offload stream", err);
  }

  void Complete() {
    cudaSetDevice(device_);
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;
      Pending entry = std::move(pending_.front());
      pending_.pop_front();
      lock.unlock();
      const Status waited = WaitAndDestroy(entry.event);  // a failed phase is fenced too
      const Status status = entry.error.ok() ? waited : entry.error;
      JobState& job = *entry.job;
      if (!job.finished) {
        if (status.ok() && job.on_phase) job.on_phase(entry.phase);
        if (entry.last || !status.ok()) {
          job.finished = true;
          job.done(status);
        }
      }
      lock.lock();
    }
  }

  const int device_;
  const DeviceCopy how_;
  cudaStream_t stream_;
  std::unique_ptr<kernels::PlanCopier> copier_;
  std::mutex submit_mu_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  bool stopping_ = false;
  std::thread completer_;  // last: starts after every member it uses exists
};

}  // namespace

Result<std::unique_ptr<PageMover>> CreateCudaPageMover(int device, DeviceCopy how) {
  return CudaPageMover::Create(device, how);
}

}  // namespace kv::offload
