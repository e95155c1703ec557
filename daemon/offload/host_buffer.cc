#include "daemon/offload/host_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "daemon/offload/cuda_host.h"

namespace kv::offload {
namespace {

constexpr uint64_t kHugePageBytes = 2ull << 20;

uint64_t RoundUp(uint64_t v, uint64_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace

Result<HostBuffer> HostBuffer::Allocate(uint64_t bytes, const HostBufferOptions& options) {
  if (bytes == 0) return Status::InvalidArgument("offload pool of 0 bytes");
  HostBuffer buf;
  buf.size_ = bytes;
  void* p = MAP_FAILED;
  if (options.try_huge_pages) {
    buf.mapped_ = RoundUp(bytes, kHugePageBytes);
    // MAP_POPULATE faults every page in now: the reservation either holds or fails here, never
    // with SIGBUS in the middle of a copy.
    p = mmap(nullptr, buf.mapped_, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
    buf.huge_pages_ = p != MAP_FAILED;
  }
  if (p == MAP_FAILED) {
    buf.mapped_ = RoundUp(bytes, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
    p = mmap(nullptr, buf.mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return Status::ResourceExhausted("cannot map " + std::to_string(bytes) +
                                       " bytes for the offload pool: " + std::strerror(errno));
    }
    // Best effort: fewer TLB misses on large copies where transparent huge pages are enabled.
    // Asked before the first touch, so the pages are born huge rather than collapsed later.
    if (options.try_huge_pages) madvise(p, buf.mapped_, MADV_HUGEPAGE);
    // Touch every page now so that copies never fault (and an overcommitted machine fails here).
    std::memset(p, 0, buf.mapped_);
  }
  buf.data_ = static_cast<std::byte*>(p);
  if (options.pin_for_cuda && CudaDevicePresent()) {
    KV_RETURN_IF_ERROR(CudaHostRegister(buf.data_, buf.mapped_).WithContext("offload pool"));
    buf.pinned_ = true;
  }
  return buf;
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept {
  *this = std::move(other);
}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    huge_pages_ = std::exchange(other.huge_pages_, false);
    pinned_ = std::exchange(other.pinned_, false);
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  Release();
}

void HostBuffer::Release() {
  if (data_ == nullptr) return;
  if (pinned_) CudaHostUnregister(data_);
  munmap(data_, mapped_);
  data_ = nullptr;
}

}  // namespace kv::offload
