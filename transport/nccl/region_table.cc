#include "transport/nccl/region_table.h"

#include <string>

namespace kv::transport::nccl {

uint64_t RegionTable::Add(char* base, uint64_t length) {
  std::lock_guard lock(mu_);
  uint64_t id = next_id_++;
  regions_[id] = {base, length};
  return id;
}

void RegionTable::Remove(uint64_t id) {
  std::lock_guard lock(mu_);
  regions_.erase(id);
}

Result<std::pair<char*, uint64_t>> RegionTable::Find(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return Status::NotFound("nccl: no registration " + std::to_string(id));
  return it->second;
}

void NoteSink::Set(NotificationHandler handler) {
  std::lock_guard lock(mu_);
  handler_ = std::move(handler);
}

void NoteSink::Deliver(std::string_view message) {
  NotificationHandler handler;
  {
    std::lock_guard lock(mu_);
    handler = handler_;
  }
  if (handler) handler(message);
}

}  // namespace kv::transport::nccl
