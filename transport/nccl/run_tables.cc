#include "transport/nccl/run_tables.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "kernels/plan_copy.h"
#include "transport/nccl/chunk_tables.h"

namespace kv::transport::nccl {

using gpu::CudaStatus;

struct RunTables::Buffer {
  void* host = nullptr;  // pinned: the upload is asynchronous
  gpu::DeviceBuffer device;
  uint64_t capacity = 0;
  gpu::CudaEvent released;
  bool armed = false;   // released has been recorded
  bool loaded = false;  // Load filled it and Release has not been called yet
  TableLayout layout;   // of the batch it holds

  ~Buffer() {
    if (armed) cudaEventSynchronize(released.get());
    if (host != nullptr) cudaFreeHost(host);
  }
};

RunTables::RunTables(int device, int copy_ctas, const std::atomic<bool>& cancelled)
    : device_(device), copy_ctas_(copy_ctas), cancelled_(cancelled) {}

RunTables::~RunTables() = default;

Result<std::unique_ptr<RunTables>> RunTables::Create(int device, int copy_ctas,
                                                     const std::atomic<bool>& cancelled) {
  if (copy_ctas <= 0) {
    KV_RETURN_IF_ERROR(CudaStatus(
        cudaDeviceGetAttribute(&copy_ctas, cudaDevAttrMultiProcessorCount, device), "SM count"));
  }
  std::unique_ptr<RunTables> tables(new RunTables(device, copy_ctas, cancelled));
  for (auto& buffer : tables->buffers_) {
    buffer = std::make_unique<Buffer>();
    KV_ASSIGN_OR_RETURN(buffer->released, gpu::CudaEvent::Create(device));
  }
  return tables;
}

Status LoadCopyKernel(int device) {
  gpu::DeviceGuard guard(device);
  const std::atomic<bool> never{false};
  KV_ASSIGN_OR_RETURN(auto tables, RunTables::Create(device, 1, never));
  KV_ASSIGN_OR_RETURN(gpu::DeviceBuffer scratch, gpu::DeviceBuffer::Allocate(device, 64));
  KV_ASSIGN_OR_RETURN(gpu::CudaStream stream, gpu::CudaStream::Create(device));
  const Range one{0, 16};
  const Strided rows{32, 16, 1, 16};
  const Chunks chunks = ChunkRuns(std::span<const Range>(&one, 1), 16, Direction::kGather);
  const GroupChunks groups =
      ChunkGroups(std::span<const Strided>(&rows, 1), 16, Direction::kGather);
  const auto forever = SteadyTime::max();
  KV_ASSIGN_OR_RETURN(const int table, tables->Load(chunks, groups, stream.get(), forever));
  char* base = static_cast<char*>(scratch.data());
  for (size_t k = 0; k < tables->count(table); ++k) {  // the run kernel, then the group kernel
    KV_RETURN_IF_ERROR(tables->Copy(table, k, base, base + 48, stream.get()));
  }
  KV_RETURN_IF_ERROR(tables->Release(table, stream.get()));
  return CudaStatus(cudaStreamSynchronize(stream.get()), "loading the copy kernels");
}

Result<int> RunTables::Load(const Chunks& chunks, const GroupChunks& groups, cudaStream_t stream,
                            SteadyTime deadline) {
  current_ = (current_ + 1) % kTableBuffers;
  if (buffers_[current_]->loaded) {
    return Status::Internal("nccl: more than " + std::to_string(kTableBuffers) +
                            " run tables in use");
  }
  Buffer& used = *buffers_[current_];
  while (used.armed) {
    KV_ASSIGN_OR_RETURN(bool done, used.released.Query());
    if (done) break;
    if (cancelled_) return Status::Aborted("nccl: link failed");
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout("nccl: copies of an earlier batch did not finish");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  used.armed = false;
  // Laid out in the scratch layout, then swapped with the buffer's: no allocation per batch once
  // its vectors have grown.
  LayOutTables(chunks, groups, &scratch_);
  const uint64_t bytes = scratch_.table_bytes;
  if (bytes > buffers_[current_]->capacity) {
    gpu::DeviceGuard guard(device_);
    auto grown = std::make_unique<Buffer>();
    KV_ASSIGN_OR_RETURN(grown->released, gpu::CudaEvent::Create(device_));
    const uint64_t want = std::max<uint64_t>(bytes * 2, 64 << 10);
    KV_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&grown->host, want), "run table staging"));
    KV_ASSIGN_OR_RETURN(grown->device, gpu::DeviceBuffer::Allocate(device_, want));
    grown->capacity = want;
    outgrown_.push_back(std::exchange(buffers_[current_], std::move(grown)));
  }
  Buffer& b = *buffers_[current_];
  std::swap(b.layout, scratch_);
  KV_RETURN_IF_ERROR(EncodeTables(chunks, groups, b.layout, b.host));
  b.loaded = true;
  if (bytes > 0) {
    KV_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(b.device.data(), b.host, bytes, cudaMemcpyHostToDevice, stream),
                   "run table upload"));
  }
  return current_;
}

size_t RunTables::count(int table) const {
  return buffers_[table]->layout.chunks();
}

uint64_t RunTables::bytes(int table, size_t k) const {
  return buffers_[table]->layout.bytes[k];
}

Status RunTables::Copy(int table, size_t k, const void* src_base, void* dst_base,
                       cudaStream_t stream) const {
  const TableLayout& t = buffers_[table]->layout;
  kernels::PlanCopyOptions options;
  options.max_ctas = copy_ctas_;
  const char* device = static_cast<const char*>(buffers_[table]->device.data());
  if (k >= t.runs) {
    const auto* table_start =
        reinterpret_cast<const kernels::PlanCopyBlockChunk*>(device + t.group_table) + t.first[k];
    return kernels::LaunchPlanCopyBlocks(src_base, dst_base, table_start, t.count[k], options,
                                         stream);
  }
  const auto* table_start = reinterpret_cast<const kernels::PlanCopyChunk*>(device) + t.first[k];
  return kernels::LaunchPlanCopy(src_base, dst_base, table_start, 0, t.count[k], options, stream);
}

Status RunTables::Release(int table, cudaStream_t stream) {
  Buffer& b = *buffers_[table];
  b.loaded = false;
  KV_RETURN_IF_ERROR(b.released.Record(stream));
  b.armed = true;
  return Status::Ok();
}

}  // namespace kv::transport::nccl
