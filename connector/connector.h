// The connector as kvd's own tools and tests see it: the public API (<kv/connector.h>) plus what
// only they use (kvd's status as protobuf). Engines include <kv/connector.h> instead.
#pragma once

#include <chrono>
#include <span>
#include <string>
#include <vector>

#include "kv/connector.h"  // IWYU pragma: export
#include "layout/kv_region.h"

// Declared only; callers include "protocol/kvd.pb.h" themselves.
namespace kv::proto {
class DaemonStatus;
}

namespace kv::connector {

// Descriptions of host caches kvd's connector allocates, one per layout.
inline std::vector<KvCacheDesc> HostCaches(std::span<const LayoutSpec> layouts) {
  std::vector<KvCacheDesc> out;
  for (const LayoutSpec& layout : layouts) out.push_back(KvCacheDesc{layout});
  return out;
}

// A description of a GPU cache at `base` on CUDA device `device`.
inline KvCacheDesc GpuCache(void* base, int device, const LayoutSpec& layout) {
  return KvCacheDesc{layout, MemoryLocation::Cuda(device), base};
}

// A registered cache's layout as the planner's region (its spec was validated at registration).
inline KvRegion RegionOf(const KvCache& cache) {
  return KvRegion::Create(cache.layout).value();
}

// kvd's status as its engine protocol carries it.
Result<proto::DaemonStatus> DaemonStatusOf(Connector& connector);

// kvctl's view: asks the kvd at `socket_path` for its status without registering an engine.
Result<proto::DaemonStatus> QueryDaemonStatus(const std::string& socket_path,
                                              std::chrono::milliseconds timeout);

}  // namespace kv::connector
