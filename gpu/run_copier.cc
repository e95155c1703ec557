#include "gpu/run_copier.h"

#include <algorithm>

#include "gpu/cuda_util.h"

namespace kv::gpu {
namespace {

constexpr uint64_t kEnginePieceBytes = uint64_t{2} << 20;
// Smaller copies stay on the caller's stream: forking and joining four lanes costs the host
// about ten CUDA calls, and a copier's owner keeps several copies in flight on streams of its own.
constexpr uint64_t kLanesFromBytes = uint64_t{64} << 20;

// Under lazy module loading (the default since CUDA 12.2) a kernel is loaded at its first
// launch, and loading may synchronise the whole context: the first Copy() would then block the
// caller until every stream of the device drains, including the engine's, and would deadlock
// against work that waits for the caller (a stream the caller is yet to release).
// One real copy here, on a private stream, pays that load while nothing else is waiting on us.
Status LoadCopyKernel(int device, kernels::PlanCopier& kernel) {
  KV_ASSIGN_OR_RETURN(DeviceBuffer scratch, DeviceBuffer::Allocate(device, 32));
  KV_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(device));
  const Run run{0, 16, 16};
  char* base = static_cast<char*>(scratch.data());
  KV_RETURN_IF_ERROR(kernel.Copy(base, base, std::span<const Run>(&run, 1), stream.get()));
  return CudaStatus(cudaStreamSynchronize(stream.get()), "loading the plan copy kernel");
}

}  // namespace

Result<std::unique_ptr<RunCopier>> RunCopier::Create(int device,
                                                     std::optional<kernels::CopyPath> forced) {
  DeviceGuard guard(device);
  KV_ASSIGN_OR_RETURN(auto kernel, kernels::PlanCopier::Create());
  KV_RETURN_IF_ERROR(LoadCopyKernel(device, *kernel));
  Lanes lanes;
  KV_ASSIGN_OR_RETURN(lanes.fork, CudaEvent::Create(device));
  for (int i = 0; i < kEngineLanes; ++i) {
    KV_ASSIGN_OR_RETURN(CudaStream lane, CudaStream::Create(device));
    KV_ASSIGN_OR_RETURN(CudaEvent join, CudaEvent::Create(device));
    lanes.streams.push_back(std::move(lane));
    lanes.joins.push_back(std::move(join));
  }
  return std::unique_ptr<RunCopier>(new RunCopier(std::move(kernel), std::move(lanes), forced));
}

Status RunCopier::Copy(const void* src_base, void* dst_base, std::span<const Run> runs,
                       kernels::CopyDirection direction, cudaStream_t stream) {
  if (runs.empty()) return Status::Ok();
  last_path_ = forced_ ? *forced_ : kernels::ChooseCopyPath(runs, direction, stream);
  if (last_path_ == kernels::CopyPath::kKernel) {
    return kernel_->Copy(src_base, dst_base, runs, stream);
  }
  if (direction == kernels::CopyDirection::kPeer && stream != nullptr) {
    return CopyOnLanes(src_base, dst_base, runs, stream);
  }
  return kernels::LaunchBatchCopy(src_base, dst_base, runs, stream);
}

kernels::CopyPath RunCopier::ChoosePath(uint64_t bytes, uint64_t rows,
                                        kernels::CopyDirection direction, cudaStream_t stream) {
  // The chooser looks at the mean run only: one row of the mean length stands for all of them.
  const Run mean{0, 0, bytes / std::max<uint64_t>(rows, 1)};
  last_path_ = forced_ ? *forced_
                       : kernels::ChooseCopyPath(std::span<const Run>(&mean, 1), direction, stream);
  return last_path_;
}

Status RunCopier::CopyGroups(const void* src_base, void* dst_base, std::span<const RunGroup> groups,
                             kernels::CopyDirection direction, cudaStream_t stream) {
  if (groups.empty()) return Status::Ok();
  uint64_t bytes = 0, rows = 0;
  for (const RunGroup& g : groups) {
    bytes += g.length * g.count;
    rows += g.count;
  }
  if (ChoosePath(bytes, rows, direction, stream) == kernels::CopyPath::kKernel) {
    return kernel_->CopyGroups(src_base, dst_base, groups, stream);
  }
  rows_.clear();
  ExpandGroups(groups, &rows_);
  return Copy(src_base, dst_base, rows_, direction, stream);
}

Status RunCopier::CopyBlocks(const void* src_base, void* dst_base,
                             std::span<const GroupBlocks> entries, kernels::CopyDirection direction,
                             cudaStream_t stream) {
  if (entries.empty()) return Status::Ok();
  uint64_t bytes = 0, rows = 0;
  for (const GroupBlocks& e : entries) {
    bytes += e.group.length * e.group.count * e.outer_count;
    rows += e.group.count * e.outer_count;
  }
  if (ChoosePath(bytes, rows, direction, stream) == kernels::CopyPath::kKernel) {
    return kernel_->CopyBlocks(src_base, dst_base, entries, stream);
  }
  groups_.clear();
  ExpandBlocks(entries, &groups_);
  rows_.clear();
  ExpandGroups(groups_, &rows_);
  return Copy(src_base, dst_base, rows_, direction, stream);
}

// Runs are handed to the copy engines in pieces of at most kEnginePieceBytes: one large run in one
// cudaMemcpyBatchAsync entry moves at a fraction of the link (benchmarks/pd_gpu.md). A copy of
// kLanesFromBytes or more is also split over the lanes, lane i taking the i-th quarter. The events
// are reused by every copy: cudaStreamWaitEvent binds to the record made before it, so a later
// copy's records do not disturb an earlier copy's waits.
Status RunCopier::CopyOnLanes(const void* src_base, void* dst_base, std::span<const Run> runs,
                              cudaStream_t stream) {
  uint64_t total = 0;
  for (const Run& run : runs) total += run.length;
  const int lanes = total >= kLanesFromBytes ? kEngineLanes : 1;
  size_t at = 0;
  uint64_t consumed = 0;  // of runs[at]
  // Cuts the next `want` bytes of the runs into lane_runs_.
  auto cut = [&](uint64_t want) {
    lane_runs_.clear();
    while (want > 0 && at < runs.size()) {
      const Run& run = runs[at];
      const uint64_t take = std::min({want, run.length - consumed, kEnginePieceBytes});
      lane_runs_.push_back({run.src_offset + consumed, run.dst_offset + consumed, take});
      want -= take;
      consumed += take;
      if (consumed == run.length) {
        ++at;
        consumed = 0;
      }
    }
  };
  if (lanes == 1) {
    cut(total);
    return kernels::LaunchBatchCopy(src_base, dst_base, lane_runs_, stream);
  }
  KV_RETURN_IF_ERROR(lanes_.fork.Record(stream));
  for (int lane = 0; lane < lanes && at < runs.size(); ++lane) {
    // `total` is what is left: an equal share of it for each lane still to go, the last one
    // taking the rest.
    const uint64_t want = total / static_cast<uint64_t>(lanes - lane);
    total -= want;
    cut(want);
    if (lane_runs_.empty()) break;
    cudaStream_t s = lanes_.streams[lane].get();
    KV_RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(s, lanes_.fork.get(), 0), "cudaStreamWaitEvent"));
    KV_RETURN_IF_ERROR(kernels::LaunchBatchCopy(src_base, dst_base, lane_runs_, s));
    KV_RETURN_IF_ERROR(lanes_.joins[lane].Record(s));
    KV_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(stream, lanes_.joins[lane].get(), 0),
                                  "cudaStreamWaitEvent"));
  }
  return Status::Ok();
}

}  // namespace kv::gpu
