// Host memory shared between an engine and its kvd: an anonymous memfd the engine creates, maps
// and hands to kvd over the unix socket (SCM_RIGHTS), which kvd maps in turn. Nothing is named
// in /dev/shm, so nothing leaks when either process dies.
//
// SharedMemory owns its fd and its mapping; movable, not copyable; not thread-safe (the bytes
// themselves may be used from any thread).
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace kv {

class SharedMemory {
 public:
  // The seals Create() puts on an object and Adopt() requires of it (F_SEAL_SHRINK | F_SEAL_GROW
  // of <fcntl.h>): its size is fixed while anyone maps it.
  static constexpr int kRequiredSeals = 0x0002 | 0x0004;
  // A new zero-filled object of `bytes`, mapped read-write, sealed at that size.
  static Result<SharedMemory> Create(uint64_t bytes, const std::string& name);
  // Maps `bytes` at byte `offset` of an fd received from an engine (only those: kvd populates
  // what it maps, so a small cache inside a large object costs kvd the cache's pages alone).
  // Takes ownership of `fd` on every path. kOutOfRange when the object is smaller than
  // offset + bytes (a sender cannot make kvd read past its end); kInvalidArgument when it is
  // not sealed with kRequiredSeals (it could shrink under kvd).
  static Result<SharedMemory> Adopt(int fd, uint64_t bytes, uint64_t offset = 0);

  SharedMemory() = default;
  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  SharedMemory(int fd, void* data, uint64_t size, uint64_t lead = 0)
      : fd_(fd), data_(data), size_(size), lead_(lead) {}
  void Reset();

  int fd_ = -1;
  void* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t lead_ = 0;  // bytes mapped before data_: the offset's distance past a page boundary
};

}  // namespace kv
