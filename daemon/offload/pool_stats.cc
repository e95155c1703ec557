#include "daemon/offload/pool_stats.h"

#include <cstdio>

namespace kv::offload {
namespace {

std::string Size(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / double(1ull << 20));
  }
  return buf;
}

}  // namespace

std::string ToJson(const PoolStats& s) {
  char buf[640];
  std::snprintf(
      buf, sizeof buf,
      "{\"capacity_bytes\": %llu, \"slot_bytes\": %llu, \"capacity_slots\": %llu, "
      "\"used_slots\": %llu, \"pinned_slots\": %llu, \"hits\": %llu, \"misses\": %llu, "
      "\"evictions\": %llu, \"bytes_in\": %llu, \"bytes_out\": %llu, "
      "\"failed_copies\": %llu, \"huge_pages\": %s, \"pinned_memory\": %s}",
      static_cast<unsigned long long>(s.capacity_bytes),
      static_cast<unsigned long long>(s.slot_bytes),
      static_cast<unsigned long long>(s.capacity_slots),
      static_cast<unsigned long long>(s.used_slots),
      static_cast<unsigned long long>(s.pinned_slots), static_cast<unsigned long long>(s.hits),
      static_cast<unsigned long long>(s.misses), static_cast<unsigned long long>(s.evictions),
      static_cast<unsigned long long>(s.bytes_in), static_cast<unsigned long long>(s.bytes_out),
      static_cast<unsigned long long>(s.failed_copies), s.huge_pages ? "true" : "false",
      s.pinned_memory ? "true" : "false");
  return buf;
}

std::string ToText(const PoolStats& s) {
  const uint64_t asked = s.hits + s.misses;
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "capacity   %s in %llu slots of %s (%s, %s)\n"
      "used       %llu slots, %llu in flight\n"
      "lookups    %llu hits, %llu misses (%.1f%% hit rate)\n"
      "evictions  %llu\n"
      "bytes      %s stored, %s loaded, %llu failed copies\n",
      Size(s.capacity_bytes).c_str(), static_cast<unsigned long long>(s.capacity_slots),
      Size(s.slot_bytes).c_str(), s.huge_pages ? "huge pages" : "normal pages",
      s.pinned_memory ? "pinned" : "not pinned", static_cast<unsigned long long>(s.used_slots),
      static_cast<unsigned long long>(s.pinned_slots), static_cast<unsigned long long>(s.hits),
      static_cast<unsigned long long>(s.misses), asked ? 100.0 * s.hits / asked : 0.0,
      static_cast<unsigned long long>(s.evictions), Size(s.bytes_in).c_str(),
      Size(s.bytes_out).c_str(), static_cast<unsigned long long>(s.failed_copies));
  return buf;
}

}  // namespace kv::offload
