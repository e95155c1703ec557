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

#include "base/status.h"
#include "layout/kv_region.h"

namespace kv {

// One contiguous copy: `length` bytes from src_offset (from the source region's base) to
// dst_offset (from the destination region's base).
struct Run {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  bool operator==(const Run&) const = default;
};

// `count` runs of one length in arithmetic progression: row i copies `length` bytes from
// src_offset + i·src_stride to dst_offset + i·dst_stride (offsets in two's complement, so a
// stride may be negative). One entry for what a TP split makes of a page: its tokens' slices of
// the rank's heads, 16 runs at constant strides on both sides.
struct RunGroup {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  uint64_t count = 0;
  int64_t src_stride = 0;
  int64_t dst_stride = 0;
  Run row(uint64_t i) const {
    return {src_offset + i * static_cast<uint64_t>(src_stride),
            dst_offset + i * static_cast<uint64_t>(dst_stride), length};
  }
  bool operator==(const RunGroup&) const = default;
};

// A run group repeated: block o is `group` with every source offset moved by
// o·src_outer_stride and every destination offset by o·dst_outer_stride. What a page converted
// between head-major and token-major orders makes of its heads (LBNHC -> BLHNC: 8 groups of 16
// rows at one step on both sides), where a copier takes them as one entry.
struct GroupBlocks {
  RunGroup group;  // block 0
  uint64_t outer_count = 1;
  int64_t src_outer_stride = 0;
  int64_t dst_outer_stride = 0;
  RunGroup block(uint64_t o) const {
    RunGroup g = group;
    g.src_offset += o * static_cast<uint64_t>(src_outer_stride);
    g.dst_offset += o * static_cast<uint64_t>(dst_outer_stride);
    return g;
  }
  bool operator==(const GroupBlocks&) const = default;
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
//
// A plan may also hold its runs compressed into groups (LayerPlan with groups on; PlanTransfer
// never makes any): the transfer is then `runs` followed by the rows of `groups`, and the rows
// in order are the runs the plan would have held, with every property above. A layer planned
// as blocks of groups (PlanEntries::kGroupBlocks) holds them in `blocks` instead, whose groups
// in order are the groups it would have held; a plan gathered from several layers may hold runs,
// groups and blocks, each list in order.
struct Plan {
  std::vector<Run> runs;
  std::vector<RunGroup> groups;
  std::vector<GroupBlocks> blocks;
  uint64_t group_rows = 0;  // rows of all groups, those in blocks included
  uint64_t bytes = 0;       // sum of run and row lengths
  // The runs the plan stands for, groups expanded.
  uint64_t run_count() const { return runs.size() + group_rows; }
};

// What LayerPlan may compress a layer's runs into, as far as the copier of its batches takes:
// runs only, run groups (Transport::takes_run_groups), or blocks of run groups
// (Transport::takes_group_blocks).
enum class PlanEntries { kRuns, kGroups, kGroupBlocks };

// Appends `runs` to *groups, compressed: each group takes the longest stretch of consecutive
// runs of one length at constant strides, so expanding the groups in order gives `runs` back.
// O(runs). Returns the groups added.
size_t GroupRuns(std::span<const Run> runs, std::vector<RunGroup>* groups);
// Appends the rows of `groups`, in order, to *runs.
void ExpandGroups(std::span<const RunGroup> groups, std::vector<Run>* runs);
// Appends `groups` to *blocks, joined: each entry takes the longest stretch of consecutive
// groups of one shape (length, count, strides) whose offsets step by constant amounts on both
// sides and whose blocks lie clear of each other on the destination (|dst_outer_stride| at
// least a block's extent there), so expanding the entries in order gives `groups` back and no
// two rows of an entry overlap on the destination. O(groups). Returns the entries added.
size_t JoinGroups(std::span<const RunGroup> groups, std::vector<GroupBlocks>* blocks);
// Whether blocks of `g` repeated `dst_outer_stride` apart lie clear of each other on the
// destination: at least one block's extent there apart (128-bit, so no input wraps). The rule
// JoinGroups joins by and ValidateBlocks checks.
bool BlocksClearOnDestination(const RunGroup& g, int64_t dst_outer_stride);
// Appends the groups of `blocks`, in order, to *groups.
void ExpandBlocks(std::span<const GroupBlocks> blocks, std::vector<RunGroup>* groups);

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
// plans a request one layer at a time plans it once. With groups on it appends the same runs
// compressed (their expansion is PlanTransfer's runs, in order), so that a TP split's layer is
// one entry per page instead of one per token.
class LayerPlan {
 public:
  // Plans layer 0 of `spec` (its layer range is ignored); the errors of PlanTransfer.
  // With `groups`, a layer whose runs compress kMinRowsPerGroup-fold or better into groups
  // is appended as groups (to plan->groups); otherwise as runs. The groups are planned as
  // such (a page's token pattern becomes a group once, not 16 runs regrouped), so a TP
  // split's layer costs its pages, not its tokens.
  static Result<LayerPlan> Create(const KvRegion& src, const KvRegion& dst,
                                  const TransferSpec& spec, bool groups = false);
  // The same with the entries a copier takes. kGroupBlocks plans a page whose heads repeat one
  // group at one step as one entry of blocks (an LBNHC page converted to BLHNC: 8 heads of 16
  // rows, one entry instead of 8, appended to plan->blocks); other layers are planned as groups
  // and joined (JoinGroups) where that halves the entries or better. Either way a block never
  // splits a run: the rows in order are still PlanTransfer's runs.
  static Result<LayerPlan> Create(const KvRegion& src, const KvRegion& dst,
                                  const TransferSpec& spec, PlanEntries entries);
  // Appends layer `layer`'s runs (or groups, or blocks) to *plan (never joined to those already
  // there) and adds their bytes. kOutOfRange, with *plan unchanged, for a layer outside [0,
  // layers).
  Status AppendLayer(int64_t layer, Plan* plan) const;
  // AppendLayer for each layer of [begin, end), in order: what PlanTransfer plans for that range,
  // compressed as each layer is. kOutOfRange, with *plan unchanged, for a range that is empty or
  // not inside [0, layers).
  Status AppendLayers(int64_t begin, int64_t end, Plan* plan) const;
  size_t runs_per_layer() const { return layer0_.run_count(); }
  // Entries appended per layer: runs, groups or blocks, as the layer is planned.
  size_t entries_per_layer() const {
    return layer0_.runs.size() + layer0_.groups.size() + layer0_.blocks.size();
  }
  uint64_t bytes_per_layer() const { return layer0_.bytes; }
  // Whether a run of one layer ends where a run of the next starts, on both sides (a
  // blocks-first layout: a block's layers lie next to each other). Only then may PlanTransfer
  // over a range of layers join runs across them; elsewhere AppendLayers gives the same runs for
  // a fraction of the planning. False for a layer planned as groups or blocks.
  bool layers_adjoin() const { return layers_adjoin_; }

  // Below this many rows per group on average, groups are not worth a second copy path: a TP 1
  // request with random block ids pairs its 64 KiB pages two by two, a TP 1 -> 2 split groups
  // its token runs 16 to a page.
  static constexpr size_t kMinRowsPerGroup = 4;

 private:
  Plan layer0_;  // runs, groups or blocks: one of the three
  int64_t layers_ = 0;
  uint64_t src_layer_stride_ = 0;
  uint64_t dst_layer_stride_ = 0;
  bool layers_adjoin_ = false;
};

// Checks that every run lies inside [0, src_bytes) on the source and [0, dst_bytes) on the
// destination; used where runs arrive from elsewhere (a peer, a file) before they touch memory.
Status ValidateRuns(std::span<const Run> runs, uint64_t src_bytes, uint64_t dst_bytes);
// The same for every row of every group (O(groups): a group's rows lie between its first and
// last). kInvalidArgument for a group of no rows, or of several rows less than max(length, 1)
// apart on the destination: such rows overlap there (the copy would race), and without the
// bound a group could name any number of rows (dst_stride 0) for the copier to chunk or expand.
Status ValidateGroups(std::span<const RunGroup> groups, uint64_t src_bytes, uint64_t dst_bytes);
// The same for every row of every block (O(entries)): each block's group as ValidateGroups
// checks it, at least one block, and blocks clear of each other on the destination
// (|dst_outer_stride| at least a block's extent there), so no two rows overlap there and an
// entry cannot name more blocks than the destination holds.
Status ValidateBlocks(std::span<const GroupBlocks> blocks, uint64_t src_bytes, uint64_t dst_bytes);

}  // namespace kv
