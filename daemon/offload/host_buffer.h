// HostBuffer: the offload pool's memory, allocated once for the daemon's lifetime.
//
// One anonymous private mapping: on explicit huge pages (MAP_HUGETLB) when the kernel has enough
// reserved, else on normal pages with transparent huge pages requested (madvise). Touched up
// front so no page fault lands on a copy, and page-locked with cudaHostRegister when a CUDA
// device is present, so copies to and from GPUs run at DMA speed without staging.
//
// Move-only; destruction unpins and unmaps. The bytes themselves are not synchronised: the pool
// hands disjoint slots to concurrent copies.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace kv::offload {

struct HostBufferOptions {
  bool try_huge_pages = true;
  bool pin_for_cuda = true;  // only when a device is present; without one this is ignored
};

class HostBuffer {
 public:
  // kInvalidArgument for 0 bytes; kResourceExhausted when the mapping fails (the message names
  // the size and errno); kUnavailable when a present device refuses to pin it.
  static Result<HostBuffer> Allocate(uint64_t bytes, const HostBufferOptions& options = {});

  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }          // as asked; the mapping may be rounded up
  bool huge_pages() const { return huge_pages_; }  // explicit huge pages (MAP_HUGETLB)
  bool pinned() const { return pinned_; }

 private:
  HostBuffer() = default;
  void Release();

  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t mapped_ = 0;
  bool huge_pages_ = false;
  bool pinned_ = false;
};

}  // namespace kv::offload
