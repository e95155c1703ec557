// The GPU transfer ceilings. Contract: gpu_ceiling.h.
#include <cuda_runtime_api.h>
#if KV_HAVE_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/plan_copy.h"
#include "tools/kvbench/gpu_ceiling.h"

namespace kv::bench {
namespace {

using Clock = std::chrono::steady_clock;

Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(e));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Two warm-ups, then `iters` timed runs of `once`; the median in seconds.
template <typename F>
Result<double> Time(int iters, F once) {
  std::vector<double> times;
  for (int i = 0; i < iters + 2; ++i) {
    const auto t0 = Clock::now();
    KV_RETURN_IF_ERROR(once());
    if (i >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return Median(times);
}

class DeviceBuffer {
 public:
  ~DeviceBuffer() {
    if (p_ != nullptr) {
      cudaSetDevice(device_);
      cudaFree(p_);
    }
  }
  Status Allocate(int device, uint64_t bytes) {
    device_ = device;
    KV_RETURN_IF_ERROR(Cuda(cudaSetDevice(device), "cudaSetDevice"));
    return Cuda(cudaMalloc(&p_, bytes), "cudaMalloc");
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
  int device_ = 0;
};

class StreamOn {
 public:
  ~StreamOn() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  Status Create(int device) {
    KV_RETURN_IF_ERROR(Cuda(cudaSetDevice(device), "cudaSetDevice"));
    return Cuda(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream");
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

#if KV_HAVE_NCCL
Status Nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return Status::Internal(std::string(what) + ": " + ncclGetErrorString(r));
}

Result<double> NcclSeconds(int src, int dst, const DeviceBuffer& from, const DeviceBuffer& to,
                           uint64_t bytes, int iters) {
  // NCCL_NVLS_ENABLE=0 comes from kvbench's main(): NVLink multicast is not allowed on shared
  // machines.
  ncclComm_t comms[2];
  int devices[2] = {src, dst};
  KV_RETURN_IF_ERROR(Nccl(ncclCommInitAll(comms, 2, devices), "ncclCommInitAll"));
  struct Comms {
    ncclComm_t* c;
    ~Comms() {
      ncclCommDestroy(c[0]);
      ncclCommDestroy(c[1]);
    }
  } guard{comms};
  StreamOn send, recv;
  KV_RETURN_IF_ERROR(send.Create(src));
  KV_RETURN_IF_ERROR(recv.Create(dst));
  return Time(iters, [&]() -> Status {
    ncclGroupStart();
    ncclSend(from.get(), bytes, ncclUint8, 1, comms[0], send.get());
    ncclRecv(to.get(), bytes, ncclUint8, 0, comms[1], recv.get());
    KV_RETURN_IF_ERROR(Nccl(ncclGroupEnd(), "ncclSend/ncclRecv"));
    KV_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(send.get()), "sync"));
    return Cuda(cudaStreamSynchronize(recv.get()), "sync");
  });
}
#endif

// The plan copy kernel over random 64 KiB pages, src → dst, on `stream` (a stream of src).
Result<double> PageKernelSeconds(int src, const DeviceBuffer& from, const DeviceBuffer& to,
                                 uint64_t bytes, int iters, cudaStream_t stream) {
  constexpr uint64_t kPage = 64 << 10;
  const uint64_t pages = bytes / kPage;
  if (pages == 0) return 0.0;
  std::vector<uint64_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(1));
  std::vector<Run> runs(pages);
  for (uint64_t i = 0; i < pages; ++i) runs[i] = {order[i] * kPage, i * kPage, kPage};
  std::shuffle(runs.begin(), runs.end(), std::mt19937(2));
  const uint64_t chunks = kernels::PlanCopyChunks(runs);
  const uint64_t table_bytes = kernels::PlanCopyTableBytes(runs.size(), chunks);
  std::vector<unsigned char> host(table_bytes);
  KV_RETURN_IF_ERROR(kernels::EncodePlanCopyTable(runs, host.data(), table_bytes).status());
  DeviceBuffer table;
  KV_RETURN_IF_ERROR(table.Allocate(src, table_bytes));
  KV_RETURN_IF_ERROR(Cuda(cudaMemcpy(table.get(), host.data(), table_bytes, cudaMemcpyHostToDevice),
                          "uploading the page table"));
  return Time(iters, [&]() -> Status {
    KV_RETURN_IF_ERROR(kernels::LaunchPlanCopy(from.get(), to.get(), table.get(), runs.size(),
                                               chunks, {}, stream));
    return Cuda(cudaStreamSynchronize(stream), "sync");
  });
}

Result<GpuCeilings> Measure(int src, int dst, uint64_t bytes, int iters) {
  DeviceBuffer to, from;
  KV_RETURN_IF_ERROR(to.Allocate(dst, bytes));
  KV_RETURN_IF_ERROR(from.Allocate(src, bytes));
  if (src != dst) {
    cudaDeviceEnablePeerAccess(dst, 0);  // already enabled is fine
    (void)cudaGetLastError();
  }
  StreamOn stream;
  KV_RETURN_IF_ERROR(stream.Create(src));
  GpuCeilings c;
  KV_ASSIGN_OR_RETURN(c.peer_seconds, Time(iters, [&]() -> Status {
                        KV_RETURN_IF_ERROR(Cuda(cudaMemcpyPeerAsync(to.get(), dst, from.get(), src,
                                                                    bytes, stream.get()),
                                                "cudaMemcpyPeerAsync"));
                        return Cuda(cudaStreamSynchronize(stream.get()), "sync");
                      }));
  KV_ASSIGN_OR_RETURN(c.page_kernel_seconds,
                      PageKernelSeconds(src, from, to, bytes, iters, stream.get()));
#if KV_HAVE_NCCL
  if (src != dst) {  // NCCL refuses a communicator with one GPU twice
    KV_ASSIGN_OR_RETURN(c.nccl_seconds, NcclSeconds(src, dst, from, to, bytes, iters));
  }
#endif
  return c;
}

[[maybe_unused]] const bool registered = (GpuCeilingSlot() = &Measure, true);

}  // namespace
}  // namespace kv::bench
