#include "connector/host_memory.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "base/shared_memory.h"
#include "kv/connector.h"

namespace kv::connector {
namespace {

struct Table {
  std::mutex mu;
  std::map<uintptr_t, kv::SharedMemory> by_base;  // keyed by the mapping's address
};

Table& TheTable() {
  static Table* table = new Table;  // never destroyed: engines may free memory during exit
  return *table;
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

}  // namespace

Result<void*> AllocateHostMemory(uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("host memory of 0 bytes");
  KV_ASSIGN_OR_RETURN(auto memory, kv::SharedMemory::Create(bytes, "kv-host-cache"));
  void* base = memory.data();
  Table& t = TheTable();
  std::lock_guard lock(t.mu);
  t.by_base.emplace(reinterpret_cast<uintptr_t>(base), std::move(memory));
  return base;
}

Status FreeHostMemory(void* base) {
  Table& t = TheTable();
  std::lock_guard lock(t.mu);
  if (t.by_base.erase(reinterpret_cast<uintptr_t>(base)) == 0) {
    return Status::NotFound("host memory at " + Hex(base) +
                            " was not allocated by AllocateHostMemory (or was freed already)");
  }
  return Status::Ok();
}

Result<HostSlice> FindHostMemory(const void* base, uint64_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(base);
  Table& t = TheTable();
  std::lock_guard lock(t.mu);
  auto it = t.by_base.upper_bound(address);
  if (it != t.by_base.begin()) {
    --it;
    const kv::SharedMemory& memory = it->second;
    const uint64_t offset = address - it->first;
    if (offset < memory.size() && bytes <= memory.size() - offset) {
      KV_ASSIGN_OR_RETURN(auto fd, DuplicateFd(memory.fd()));
      return HostSlice{std::move(fd), memory.size(), offset};
    }
  }
  return Status::InvalidArgument(
      "host KV cache at " + Hex(base) + " (" + std::to_string(bytes) +
      " bytes) is not inside memory kvd can map: allocate it with AllocateHostMemory "
      "(kv_host_memory_alloc, kvd.allocate_host_kv_cache) and build the cache's views on it");
}

Result<kv::UniqueFd> DuplicateFd(int fd) {
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return Status::IoError(std::string("dup of a memory fd: ") + std::strerror(errno));
  return kv::UniqueFd(copy);
}

}  // namespace kv::connector
