#include "daemon/registry.h"

namespace kv::daemon {

Engine& Registry::Add(uint64_t id) {
  Engine& engine = engines_[id];
  engine.id = id;
  return engine;
}

Engine* Registry::Find(uint64_t id) {
  auto it = engines_.find(id);
  return it == engines_.end() ? nullptr : &it->second;
}

void Registry::Remove(uint64_t id) {
  engines_.erase(id);
}

bool Registry::HasRank(const std::string& instance, int tp_rank) const {
  for (const auto& [id, other] : engines_) {
    if (other.hello && other.instance == instance && other.tp_rank == tp_rank) return true;
  }
  return false;
}

Registry::Totals Registry::totals() const {
  Totals t;
  for (const auto& [id, engine] : engines_) {
    t.engines += engine.hello ? 1 : 0;
    t.regions += static_cast<uint32_t>(engine.regions.size());
    for (const auto& r : engine.regions) t.region_bytes += r->bytes;
  }
  return t;
}

}  // namespace kv::daemon
