#include "gpu/cuda_util.h"

#include <string>
#include <utility>

namespace kv::gpu {

Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status::Ok();
  std::string message =
      std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  const bool device_gone = err == cudaErrorNoDevice || err == cudaErrorDevicesUnavailable ||
                           err == cudaErrorLaunchFailure || err == cudaErrorIllegalAddress;
  return device_gone ? Status::Unavailable(std::move(message))
                     : Status::IoError(std::move(message));
}

DeviceGuard::DeviceGuard(int device) {
  cudaGetDevice(&previous_);
  if (device != previous_) cudaSetDevice(device);
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

// ---- CudaStream ---------------------------------------------------------------------------------

Result<CudaStream> CudaStream::Create(int device) {
  DeviceGuard guard(device);
  CudaStream s;
  KV_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking),
                                "cudaStreamCreateWithFlags"));
  s.device_ = device;
  return s;
}

CudaStream::~CudaStream() {
  if (stream_ == nullptr) return;
  DeviceGuard guard(device_);
  cudaStreamDestroy(stream_);
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    CudaStream dying(std::move(*this));
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

// ---- CudaEvent ----------------------------------------------------------------------------------

Result<CudaEvent> CudaEvent::Create(int device, bool interprocess) {
  DeviceGuard guard(device);
  unsigned flags = cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0u);
  cudaEvent_t event = nullptr;
  KV_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&event, flags), "cudaEventCreate"));
  return Adopt(event, device);
}

CudaEvent CudaEvent::Adopt(cudaEvent_t event, int device) {
  CudaEvent e;
  e.event_ = event;
  e.device_ = device;
  return e;
}

CudaEvent::~CudaEvent() {
  if (event_ == nullptr) return;
  DeviceGuard guard(device_);
  cudaEventDestroy(event_);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    CudaEvent dying(std::move(*this));
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

Status CudaEvent::Record(cudaStream_t stream) const {
  return CudaStatus(cudaEventRecord(event_, stream), "cudaEventRecord");
}

Result<bool> CudaEvent::Query() const {
  return QueryEvent(event_);
}

Result<bool> QueryEvent(cudaEvent_t event) {
  cudaError_t err = cudaEventQuery(event);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  // Reported here, so it must not also stay this thread's last error, where the next kernel
  // launch's check (kernels' LaunchStatus) would take it as its own and fail an unrelated copy.
  // A sticky error stays whatever this does.
  cudaGetLastError();
  return CudaStatus(err, "cudaEventQuery");
}

// ---- DeviceBuffer -------------------------------------------------------------------------------

Result<DeviceBuffer> DeviceBuffer::Allocate(int device, uint64_t bytes) {
  DeviceGuard guard(device);
  DeviceBuffer b;
  KV_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&b.data_, bytes), "cudaMalloc"));
  b.size_ = bytes;
  b.device_ = device;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ == nullptr) return;
  DeviceGuard guard(device_);
  cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(other.size_), device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer dying(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = other.size_;
    device_ = other.device_;
  }
  return *this;
}

}  // namespace kv::gpu
