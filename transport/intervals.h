// Byte intervals [first, second) of a region, sorted and merged: the write grants a backend checks
// a peer's writes against (transport.h, grant_writes), so that whether a write lies inside one is a
// binary search. Plain functions over a vector the caller owns and locks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

namespace kv::transport {

using Interval = std::pair<uint64_t, uint64_t>;

// Sorts `v` and merges overlapping or touching intervals. Input already in order (a grant's
// ranges, daemon/write_grants.h, come sorted and merged) is merged in one pass, unsorted.
inline void SortAndMerge(std::vector<Interval>& v) {
  if (!std::is_sorted(v.begin(), v.end())) std::sort(v.begin(), v.end());
  size_t out = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (out > 0 && v[i].first <= v[out - 1].second) {
      v[out - 1].second = std::max(v[out - 1].second, v[i].second);
    } else {
      v[out++] = v[i];
    }
  }
  v.resize(out);
}

// Whether [offset, offset + length) lies inside one interval of `v` (sorted and merged; the last
// interval starting at or before `offset` is the only one that can hold it). offset + length must
// not overflow: callers check the write against its region first.
inline bool Contains(const std::vector<Interval>& v, uint64_t offset, uint64_t length) {
  auto at = std::upper_bound(v.begin(), v.end(), offset,
                             [](uint64_t a, const Interval& i) { return a < i.first; });
  return at != v.begin() && offset + length <= std::prev(at)->second;
}

}  // namespace kv::transport
