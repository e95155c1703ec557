// The plan copy kernel, its run-table owner and the copy-engine path. Contract: plan_copy.h.
#include <algorithm>
#include <vector>

#include "kernels/cuda_util.cuh"
#include "kernels/plan_copy.h"

namespace kv::kernels {
namespace {

constexpr int kCopyThreads = 1024;

// Warp w takes chunks w, w + warps, ...; each chunk names its run, so a one-byte run and a
// megabyte run cost in proportion to their size and consecutive warps copy consecutive bytes.
__global__ void __launch_bounds__(kCopyThreads)
    PlanCopyKernel(const unsigned char* src, unsigned char* dst, const Run* runs,
                   const uint64_t* first_chunk, const uint32_t* chunk_run, uint64_t num_chunks) {
  const int lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  for (uint64_t chunk = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) / 32;
       chunk < num_chunks; chunk += warps) {
    const uint32_t r = chunk_run[chunk];
    const Run run = runs[r];
    const uint64_t begin = (chunk - first_chunk[r]) * kPlanCopyChunkBytes;
    const uint64_t length = min(kPlanCopyChunkBytes, run.length - begin);
    detail::WarpCopy(src + run.src_offset + begin, dst + run.dst_offset + begin, length, lane);
  }
}

}  // namespace

Status LaunchPlanCopy(const void* src_base, void* dst_base, const void* device_table,
                      size_t num_runs, uint64_t num_chunks, const PlanCopyOptions& options,
                      void* stream) {
  if (num_runs == 0 || num_chunks == 0) return Status::Ok();
  int max_ctas = options.max_ctas;
  if (max_ctas <= 0) {
    KV_ASSIGN_OR_RETURN(max_ctas, detail::SmCount());
  }
  const uint64_t warps_needed = num_chunks;
  const uint64_t ctas_needed = (warps_needed + kCopyThreads / 32 - 1) / (kCopyThreads / 32);
  const int ctas = static_cast<int>(std::min<uint64_t>(max_ctas, ctas_needed));
  const auto* runs = static_cast<const Run*>(device_table);
  const auto* first_chunk = reinterpret_cast<const uint64_t*>(runs + num_runs);
  const auto* chunk_run = reinterpret_cast<const uint32_t*>(first_chunk + num_runs + 1);
  PlanCopyKernel<<<ctas, kCopyThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const unsigned char*>(src_base), static_cast<unsigned char*>(dst_base), runs,
      first_chunk, chunk_run, num_chunks);
  return detail::LaunchStatus("plan copy kernel");
}

// ---- PlanCopier ------------------------------------------------------------------------------

struct PlanCopier::Impl {
  PlanCopyOptions options;
  void* device_table = nullptr;
  void* staging = nullptr;  // pinned
  uint64_t capacity = 0;
  cudaEvent_t table_uploaded = nullptr;  // staging may be rewritten once this fires
  cudaEvent_t kernel_done = nullptr;     // the device table may be rewritten once this fires

  ~Impl() {
    // Nothing may still read the buffers we free.
    if (kernel_done) cudaEventSynchronize(kernel_done);
    if (device_table) cudaFree(device_table);
    if (staging) cudaFreeHost(staging);
    if (table_uploaded) cudaEventDestroy(table_uploaded);
    if (kernel_done) cudaEventDestroy(kernel_done);
  }

  Status Reserve(uint64_t bytes) {
    if (bytes <= capacity) {
      return detail::CudaStatus(cudaEventSynchronize(table_uploaded), "wait for table upload");
    }
    KV_RETURN_IF_ERROR(detail::CudaStatus(cudaEventSynchronize(kernel_done), "wait for copy"));
    if (device_table) cudaFree(std::exchange(device_table, nullptr));
    if (staging) cudaFreeHost(std::exchange(staging, nullptr));
    capacity = 0;
    const uint64_t want = std::max<uint64_t>(bytes * 2, 64 << 10);
    KV_RETURN_IF_ERROR(detail::CudaStatus(cudaMalloc(&device_table, want), "run table"));
    KV_RETURN_IF_ERROR(detail::CudaStatus(cudaMallocHost(&staging, want), "run table staging"));
    capacity = want;
    return Status::Ok();
  }
};

PlanCopier::PlanCopier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlanCopier::~PlanCopier() = default;

Result<std::unique_ptr<PlanCopier>> PlanCopier::Create(const PlanCopyOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  KV_RETURN_IF_ERROR(detail::CudaStatus(
      cudaEventCreateWithFlags(&impl->table_uploaded, cudaEventDisableTiming), "event"));
  KV_RETURN_IF_ERROR(detail::CudaStatus(
      cudaEventCreateWithFlags(&impl->kernel_done, cudaEventDisableTiming), "event"));
  KV_RETURN_IF_ERROR(impl->Reserve(64 << 10));
  return std::unique_ptr<PlanCopier>(new PlanCopier(std::move(impl)));
}

Status PlanCopier::Copy(const void* src_base, void* dst_base, std::span<const Run> runs,
                        void* stream) {
  if (runs.empty()) return Status::Ok();
  Impl& m = *impl_;
  const uint64_t bytes = PlanCopyTableBytes(runs.size(), PlanCopyChunks(runs));
  KV_RETURN_IF_ERROR(m.Reserve(bytes));
  KV_ASSIGN_OR_RETURN(const uint64_t chunks, EncodePlanCopyTable(runs, m.staging, m.capacity));
  auto s = static_cast<cudaStream_t>(stream);
  KV_RETURN_IF_ERROR(detail::CudaStatus(cudaStreamWaitEvent(s, m.kernel_done, 0), "order"));
  KV_RETURN_IF_ERROR(detail::CudaStatus(
      cudaMemcpyAsync(m.device_table, m.staging, bytes, cudaMemcpyHostToDevice, s),
      "run table upload"));
  KV_RETURN_IF_ERROR(detail::CudaStatus(cudaEventRecord(m.table_uploaded, s), "record"));
  KV_RETURN_IF_ERROR(
      LaunchPlanCopy(src_base, dst_base, m.device_table, runs.size(), chunks, m.options, stream));
  return detail::CudaStatus(cudaEventRecord(m.kernel_done, s), "record");
}

// ---- The copy engine -------------------------------------------------------------------------

Status LaunchBatchCopy(const void* src_base, void* dst_base, std::span<const Run> runs,
                       void* stream) {
  if (stream == nullptr) {
    return Status::InvalidArgument("cudaMemcpyBatchAsync does not take the legacy default stream");
  }
  const auto* src = static_cast<const unsigned char*>(src_base);
  auto* dst = static_cast<unsigned char*>(dst_base);
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  dsts.reserve(std::min(runs.size(), kMaxBatchRuns));
  srcs.reserve(dsts.capacity());
  sizes.reserve(dsts.capacity());
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attribute_index = 0;
  for (size_t at = 0; at < runs.size();) {
    dsts.clear();
    srcs.clear();
    sizes.clear();
    for (; at < runs.size() && dsts.size() < kMaxBatchRuns; ++at) {
      if (runs[at].length == 0) continue;
      dsts.push_back(dst + runs[at].dst_offset);
      srcs.push_back(src + runs[at].src_offset);
      sizes.push_back(runs[at].length);
    }
    if (dsts.empty()) break;
    KV_RETURN_IF_ERROR(detail::CudaStatus(
        cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attributes,
                             &attribute_index, 1, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyBatchAsync"));
  }
  return Status::Ok();
}

}  // namespace kv::kernels
