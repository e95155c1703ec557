// RAII for the CUDA objects GPU tests use, and the skip when no device is present.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace kv::kernels::testing {

inline bool HaveCudaDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define KV_SKIP_WITHOUT_CUDA() \
  if (!::kv::kernels::testing::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device"

#define KV_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&p_, bytes ? bytes : 1) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(p_); }
  size_t bytes() const { return bytes_; }
  template <typename T>
  void Upload(const std::vector<T>& host) const {
    cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  template <typename T>
  std::vector<T> Download(size_t count) const {
    std::vector<T> host(count);
    cudaMemcpy(host.data(), p_, count * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMallocHost(&p_, bytes ? bytes : 1) != cudaSuccess) p_ = nullptr;
  }
  ~PinnedBuffer() { cudaFreeHost(p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

class Stream {
 public:
  Stream() { cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void* opaque() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace kv::kernels::testing
