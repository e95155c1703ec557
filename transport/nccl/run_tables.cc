#include "transport/nccl/run_tables.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "kernels/plan_copy.h"

namespace kv::transport::nccl {

using gpu::CudaStatus;

struct RunTables::Buffer {
  void* host = nullptr;  // pinned: the upload is asynchronous
  gpu::DeviceBuffer device;
  uint64_t capacity = 0;
  gpu::CudaEvent released;
  bool armed = false;   // released has been recorded
  bool loaded = false;  // Load filled it and Release has not been called yet
  // Per chunk of the table: its first descriptor (in its table), how many it has, its staging
  // bytes. Chunks from `runs` on are groups', whose table starts group_table bytes in.
  std::vector<uint64_t> first;
  std::vector<uint64_t> count;
  std::vector<uint64_t> bytes;
  size_t runs = 0;
  uint64_t group_table = 0;

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
  const size_t runs = chunks.count();
  const size_t total_chunks = chunks.count() + groups.count();
  // Filled in scratch vectors, then swapped with the buffer's: no allocation per batch once
  // they have grown.
  std::vector<uint64_t>& first = scratch_first_;
  std::vector<uint64_t>& count = scratch_count_;
  std::vector<uint64_t>& sizes = scratch_bytes_;
  first.resize(total_chunks);
  count.resize(total_chunks);
  sizes.resize(total_chunks);
  uint64_t run_descriptors = 0, group_descriptors = 0;
  for (size_t k = 0; k < chunks.count(); ++k) {
    first[k] = run_descriptors;
    count[k] = kernels::PlanCopyChunks(chunks.chunk(k));
    sizes[k] = chunks.bytes[k];
    run_descriptors += count[k];
  }
  for (size_t k = 0; k < groups.count(); ++k) {
    uint64_t n = 0;
    for (const RunGroup& g : groups.chunk(k)) n += kernels::PlanCopyGroupChunks(g);
    first[runs + k] = group_descriptors;
    count[runs + k] = n;
    sizes[runs + k] = groups.bytes[k];
    group_descriptors += n;
  }
  // The group table after the run table, 16-byte aligned as the kernels read it.
  const uint64_t group_table =
      (kernels::PlanCopyTableBytes(chunks.runs.size(), run_descriptors) + 15) & ~15ull;
  const uint64_t bytes = group_table + group_descriptors * sizeof(kernels::PlanCopyGroupChunk);
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
  b.first.swap(first);
  b.count.swap(count);
  b.bytes.swap(sizes);
  b.runs = runs;
  b.group_table = group_table;
  auto* host = static_cast<kernels::PlanCopyChunk*>(b.host);
  for (size_t k = 0; k < chunks.count(); ++k) {
    KV_RETURN_IF_ERROR(kernels::EncodePlanCopyTable(chunks.chunk(k), host + b.first[k],
                                                    b.count[k] * sizeof(kernels::PlanCopyChunk))
                           .status());
  }
  auto* group_host =
      reinterpret_cast<kernels::PlanCopyGroupChunk*>(static_cast<char*>(b.host) + group_table);
  for (size_t k = 0; k < groups.count(); ++k) {
    const size_t c = runs + k;
    KV_ASSIGN_OR_RETURN(
        kernels::PlanCopyPrefix encoded,
        kernels::EncodePlanCopyGroupPrefix(groups.chunk(k), b.count[c], group_host + b.first[c]));
    if (encoded.runs != groups.chunk(k).size()) {
      return Status::Internal("nccl: a chunk's groups did not fit their table");
    }
  }
  b.loaded = true;
  if (bytes > 0) {
    KV_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(b.device.data(), b.host, bytes, cudaMemcpyHostToDevice, stream),
                   "run table upload"));
  }
  return current_;
}

size_t RunTables::count(int table) const {
  return buffers_[table]->first.size();
}

uint64_t RunTables::bytes(int table, size_t k) const {
  return buffers_[table]->bytes[k];
}

Status RunTables::Copy(int table, size_t k, const void* src_base, void* dst_base,
                       cudaStream_t stream) const {
  const Buffer& b = *buffers_[table];
  kernels::PlanCopyOptions options;
  options.max_ctas = copy_ctas_;
  const char* device = static_cast<const char*>(b.device.data());
  if (k >= b.runs) {
    const auto* table_start =
        reinterpret_cast<const kernels::PlanCopyGroupChunk*>(device + b.group_table) + b.first[k];
    return kernels::LaunchPlanCopyGroups(src_base, dst_base, table_start, b.count[k], options,
                                         stream);
  }
  const auto* table_start = reinterpret_cast<const kernels::PlanCopyChunk*>(device) + b.first[k];
  return kernels::LaunchPlanCopy(src_base, dst_base, table_start, 0, b.count[k], options, stream);
}

Status RunTables::Release(int table, cudaStream_t stream) {
  Buffer& b = *buffers_[table];
  b.loaded = false;
  KV_RETURN_IF_ERROR(b.released.Record(stream));
  b.armed = true;
  return Status::Ok();
}

}  // namespace kv::transport::nccl
