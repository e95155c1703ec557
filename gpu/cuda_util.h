// Small RAII owners for CUDA runtime handles, shared by the GPU backends (cuda_ipc, nccl).
//
// Every owner is move-only; destroying one releases its handle on the device it was created on.
// None is thread-safe for concurrent mutation; distinct objects may be used from distinct threads.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace kv::gpu {

// kOk for cudaSuccess; otherwise kUnavailable for a device that is gone, kIoError for the rest,
// with "what: cudaErrorName (description)" as the message.
Status CudaStatus(cudaError_t err, std::string_view what);

// Makes `device` current for the enclosing scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// A non-blocking stream (no implicit sync with the legacy default stream) on one device.
class CudaStream {
 public:
  CudaStream() = default;
  static Result<CudaStream> Create(int device);
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;

  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

// An event without timing (cheap to record and query), optionally shareable across processes.
class CudaEvent {
 public:
  CudaEvent() = default;
  static Result<CudaEvent> Create(int device, bool interprocess = false);
  // Takes ownership of an event created elsewhere (e.g. opened from an IPC handle).
  static CudaEvent Adopt(cudaEvent_t event, int device);
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;

  cudaEvent_t get() const { return event_; }
  Status Record(cudaStream_t stream) const;
  // True once the recorded work finished; an error when that work failed (not left behind as
  // the thread's last CUDA error).
  Result<bool> Query() const;

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

// CudaEvent::Query for an event this code does not own (an engine's, imported).
Result<bool> QueryEvent(cudaEvent_t event);

// cudaMalloc'ed device memory.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> Allocate(int device, uint64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  void* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  uint64_t size_ = 0;
  int device_ = -1;
};

}  // namespace kv::gpu
