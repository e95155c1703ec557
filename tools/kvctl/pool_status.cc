#include "tools/kvctl/pool_status.h"

#include <cstdio>

#include "daemon/offload/pool_stats.h"

namespace kv::tools {
namespace {

offload::PoolStats FromWire(const proto::OffloadStatus& s) {
  offload::PoolStats p;
  p.capacity_bytes = s.capacity_bytes();
  p.slot_bytes = s.slot_bytes();
  p.capacity_slots = s.capacity_slots();
  p.used_slots = s.used_slots();
  p.pinned_slots = s.pinned_slots();
  p.hits = s.hits();
  p.misses = s.misses();
  p.evictions = s.evictions();
  p.bytes_in = s.bytes_in();
  p.bytes_out = s.bytes_out();
  p.failed_copies = s.failed_copies();
  p.huge_pages = s.huge_pages();
  p.pinned_memory = s.pinned_memory();
  return p;
}

}  // namespace

std::string JsonQuoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string PoolStatusJson(const proto::OffloadStatus& s) {
  if (!s.enabled()) return "{\"enabled\": false}";
  // ToJson's object, opened with the two fields it does not know.
  const std::string figures = offload::ToJson(FromWire(s));
  return "{\"enabled\": true, \"shape\": " + JsonQuoted(s.shape()) + ", " + figures.substr(1);
}

std::string PoolStatusText(const proto::OffloadStatus& s) {
  if (!s.enabled()) return "offload    off (start kvd with --offload-bytes)\n";
  const std::string shape =
      s.shape().empty() ? "block shape not fixed yet (the first store, lookup or load fixes it)"
                        : "blocks of " + s.shape();
  return "offload    " + shape + "\n" + offload::ToText(FromWire(s));
}

}  // namespace kv::tools
