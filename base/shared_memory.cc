#include "base/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace kv {

static_assert(SharedMemory::kRequiredSeals == (F_SEAL_SHRINK | F_SEAL_GROW));

namespace {

Status Errno(const std::string& what) {
  return Status::IoError(what + ": " + std::strerror(errno));
}

}  // namespace

Result<SharedMemory> SharedMemory::Create(uint64_t bytes, const std::string& name) {
  if (bytes == 0) return Status::InvalidArgument("shared memory of 0 bytes");
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    Status s = Errno("ftruncate to " + std::to_string(bytes) + " bytes");
    close(fd);
    return s;
  }
  // Sealed at its size (kRequiredSeals): kvd refuses an object that could shrink under its
  // mapping, and keeps the engine from doing so by accident.
  if (fcntl(fd, F_ADD_SEALS, kRequiredSeals) != 0) {
    Status s = Errno("sealing the memfd (F_ADD_SEALS)");
    close(fd);
    return s;
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    Status s = Errno("mmap of " + std::to_string(bytes) + " bytes");
    close(fd);
    return s;
  }
  return SharedMemory(fd, data, bytes);
}

Result<SharedMemory> SharedMemory::Adopt(int fd, uint64_t bytes, uint64_t offset) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = Errno("fstat of a received memory fd");
    close(fd);
    return s;
  }
  // Security issue 19: an engine that shrank its memfd after registering killed kvd with SIGBUS
  // on the next access. Only an object sealed against shrinking (and growing) is mapped.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals) {
    close(fd);
    return Status::InvalidArgument(
        "received memory object is not sealed against resizing (create it with "
        "memfd_create(MFD_ALLOW_SEALING) and fcntl(F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW))");
  }
  if (!S_ISREG(st.st_mode) || st.st_size < 0 || bytes == 0 ||
      static_cast<uint64_t>(st.st_size) < offset ||
      static_cast<uint64_t>(st.st_size) - offset < bytes) {
    close(fd);
    return Status::OutOfRange("received memory object holds " + std::to_string(st.st_size) +
                              " bytes, the registration claims " + std::to_string(bytes) +
                              " at offset " + std::to_string(offset));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t lead = offset % page;
  const uint64_t expected_bytes = lead + bytes;  // what is mapped, from offset's page on
  const off_t at = static_cast<off_t>(offset - lead);
  // Registration pays for the page tables once, so that transfers take no faults on the hot path.
  // Writable ones: after MAP_POPULATE (read faults on a shared mapping) the first write into each
  // page still faulted, on a decode region's first transfer.
  // MADV_POPULATE_WRITE (Linux 5.14) faults every page in writable without touching its bytes;
  // where the kernel refuses it, MAP_POPULATE is the fallback.
  void* data = mmap(nullptr, expected_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, at);
  if (data != MAP_FAILED && madvise(data, expected_bytes, MADV_POPULATE_WRITE) != 0) {
    munmap(data, expected_bytes);
    data = mmap(nullptr, expected_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, at);
  }
  if (data == MAP_FAILED) {
    Status s = Errno("mmap of a received memory fd");
    close(fd);
    return s;
  }
  return SharedMemory(fd, static_cast<uint8_t*>(data) + lead, bytes, lead);
}

SharedMemory::SharedMemory(SharedMemory&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      lead_(std::exchange(other.lead_, 0)) {}

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    lead_ = std::exchange(other.lead_, 0);
  }
  return *this;
}

SharedMemory::~SharedMemory() {
  Reset();
}

void SharedMemory::Reset() {
  if (data_ != nullptr) munmap(static_cast<uint8_t*>(data_) - lead_, size_ + lead_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
  lead_ = 0;
}

}  // namespace kv
