// The GPU side of the pool's copies (contract: page_mover.h). Kept free of spdlog/fmt: nvcc
// cannot compile them.
//
// Submit() puts a job's copies on the stream and returns; it never waits for the GPU. Copy-engine
// phases are cudaMemcpyBatchAsync calls. Kernel phases read their
// run table straight from pinned host memory (mapped under UVA; 16 bytes per 32 KiB chunk cross
// PCIe), one table per job, recycled when the job finished: unlike kernels::PlanCopier's two
// device tables, no table upload or reuse makes the submitting thread wait for an earlier copy,
// which would sit behind the copies already on the stream. The completion thread polls each
// phase's event against a deadline instead of blocking in cudaEventSynchronize.
#include <cuda_runtime.h>

#include <algorithm>
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

using Clock = std::chrono::steady_clock;

Status CudaError(const char* what, cudaError_t err) {
  cudaGetLastError();
  return Status::Unavailable(std::string(what) + ": " + cudaGetErrorString(err));
}

#define KV_CUDA_RETURN(what, call)                               \
  do {                                                           \
    cudaError_t kv_err_ = (call);                                \
    if (kv_err_ != cudaSuccess) return CudaError(what, kv_err_); \
  } while (0)

// One job's run table for the copy kernel: pinned host memory the kernel reads directly.
struct KernelTable {
  void* data = nullptr;
  uint64_t capacity = 0;
  KernelTable() = default;
  KernelTable(const KernelTable&) = delete;
  KernelTable& operator=(const KernelTable&) = delete;
  ~KernelTable() {
    if (data != nullptr) cudaFreeHost(data);
  }
};

// One submitted job, shared by the completion entries of its phases.
struct JobState {
  std::function<void(size_t)> on_phase;
  std::function<void(Status)> done;
  std::unique_ptr<KernelTable> table;  // back to the mover once the job finished
  bool finished = false;               // touched only by the completion thread
};

// The completion thread's unit of work: wait for `event`, then report `phase` of `job`; the
// entry that carries `last` (or an error) also finishes the job.
struct Pending {
  std::shared_ptr<JobState> job;
  cudaEvent_t event = nullptr;  // pooled; null when the phase put nothing on the stream
  size_t phase = 0;
  bool last = false;
  Status error;
};

bool UseCopyEngine(DeviceCopy how, std::span<const Run> runs) {
  if (how != DeviceCopy::kAuto) return how == DeviceCopy::kCopyEngine;
  uint64_t bytes = 0;
  for (const Run& r : runs) bytes += r.length;
  return bytes >= kOffloadCopyEngineMinRun * runs.size();
}

class CudaPageMover final : public PageMover {
 public:
  static Result<std::unique_ptr<PageMover>> Create(int device, const CudaMoverOptions& options) {
    if (options.dma_slice_runs < 1) {
      return Status::InvalidArgument("offload copy-engine batches need at least one run");
    }
    if (options.timeout.count() <= 0) {
      return Status::InvalidArgument("offload copy timeout must be positive");
    }
    KV_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device));
    int sms = 0;
    KV_CUDA_RETURN("SM count",
                   cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    std::unique_ptr<CudaPageMover> mover(new CudaPageMover(device, options, sms));
    KV_CUDA_RETURN("cudaStreamCreate",
                   cudaStreamCreateWithFlags(&mover->stream_, cudaStreamNonBlocking));
    mover->completer_ = std::thread([m = mover.get()] { m->Complete(); });
    return std::unique_ptr<PageMover>(std::move(mover));
  }

  ~CudaPageMover() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (completer_.joinable()) completer_.join();
    if (wedged_ && !Drained()) {
      // A stuck copy may still read the tables: leak them rather than free memory in use.
      for (auto& t : free_tables_) (void)t.release();
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Submit(CopyJob job) override {
    std::lock_guard submit_lock(submit_mu_);  // one job's copies at a time on the stream
    {
      std::lock_guard lock(mu_);
      if (stopping_) return Status::Aborted("cuda page mover is shutting down");
      if (wedged_) {
        return Status::Unavailable("offload copies on cuda:" + std::to_string(device_) +
                                   " are stuck: an earlier copy missed its deadline");
      }
    }
    KV_CUDA_RETURN("cudaSetDevice", cudaSetDevice(device_));
    auto state = std::make_shared<JobState>();
    std::vector<bool> engine(job.phases.size());
    uint64_t table_bytes = 0;
    for (size_t p = 0; p < job.phases.size(); ++p) {
      engine[p] = UseCopyEngine(options_.how, job.phases[p]);
      if (!engine[p]) table_bytes += TableBytes(job.phases[p]);
    }
    if (table_bytes > 0) {
      KV_ASSIGN_OR_RETURN(state->table, TakeTable(table_bytes));
    }
    state->on_phase = std::move(job.on_phase);
    state->done = std::move(job.done);
    // From here on the job is accepted: a failure finishes it through the completion thread,
    // after the phases already on the stream have landed.
    std::deque<Pending> entries;
    auto* table = state->table ? static_cast<std::byte*>(state->table->data) : nullptr;
    for (size_t p = 0; p < job.phases.size(); ++p) {
      cudaEvent_t event = nullptr;
      Status error = [&] {
        KV_RETURN_IF_ERROR(engine[p]
                               ? EnqueueDma(job.src_base, job.dst_base, job.phases[p])
                               : EnqueueKernel(job.src_base, job.dst_base, job.phases[p], &table));
        return RecordEvent(&event);
      }();
      // A phase that failed part-way may have copies on the stream: the job reports its error
      // only once nothing can still write what its caller is about to free.
      if (!error.ok() && event == nullptr && !RecordEvent(&event).ok()) {
        cudaStreamSynchronize(stream_);
      }
      const bool failed = !error.ok();
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
  CudaPageMover(int device, const CudaMoverOptions& options, int sms)
      : device_(device), options_(options) {
    kernel_options_.max_ctas = sms;
  }

  static uint64_t TableBytes(std::span<const Run> runs) {
    const uint64_t bytes = kernels::PlanCopyTableBytes(runs.size(), kernels::PlanCopyChunks(runs));
    return (bytes + 15) / 16 * 16;  // each phase's table starts 16-byte aligned
  }

  // A recycled table of at least `bytes`, or a new one. Tables live as long as the mover: the
  // pool's jobs have a bounded size, so their number and size settle.
  Result<std::unique_ptr<KernelTable>> TakeTable(uint64_t bytes) {
    {
      std::lock_guard lock(mu_);
      for (auto it = free_tables_.begin(); it != free_tables_.end(); ++it) {
        if ((*it)->capacity >= bytes) {
          auto table = std::move(*it);
          free_tables_.erase(it);
          return Result<std::unique_ptr<KernelTable>>(std::move(table));
        }
      }
    }
    auto table = std::make_unique<KernelTable>();
    const uint64_t want = std::max<uint64_t>(bytes, 64 << 10);
    KV_CUDA_RETURN("cudaMallocHost (run table)", cudaMallocHost(&table->data, want));
    table->capacity = want;
    return Result<std::unique_ptr<KernelTable>>(std::move(table));
  }

  // One phase through the copy engine, in batches of dma_slice_runs: the engine starts on the
  // first batch while the driver still takes in the next, rather than after the whole table.
  Status EnqueueDma(const std::byte* src, std::byte* dst, std::span<const Run> runs) {
    const size_t slice = static_cast<size_t>(options_.dma_slice_runs);
    for (size_t at = 0; at < runs.size(); at += slice) {
      KV_RETURN_IF_ERROR(kernels::LaunchBatchCopy(
          src, dst, runs.subspan(at, std::min(slice, runs.size() - at)), stream_));
    }
    return Status::Ok();
  }

  // One phase through the copy kernel, its table encoded at *table (advanced past it).
  Status EnqueueKernel(const std::byte* src, std::byte* dst, std::span<const Run> runs,
                       std::byte** table) {
    const uint64_t bytes = TableBytes(runs);
    if (bytes == 0) return Status::Ok();
    KV_ASSIGN_OR_RETURN(uint64_t chunks, kernels::EncodePlanCopyTable(runs, *table, bytes));
    Status launched =
        kernels::LaunchPlanCopy(src, dst, *table, runs.size(), chunks, kernel_options_, stream_);
    *table += bytes;
    return launched;
  }

  Status RecordEvent(cudaEvent_t* event) {
    {
      std::lock_guard lock(mu_);
      if (!free_events_.empty()) {
        *event = free_events_.back();
        free_events_.pop_back();
      }
    }
    if (*event == nullptr) {
      // Polled, never waited on: no blocking-sync flag needed.
      KV_CUDA_RETURN("cudaEventCreate", cudaEventCreateWithFlags(event, cudaEventDisableTiming));
    }
    cudaError_t err = cudaEventRecord(*event, stream_);
    if (err != cudaSuccess) {
      ReturnEvent(*event);
      *event = nullptr;
      return CudaError("cudaEventRecord", err);
    }
    return Status::Ok();
  }

  // Whether the stream of a wedged mover emptied within one more timeout.
  bool Drained() {
    const auto deadline = Clock::now() + options_.timeout;
    cudaError_t err;
    while ((err = cudaStreamQuery(stream_)) == cudaErrorNotReady && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return err == cudaSuccess;
  }

  void ReturnEvent(cudaEvent_t event) {
    std::lock_guard lock(mu_);
    free_events_.push_back(event);
  }

  // Polls `event` until it fired, failed, or the deadline passed. Yields for the first 200 µs
  // (a phase's tail), then sleeps in 50 µs steps: a late wake-up costs at most that much per
  // job, never a core.
  Status Wait(cudaEvent_t event) {
    if (event == nullptr) return Status::Ok();
    const auto start = Clock::now();
    for (;;) {
      const cudaError_t err = cudaEventQuery(event);
      if (err == cudaSuccess) return Status::Ok();
      if (err != cudaErrorNotReady) return CudaError("copy on the offload stream", err);
      const auto waited = Clock::now() - start;
      if (waited >= options_.timeout) {
        return Status::Timeout("offload copy on cuda:" + std::to_string(device_) +
                               " did not land within " + std::to_string(options_.timeout.count()) +
                               " ms");
      }
      if (waited < std::chrono::microseconds(200)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  void Complete() {
    cudaSetDevice(device_);
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;
      Pending entry = std::move(pending_.front());
      pending_.pop_front();
      const bool wedged = wedged_;
      lock.unlock();
      // Once one copy missed its deadline, everything behind it on the stream is stuck too.
      Status waited =
          wedged ? Status::Timeout("an earlier offload copy on cuda:" + std::to_string(device_) +
                                   " missed its deadline")
                 : Wait(entry.event);
      if (waited.code() == Code::kTimeout) {
        std::lock_guard wedge(mu_);
        wedged_ = true;  // its event may still fire: it is not reused
      } else if (entry.event != nullptr) {
        ReturnEvent(entry.event);
      }
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
      if (entry.last && job.table && !wedged_) free_tables_.push_back(std::move(job.table));
      if (job.table && wedged_) (void)job.table.release();  // may still be read
    }
  }

  const int device_;
  const CudaMoverOptions options_;
  kernels::PlanCopyOptions kernel_options_;
  cudaStream_t stream_ = nullptr;
  std::mutex submit_mu_;
  std::mutex mu_;  // guards everything below
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<std::unique_ptr<KernelTable>> free_tables_;
  bool stopping_ = false;
  bool wedged_ = false;
  std::thread completer_;  // started by Create() once every member it uses exists
};

}  // namespace

Result<std::unique_ptr<PageMover>> CreateCudaPageMover(int device,
                                                       const CudaMoverOptions& options) {
  return CudaPageMover::Create(device, options);
}

}  // namespace kv::offload
