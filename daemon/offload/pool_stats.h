// PoolStats: what the offload pool reports to `kvctl status` and `kvctl offload`, and its two
// renderings, so kvd and kvctl print the same names.
#pragma once

#include <cstdint>
#include <string>

namespace kv::offload {

struct PoolStats {
  uint64_t capacity_bytes = 0;  // slots × slot_bytes
  uint64_t slot_bytes = 0;
  uint64_t capacity_slots = 0;
  uint64_t used_slots = 0;    // stored, being stored or loaded
  uint64_t pinned_slots = 0;  // being stored or loaded right now
  uint64_t hits = 0;          // keys Lookup() found in the leading prefix
  uint64_t misses = 0;        // keys Lookup() was asked for past the prefix
  uint64_t evictions = 0;
  uint64_t bytes_in = 0;   // landed in the pool by completed stores
  uint64_t bytes_out = 0;  // landed in engines by completed loads
  uint64_t failed_copies = 0;
  bool huge_pages = false;
  bool pinned_memory = false;
};

// One JSON object, keys as the field names above.
std::string ToJson(const PoolStats& s);
// Aligned "name: value" lines for people, sizes in MiB/GiB, hit rate included.
std::string ToText(const PoolStats& s);

}  // namespace kv::offload
