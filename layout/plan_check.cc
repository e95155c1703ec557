// Bounds checks of runs (plan.h ValidateRuns), for runs that arrive from elsewhere.
#include <string>

#include "layout/plan.h"

namespace kv {

Status ValidateRuns(std::span<const Run> runs, uint64_t src_bytes, uint64_t dst_bytes) {
  // One branch-free pass the compiler vectorizes (every post checks every run: 131072 of them
  // for one TP 1->2 rank's request); the slow loop below only names the first bad run.
  bool bad = false;
  for (const Run& r : runs) {
    bad |= (r.length > src_bytes) | (r.src_offset > src_bytes - r.length) | (r.length > dst_bytes) |
           (r.dst_offset > dst_bytes - r.length);
  }
  if (!bad) return Status::Ok();
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    // Written as subtractions so that huge offsets cannot wrap around the bound.
    bool src_ok = r.length <= src_bytes && r.src_offset <= src_bytes - r.length;
    bool dst_ok = r.length <= dst_bytes && r.dst_offset <= dst_bytes - r.length;
    if (!src_ok || !dst_ok) {
      return Status::OutOfRange("run " + std::to_string(i) + " (" + std::to_string(r.src_offset) +
                                " -> " + std::to_string(r.dst_offset) + ", " +
                                std::to_string(r.length) + " bytes) reaches past the " +
                                (src_ok ? "destination (" + std::to_string(dst_bytes)
                                        : "source (" + std::to_string(src_bytes)) +
                                " bytes)");
    }
  }
  return Status::Ok();
}

}  // namespace kv
