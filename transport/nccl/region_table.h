// The NCCL backend's registrations by the ids peers name them with, and the sink its
// notifications go to. Both are shared (shared_ptr) by the backend, its registrations and its
// links, so a link made before a handler was set still delivers to it. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

#include "base/status.h"
#include "transport/transport.h"

namespace kv::transport::nccl {

// The backend's registrations, by the id peers name them with. Shared by the backend, its
// registrations (which erase themselves) and its links.
class RegionTable {
 public:
  uint64_t Add(char* base, uint64_t length);
  void Remove(uint64_t id);
  // The region's base and length; kNotFound for an unknown (or deregistered) id.
  Result<std::pair<char*, uint64_t>> Find(uint64_t id) const;

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, std::pair<char*, uint64_t>> regions_;
  uint64_t next_id_ = 1;
};

// Where notifications go; shared so a handler set later reaches links made earlier.
class NoteSink {
 public:
  void Set(NotificationHandler handler);
  void Deliver(std::string_view message);

 private:
  std::mutex mu_;
  NotificationHandler handler_;
};

}  // namespace kv::transport::nccl
