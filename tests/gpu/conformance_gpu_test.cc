// The transport conformance suite (tests/transport/conformance_suite.h) over the GPU backends,
// device memory on both sides, each side a child process owning its device: cuda_ipc and nccl
// from GPU 0 to GPU 1, and "ucx" staging GPU memory through pinned host slots (two processes on
// GPU 0). They skip without the devices they need; the test process never initialises CUDA.
#include <cuda_runtime_api.h>

#include <string>

#include "tests/support/conformance_suite.h"
#include "tests/support/gpu_peers.h"

namespace kv::transport::conformance {
namespace {

std::string CudaError(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// cudaMalloc'ed memory on one device. Read() may run on a transport's progress thread (a
// notification handler's snapshot); both copies name the device first.
class CudaSideMemory final : public SideMemory {
 public:
  static Result<std::unique_ptr<SideMemory>> Create(int device, uint64_t bytes) {
    if (device < 0) return Status::InvalidArgument("CUDA memory needs a device");
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
      return Status::Unavailable(CudaError("cudaSetDevice", e));
    void* base = nullptr;
    if (cudaError_t e = cudaMalloc(&base, bytes); e != cudaSuccess)
      return Status::ResourceExhausted(CudaError("cudaMalloc", e));
    return std::unique_ptr<SideMemory>(new CudaSideMemory(device, base, bytes));
  }
  ~CudaSideMemory() override {
    cudaSetDevice(device_);
    cudaFree(base_);
  }
  void* base() override { return base_; }
  MemoryLocation location() const override { return MemoryLocation::Cuda(device_); }
  Status Write(const std::vector<uint8_t>& bytes) override {
    if (bytes.size() != bytes_) return Status::InvalidArgument("size mismatch");
    cudaSetDevice(device_);
    cudaError_t e = cudaMemcpy(base_, bytes.data(), bytes_, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? Status::Ok() : Status::Internal(CudaError("cudaMemcpy", e));
  }
  Result<std::vector<uint8_t>> Read() override {
    std::vector<uint8_t> out(bytes_);
    cudaSetDevice(device_);
    cudaError_t e = cudaMemcpy(out.data(), base_, bytes_, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return Status::Internal(CudaError("cudaMemcpy", e));
    return out;
  }

 private:
  CudaSideMemory(int device, void* base, uint64_t bytes)
      : device_(device), base_(base), bytes_(bytes) {}
  int device_;
  void* base_;
  uint64_t bytes_;
};

Result<std::unique_ptr<SideMemory>> CudaMemory(int device, uint64_t bytes) {
  return CudaSideMemory::Create(device, bytes);
}

std::string Unless(const std::string& backend, int devices) {
  bool built = false;
  for (const std::string& name : AvailableTransports()) built = built || name == backend;
  if (!built) return "this build has no " + backend + " backend";
  if (gputest::DeviceCount() < devices) return "needs " + std::to_string(devices) + " CUDA devices";
  return {};
}
std::string UnlessCudaIpc() {
  return Unless("cuda_ipc", 2);
}
std::string UnlessAnyCudaIpc() {
  return Unless("cuda_ipc", 1);
}
std::string UnlessNccl() {
  return Unless("nccl", 2);
}
std::string UnlessStaged() {
  return Unless("ucx", 1);
}

std::vector<Backend> GpuBackends() {
  return {
      // Copies on the device may all be done before a kill lands: none has to fail then.
      {.name = "cuda_ipc",
       .transport = "cuda_ipc",
       .memory = &CudaMemory,
       .initiator_device = 0,
       .target_device = 1,
       .unavailable = &UnlessCudaIpc,
       .kill_outpaces_data = false,
       .traces_steps = true},
      // The same with a posting thread that spins instead of sleeping (kvd --busy-poll).
      {.name = "cuda_ipc_busy_poll",
       .transport = "cuda_ipc",
       .settings = {{"busy_poll", "1"}},
       .memory = &CudaMemory,
       .initiator_device = 0,
       .target_device = 1,
       .unavailable = &UnlessCudaIpc,
       .kill_outpaces_data = false,
       .traces_steps = true},
      // Both processes on GPU 0 (the CUDA IPC mapping is opened on the device it lives on): the
      // poster, progress thread and note gate run on a host with one GPU too.
      {.name = "cuda_ipc_one_gpu",
       .transport = "cuda_ipc",
       .memory = &CudaMemory,
       .initiator_device = 0,
       .target_device = 0,
       .unavailable = &UnlessAnyCudaIpc,
       .kill_outpaces_data = false,
       .traces_steps = true},
      // 64 KiB staging: a gigabyte is 16384 chunks, still in the pipeline when the kill lands.
      {.name = "nccl",
       .transport = "nccl",
       .settings = {{"staging_bytes", "65536"}, {"timeout_ms", "20000"}},
       .memory = &CudaMemory,
       .initiator_device = 0,
       .target_device = 1,
       .unavailable = &UnlessNccl,
       .traces_steps = true},
      // The same with the link's three threads spinning (kvd --busy-poll, base/waker.h).
      {.name = "nccl_busy_poll",
       .transport = "nccl",
       .settings = {{"staging_bytes", "65536"}, {"timeout_ms", "20000"}, {"busy_poll", "1"}},
       .memory = &CudaMemory,
       .initiator_device = 0,
       .target_device = 1,
       .unavailable = &UnlessNccl,
       .traces_steps = true},
      // Puts cut into pieces of 256 KiB, each a batch of its own (CutIntoPieces): a put completes
      // once, after its last piece, and a note waits for every piece posted before it.
      {.name = "nccl_pieces",
       .transport = "nccl",
       .settings = {{"staging_bytes", "65536"}, {"timeout_ms", "20000"}, {"piece_bytes", "262144"}},
       .memory = &CudaMemory,
       .initiator_device = 0,
       .target_device = 1,
       .unavailable = &UnlessNccl,
       .traces_steps = true},
      // Launches on the link's threads, on blocking communicators split from the non-blocking
      // ones; 64 KiB chunks keep every lane kLaunchesAhead launches ahead of the device.
      {.name = "nccl_blocking_launch",
       .transport = "nccl",
       .settings = {{"staging_bytes", "65536"}, {"timeout_ms", "20000"}, {"blocking_launch", "1"}},
       .memory = &CudaMemory,
       .initiator_device = 0,
       .target_device = 1,
       .unavailable = &UnlessNccl,
       .traces_steps = true},
      // Debian's UCX has no CUDA: GPU regions go through the staged decorator's pinned slots.
      {.name = "staged_gpu",
       .transport = "ucx",
       .settings = {{"staging_bytes", "65536"}},
       .memory = &CudaMemory,
       .initiator_device = 0,
       .target_device = 0,
       .unavailable = &UnlessStaged},
  };
}

INSTANTIATE_TEST_SUITE_P(Gpu, TransportConformance, ::testing::ValuesIn(GpuBackends()),
                         BackendName);

}  // namespace
}  // namespace kv::transport::conformance
