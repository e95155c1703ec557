// The transfer planner: turns a request stated in logical coordinates into byte runs.
//
// For every layer in [layer_begin, layer_end), every token t < tokens (at
// (src_blocks[t / Ns], t % Ns) in the source and (dst_blocks[t / Nd], t % Nd) in the
// destination), every global head held by both regions and every logical content byte, the
// destination byte takes the source byte. Runs are merged wherever one continues another
// contiguously on both sides, so the run count is the minimum. See ../DESIGN.md.
//
// Pure functions; thread-safe. Cost after validation is O(blocks + runs); see PlanTransfer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "layout/kv_region.h"
#include "layout/status.h"

namespace kv {

// One contiguous copy: `length` bytes from src_offset (from the source region's base) to
// dst_offset (from the destination region's base).
struct Run {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  bool operator==(const Run&) const = default;
};

struct TransferSpec {
  std::span<const int64_t> src_blocks;
  std::span<const int64_t> dst_blocks;
  int64_t tokens = 0;
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // -1: every layer
};

// The runs are the maximal diagonal stretches of the byte mapping, in ascending dst_offset
// order. Precisely: the transfer is a set of byte pairs (dst, src) in which every destination
// byte occurs once (used destination blocks must be distinct), so each pair has at most one
// successor (dst+1, src+1) and the set splits uniquely into maximal stretches. Any run list that
// performs the transfer and copies nothing else needs a run starting at every stretch's first
// pair, so one run per stretch is the minimum, whatever order runs are listed in. Runs never
// overlap on the destination; they may on the source (source blocks may repeat).
struct Plan {
  std::vector<Run> runs;
  uint64_t bytes = 0;  // sum of run lengths
};

// Errors: kOutOfRange (block id outside the region), kInvalidArgument (too few blocks for
// `tokens`, a destination block used twice, bad layer range, negative tokens), kIncompatible
// (different layer counts, different logical content sizes, different total head counts, no
// head in common). Only the first ceil(tokens / block_size) block ids of each list are used;
// every id given is range-checked.
//
// Cost: O(blocks + pieces) after validation, where blocks are the ids the tokens use and a
// piece is a run before merging: loops contiguous on both sides are folded, so pieces exceed
// runs mainly where whole pages are adjacent on both sides (a contiguous blocks-first request
// is 1 run from one piece per block). Planning one layer ([l, l+1)) costs that layer's runs
// plus the blocks. Figures: benchmarks/layout.md.
Result<Plan> PlanTransfer(const KvRegion& src, const KvRegion& dst, const TransferSpec& spec);

// The same plan appended to *plan: its runs go after those already there (never joined to
// them) and its bytes are added to plan->bytes. Lets a caller gather several transfers into one
// run vector whose capacity it reuses. On error *plan is left unchanged.
Status PlanTransfer(const KvRegion& src, const KvRegion& dst, const TransferSpec& spec, Plan* plan);

// One layer's plan, shifted to any layer. A layer's runs are layer 0's with every source offset
// moved by layer·stride(L) of the source and every destination offset by layer·stride(L) of the
// destination (the layer loop has one step, so only the bases move), so AppendLayer(l, plan)
// appends exactly what PlanTransfer appends for [l, l+1), at the cost of a copy: a caller that
// plans a request one layer at a time plans it once.
class LayerPlan {
 public:
  // Plans layer 0 of `spec` (its layer range is ignored); the errors of PlanTransfer.
  static Result<LayerPlan> Create(const KvRegion& src, const KvRegion& dst,
                                  const TransferSpec& spec);
  // Appends layer `layer`'s runs to *plan (never joined to runs already there) and adds their
  // bytes. kOutOfRange, with *plan unchanged, for a layer outside [0, layers).
  Status AppendLayer(int64_t layer, Plan* plan) const;
  size_t runs_per_layer() const { return layer0_.runs.size(); }
  uint64_t bytes_per_layer() const { return layer0_.bytes; }

 private:
  Plan layer0_;
  int64_t layers_ = 0;
  uint64_t src_layer_stride_ = 0;
  uint64_t dst_layer_stride_ = 0;
};

// Checks that every run lies inside [0, src_bytes) on the source and [0, dst_bytes) on the
// destination; used where runs arrive from elsewhere (a peer, a file) before they touch memory.
Status ValidateRuns(std::span<const Run> runs, uint64_t src_bytes, uint64_t dst_bytes);

}  // namespace kv
