// kvbench offload, the GPU half: engine pages in device memory, ceilings by cudaMemcpyAsync, and
// stores beside a compute-bound kernel. Kept free of spdlog/fmt: nvcc cannot compile them.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include "daemon/offload/offload_pool.h"
#include "tools/kvbench/offload_bench.h"

namespace kv::bench {
namespace {

using Clock = std::chrono::steady_clock;

Status CudaFailed(const char* what, cudaError_t err) {
  cudaGetLastError();
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(err));
}

#define KV_CUDA_OK(what, call)                                    \
  do {                                                            \
    cudaError_t kv_err_ = (call);                                 \
    if (kv_err_ != cudaSuccess) return CudaFailed(what, kv_err_); \
  } while (0)

// Owners of the benchmark's CUDA resources; each frees what it holds.
struct DeviceMemory {
  void* ptr = nullptr;
  ~DeviceMemory() { cudaFree(ptr); }
};
struct PinnedMemory {
  void* ptr = nullptr;
  ~PinnedMemory() { cudaFreeHost(ptr); }
};
struct StreamHandle {
  cudaStream_t s = nullptr;
  ~StreamHandle() { cudaStreamDestroy(s); }
};
struct EventHandle {
  cudaEvent_t e = nullptr;
  ~EventHandle() { cudaEventDestroy(e); }
};

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Wall seconds of one cudaMemcpyAsync on `stream`, synchronised.
Result<double> OneCopySeconds(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  auto start = Clock::now();
  KV_CUDA_OK("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, kind, stream));
  KV_CUDA_OK("sync", cudaStreamSynchronize(stream));
  return Seconds(start);
}

Result<void*> DeviceAlloc(uint64_t bytes) {
  KV_CUDA_OK("cudaSetDevice", cudaSetDevice(0));
  void* ptr = nullptr;
  KV_CUDA_OK("cudaMalloc", cudaMalloc(&ptr, bytes));
  cudaError_t err = cudaMemset(ptr, 1, bytes);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    cudaFree(ptr);
    return CudaFailed("cudaMemset", err);
  }
  return ptr;
}

void DeviceFree(void* ptr) {
  cudaFree(ptr);
}

Result<double> PinnedCopySeconds(uint64_t bytes, bool to_host, int iters) {
  KV_CUDA_OK("cudaSetDevice", cudaSetDevice(0));
  DeviceMemory dev;
  PinnedMemory host;
  StreamHandle stream;
  KV_CUDA_OK("cudaMalloc", cudaMalloc(&dev.ptr, bytes));
  KV_CUDA_OK("cudaHostAlloc", cudaHostAlloc(&host.ptr, bytes, cudaHostAllocDefault));
  KV_CUDA_OK("stream", cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  std::vector<double> t;
  for (int it = 0; it <= iters; ++it) {
    KV_ASSIGN_OR_RETURN(
        double s, to_host
                      ? OneCopySeconds(host.ptr, dev.ptr, bytes, cudaMemcpyDeviceToHost, stream.s)
                      : OneCopySeconds(dev.ptr, host.ptr, bytes, cudaMemcpyHostToDevice, stream.s));
    if (it > 0) t.push_back(s);
  }
  return Median(t);
}

const GpuMemoryOps kGpuMemoryOps = {&DeviceAlloc, &DeviceFree, &PinnedCopySeconds};

// Stands in for a model's kernels: every SM busy with dependent FMAs, no memory traffic.
__global__ void BusyKernel(float* out, int iters) {
  float x = static_cast<float>(threadIdx.x);
  for (int i = 0; i < iters; ++i) x = fmaf(x, 0.9999999f, 0.5f);
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

// A model's forward pass in miniature: many short kernels back to back, each filling every SM,
// so copy kernels compete for SMs between them as they would beside a real model.
struct Busy {
  int blocks = 0;
  int iters = 1 << 12;
  int launches = 1;
  float* out = nullptr;

  Status Launch(cudaStream_t stream) {
    for (int i = 0; i < launches; ++i) BusyKernel<<<blocks, 256, 0, stream>>>(out, iters);
    KV_CUDA_OK("busy kernel launch", cudaGetLastError());
    return Status::Ok();
  }
};

Result<double> TimeKernelMs(Busy& busy, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) {
  KV_CUDA_OK("event", cudaEventRecord(start, stream));
  KV_RETURN_IF_ERROR(busy.Launch(stream));
  KV_CUDA_OK("event", cudaEventRecord(stop, stream));
  KV_CUDA_OK("sync", cudaEventSynchronize(stop));
  float ms = 0;
  KV_CUDA_OK("elapsed", cudaEventElapsedTime(&ms, start, stop));
  return static_cast<double>(ms);
}

// The busy kernel alone, then beside back-to-back stores of `batch` fresh blocks.
Result<BusyRow> MeasureBusy(const OffloadBenchConfig& config, const KvRegion& engine,
                            std::byte* base, int sms) {
  BusyRow row;
  row.order = engine.spec().order;
  Busy busy;
  busy.blocks = sms * 8;  // 8 CTAs of 256 threads: every SM full
  DeviceMemory out;
  KV_CUDA_OK("cudaMalloc", cudaMalloc(&out.ptr, sizeof(float) * busy.blocks * 256));
  busy.out = static_cast<float*>(out.ptr);
  StreamHandle compute;
  EventHandle start, stop;
  KV_CUDA_OK("stream", cudaStreamCreateWithFlags(&compute.s, cudaStreamNonBlocking));
  KV_CUDA_OK("event", cudaEventCreate(&start.e));
  KV_CUDA_OK("event", cudaEventCreate(&stop.e));
  // Calibrate one launch to about 0.2 ms, then 1000 of them: about 200 ms, long enough for
  // several stores to overlap it.
  busy.launches = 10;
  KV_ASSIGN_OR_RETURN(double probe_ms, TimeKernelMs(busy, compute.s, start.e, stop.e));
  const double per_launch_ms = std::max(probe_ms / busy.launches, 0.001);
  busy.iters = static_cast<int>(busy.iters * std::min(1024.0, 0.2 / per_launch_ms));
  busy.launches = 1000;
  std::vector<double> alone;
  for (int i = 0; i < 3; ++i) {
    KV_ASSIGN_OR_RETURN(double ms, TimeKernelMs(busy, compute.s, start.e, stop.e));
    alone.push_back(ms);
  }
  row.alone_ms = Median(alone);

  offload::PoolOptions options;
  options.slot_layout = engine.spec();
  options.capacity_bytes = 2 * config.batch * static_cast<uint64_t>(engine.size(Axis::kL)) *
                           engine.size(Axis::kH) * engine.size(Axis::kN) *
                           engine.logical_content_bytes();
  KV_ASSIGN_OR_RETURN(options.gpu.how, offload::ParseDeviceCopy(config.device_copy));
  options.gpu.dma_slice_runs = config.dma_slice_runs;
  KV_ASSIGN_OR_RETURN(auto pool, offload::OffloadPool::Create(options));
  KV_CUDA_OK("event", cudaEventRecord(start.e, compute.s));
  KV_RETURN_IF_ERROR(busy.Launch(compute.s));
  KV_CUDA_OK("event", cudaEventRecord(stop.e, compute.s));
  uint64_t bytes = 0;
  auto began = Clock::now();
  for (uint64_t round = 1; cudaEventQuery(stop.e) == cudaErrorNotReady; ++round) {
    std::vector<offload::BlockKey> keys;
    for (int64_t i = 0; i < config.batch; ++i) {
      keys.push_back(offload::BlockKey::FromUint64((round << 40) + i));
    }
    auto blocks = PickBlocks(config.batch, engine.size(Axis::kB), config.scattered,
                             static_cast<uint32_t>(round));
    std::promise<Status> done;
    auto ticket = pool->Store({&engine, base, keys, blocks, nullptr, MemoryLocation::Cuda(0)},
                              [&](Status s) { done.set_value(std::move(s)); });
    if (!ticket.ok()) return ticket.status();
    auto f = done.get_future();
    if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      return Status::Timeout("store beside the busy kernel did not finish within 60 s");
    }
    KV_RETURN_IF_ERROR(f.get());
    bytes += ticket->bytes;
  }
  const double store_s = Seconds(began);
  KV_CUDA_OK("sync", cudaEventSynchronize(stop.e));
  float ms = 0;
  KV_CUDA_OK("elapsed", cudaEventElapsedTime(&ms, start.e, stop.e));
  row.beside_store_ms = ms;
  row.store_gbps = GbPerSecond(bytes, store_s);
  return row;
}

Status RunOrder(const OffloadBenchConfig& config, const std::string& order, int sms,
                OffloadReport* report) {
  KV_ASSIGN_OR_RETURN(KvRegion engine, KvRegion::Create(config.Spec(order, config.engine_blocks)));
  DeviceMemory cache;
  KV_CUDA_OK("cudaMalloc of the engine cache", cudaMalloc(&cache.ptr, engine.span_bytes()));
  KV_CUDA_OK("cudaMemset", cudaMemset(cache.ptr, 1, engine.span_bytes()));
  std::byte* base = static_cast<std::byte*>(cache.ptr);

  Progress(order + ": pool store/load of " + std::to_string(config.batch) + " blocks");
  KV_ASSIGN_OR_RETURN(PoolTiming pool, TimePool(config, engine, base, MemoryLocation::Cuda(0)));

  Progress(order + ": references (one pinned cudaMemcpyAsync; one per page)");
  PinnedMemory flat;
  KV_CUDA_OK("cudaHostAlloc", cudaHostAlloc(&flat.ptr, pool.bytes, cudaHostAllocDefault));
  StreamHandle stream;
  KV_CUDA_OK("stream", cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  const int64_t page_layers = engine.blocks_first() ? 1 : engine.size(Axis::kL);
  const uint64_t page = engine.page_bytes();
  auto blocks = PickBlocks(config.batch, config.engine_blocks, config.scattered, 1);
  auto* host = static_cast<std::byte*>(flat.ptr);
  std::vector<double> one[2], per_page[2];
  for (int it = 0; it <= config.iters; ++it) {
    for (int dir = 0; dir < 2; ++dir) {  // 0: device -> pinned host (store), 1: back (load)
      const cudaMemcpyKind kind = dir == 0 ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
      KV_ASSIGN_OR_RETURN(const double one_s,
                          dir == 0 ? OneCopySeconds(host, base, pool.bytes, kind, stream.s)
                                   : OneCopySeconds(base, host, pool.bytes, kind, stream.s));
      auto start = Clock::now();
      uint64_t at = 0;
      for (int64_t b : blocks) {
        for (int64_t l = 0; l < page_layers; ++l, at += page) {
          std::byte* dev = base + engine.page_offset(l, b);
          KV_CUDA_OK("cudaMemcpyAsync",
                     dir == 0 ? cudaMemcpyAsync(host + at, dev, page, kind, stream.s)
                              : cudaMemcpyAsync(dev, host + at, page, kind, stream.s));
        }
      }
      KV_CUDA_OK("sync", cudaStreamSynchronize(stream.s));
      if (it == 0) continue;
      one[dir].push_back(one_s);
      per_page[dir].push_back(Seconds(start));
    }
  }
  const uint64_t pages = static_cast<uint64_t>(config.batch * page_layers);
  report->rows.push_back({order, "store", pool.bytes, pages, pool.store_runs,
                          GbPerSecond(pool.bytes, pool.store_seconds),
                          GbPerSecond(pool.bytes, Median(one[0])),
                          GbPerSecond(pool.bytes, Median(per_page[0]))});
  report->rows.push_back(
      {order, "load", pool.bytes, pages, pool.load_runs, GbPerSecond(pool.bytes, pool.load_seconds),
       GbPerSecond(pool.bytes, Median(one[1])), GbPerSecond(pool.bytes, Median(per_page[1]))});
  if (config.busy) {
    Progress(order + ": stores beside a compute-bound kernel");
    KV_ASSIGN_OR_RETURN(BusyRow busy, MeasureBusy(config, engine, base, sms));
    report->busy.push_back(busy);
  }
  return Status::Ok();
}

Status RunGpu(const OffloadBenchConfig& config, OffloadReport* report) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::Unavailable("no CUDA device");
  }
  KV_CUDA_OK("cudaSetDevice", cudaSetDevice(0));
  cudaDeviceProp prop{};
  KV_CUDA_OK("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, 0));
  report->machine = std::string(prop.name) + " (cuda:0)";
  report->path = (config.device_copy == "auto"
                      ? std::string("the pool's choice (cudaMemcpyBatchAsync for runs of 16 KiB "
                                    "and up on average, else the plan-copy kernel)")
                      : "--copy-path " + config.device_copy) +
                 ", copy-engine batches of " + std::to_string(config.dma_slice_runs) + " runs";
  report->ceiling = "one pinned cudaMemcpyAsync";
  for (const auto& order : config.orders) {
    KV_RETURN_IF_ERROR(RunOrder(config, order, prop.multiProcessorCount, report));
  }
  return Status::Ok();
}

[[maybe_unused]] const bool registered =
    (GpuOffloadBenchSlot() = &RunGpu, GpuMemoryOpsSlot() = &kGpuMemoryOps, true);

}  // namespace
}  // namespace kv::bench
