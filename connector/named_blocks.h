// NamedBlocks: the block ids each request's saves last sent to kvd, so that its later saves leave
// them out. An engine saves a request layer after layer with the same blocks; sending them every
// time made each layer's save a few hundred ids for the engine to serialize and kvd to parse and
// check again (engine protocol 7 lets a later save leave them out: benchmarks/pd_gpu.md,
// twenty-fourth session).
//
// Sending the ids is always allowed; leaving them out only after they went out on the same
// connection. So forgetting an entry is always safe (the next save sends them again), which is
// how the table stays bounded: Forget when the request finishes or a send fails, and a table
// grown past kMaxRequests (requests an engine never finished) is cleared.
//
// Thread-safety: none. The caller holds one lock from Repeats() until the save it decided for
// was written, so a save that leaves the ids out never overtakes the one that named them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace kv::connector {

class NamedBlocks {
 public:
  static constexpr size_t kMaxRequests = 65536;

  // True when `ids` are the ones last sent for `request`: its save may leave them out. Else
  // remembers them as sent (the save must then carry them) and returns false.
  bool Repeats(const std::string& request, std::span<const int64_t> ids);
  // The next save of `request` names its blocks again.
  void Forget(const std::string& request) { sent_.erase(request); }
  size_t size() const { return sent_.size(); }

 private:
  std::unordered_map<std::string, std::vector<int64_t>> sent_;
};

}  // namespace kv::connector
