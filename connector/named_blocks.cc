#include "connector/named_blocks.h"

#include <algorithm>

namespace kv::connector {

bool NamedBlocks::Repeats(const std::string& request, std::span<const int64_t> ids) {
  auto it = sent_.find(request);
  if (it != sent_.end()) {
    if (std::equal(ids.begin(), ids.end(), it->second.begin(), it->second.end())) return true;
    it->second.assign(ids.begin(), ids.end());
    return false;
  }
  if (sent_.size() >= kMaxRequests) sent_.clear();
  sent_.emplace(request, std::vector<int64_t>(ids.begin(), ids.end()));
  return false;
}

}  // namespace kv::connector
