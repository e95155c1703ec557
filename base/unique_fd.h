// An owned POSIX file descriptor (eventfds, epoll sets, the VMM shareable handles kvd receives
// and hands on). Header-only, no CUDA: every backend and build uses it.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "base/status.h"

namespace kv {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Another descriptor of the same open file, close-on-exec.
  Result<UniqueFd> Dup() const {
    const int copy = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) return Status::IoError(std::string("dup of an fd: ") + std::strerror(errno));
    return UniqueFd(copy);
  }

 private:
  int fd_ = -1;
};

}  // namespace kv
