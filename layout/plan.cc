// How PlanTransfer reaches the minimal run count in O(blocks + runs) work.
//
// A logical byte is (layer, token, common head, half, byte-in-piece): `half` exists only when
// either side has an S axis (K and V are then separate pieces of half the logical content),
// and a piece of either side is contiguous. Every coordinate but the token is affine on both
// sides, so the transfer is a loop nest. Tokens are cut into ranges on which both sides are
// affine too (a range ends where a block ends and the next block is not adjacent).
//
// The nest runs in the destination's physical order, so pieces come out in ascending
// destination offset. Destination bytes are written once (used destination blocks are
// distinct), so each byte pair has at most one successor (s+1, d+1): the byte mapping splits
// uniquely into maximal diagonal stretches, any valid run list needs one run per stretch, and
// appending pieces in destination order while joining a piece to the previous run whenever it
// continues it on both sides yields exactly those stretches.
//
// To keep the work proportional to the runs, the innermost loops are folded into one piece
// whenever they are contiguous on both sides, first below the token level, then (for a
// destination block filled by one token range) the loops between B and N as well. What is
// left per block is ordering the destination blocks (a radix sort) and cutting their tokens.
#include "layout/plan.h"

#include <algorithm>
#include <string>
#include <utility>

#include "layout/kv_region.h"
#include "layout/plan_into.h"

namespace kv {
namespace {

// `count` steps, each advancing the source by src_stride and the destination by dst_stride.
struct Loop {
  int64_t count;
  int64_t src_stride;
  int64_t dst_stride;
};

// Tokens on which both sides are affine: token i of the range lies at src + i·stride(N) in
// the source and dst + i·stride(N) in the destination. `group` is the destination coordinate
// of the token axis that sits outside the other one (the block when B is outside N, the slot
// otherwise): ranges of different groups are separated by the loops between B and N.
struct TokenRange {
  int64_t src;
  int64_t dst;
  int64_t count;
  int64_t group;
};

// Appends pieces in ascending destination order, joining each to the previous run when it
// continues it on both sides. Entries the plan held before are left alone.
//
// A pattern may also be appended as groups (to plan->groups), extending the last group where it
// continues that group's progression: the rows in order are exactly the runs the writer would
// have made, at a cost per group instead of per run (a TP split's page is one pattern of 16
// rows). A plan is written one way or the other, never both.
class RunWriter {
 public:
  explicit RunWriter(Plan* plan)
      : plan_(plan), first_run_(plan->runs.size()), first_group_(plan->groups.size()) {}
  void Add(int64_t src, int64_t dst, int64_t length) {
    plan_->bytes += static_cast<uint64_t>(length);
    Join(static_cast<uint64_t>(src), static_cast<uint64_t>(dst), static_cast<uint64_t>(length));
  }
  // Appends `pattern` (runs relative to its first byte, already joined among themselves, of
  // `bytes` in all) shifted to (src, dst): only its first run can join the previous one.
  void AddPattern(std::span<const Run> pattern, uint64_t bytes, int64_t src, int64_t dst) {
    plan_->bytes += bytes;
    const uint64_t s = static_cast<uint64_t>(src), d = static_cast<uint64_t>(dst);
    Join(s + pattern[0].src_offset, d + pattern[0].dst_offset, pattern[0].length);
    auto& runs = plan_->runs;
    for (const Run& r : pattern.subspan(1)) {
      runs.push_back({s + r.src_offset, d + r.dst_offset, r.length});
    }
  }
  // The same for a pattern held as groups (GroupRuns of such runs).
  void AddPattern(std::span<const RunGroup> pattern, uint64_t bytes, int64_t src, int64_t dst) {
    plan_->bytes += bytes;
    const uint64_t s = static_cast<uint64_t>(src), d = static_cast<uint64_t>(dst);
    for (RunGroup g : pattern) {
      g.src_offset += s;
      g.dst_offset += d;
      Append(g);
    }
  }

 private:
  void Join(uint64_t src, uint64_t dst, uint64_t length) {
    auto& runs = plan_->runs;
    if (runs.size() > first_run_) {
      Run& last = runs.back();
      if (last.src_offset + last.length == src && last.dst_offset + last.length == dst) {
        last.length += length;
        return;
      }
    }
    runs.push_back({src, dst, length});
  }

  void Append(RunGroup g) {
    auto& groups = plan_->groups;
    if (groups.size() == first_group_) {
      groups.push_back(g);
      return;
    }
    RunGroup& last = groups.back();
    const Run end = last.row(last.count - 1);
    if (end.src_offset + end.length == g.src_offset &&
        end.dst_offset + end.length == g.dst_offset) {
      // g's first row continues the last row: they are one run, as Join makes it. The rows of
      // a pattern after its first never continue the row before them (they are joined).
      const RunGroup joined{end.src_offset, end.dst_offset, end.length + g.length, 1, 0, 0};
      if (last.count == 1) {
        last = joined;
      } else {
        --last.count;
        groups.push_back(joined);
      }
      if (g.count > 1) {
        const Run second = g.row(1);
        groups.push_back({second.src_offset, second.dst_offset, g.length, g.count - 1, g.src_stride,
                          g.dst_stride});
      }
      return;
    }
    if (g.length == last.length) {
      const auto src_step = static_cast<int64_t>(g.src_offset - end.src_offset);
      const auto dst_step = static_cast<int64_t>(g.dst_offset - end.dst_offset);
      auto steps_as = [&](const RunGroup& o) {
        return o.count == 1 || (o.src_stride == src_step && o.dst_stride == dst_step);
      };
      if (steps_as(last) && steps_as(g)) {
        last.src_stride = src_step;
        last.dst_stride = dst_step;
        last.count += g.count;
        return;
      }
    }
    groups.push_back(g);
  }

  Plan* plan_;
  size_t first_run_, first_group_;  // entries held before, never joined to
};

template <typename Fn>
void ForEach(std::span<const Loop> loops, int64_t src, int64_t dst, const Fn& fn) {
  if (loops.empty()) {
    fn(src, dst);
    return;
  }
  const Loop& loop = loops.front();
  for (int64_t i = 0; i < loop.count; ++i) {
    ForEach(loops.subspan(1), src + i * loop.src_stride, dst + i * loop.dst_stride, fn);
  }
}

// Folds the innermost loops into `*unit` while they are contiguous on both sides.
void FoldContiguous(std::vector<Loop>& loops, int64_t* unit) {
  while (!loops.empty() && loops.back().src_stride == *unit && loops.back().dst_stride == *unit) {
    *unit *= loops.back().count;
    loops.pop_back();
  }
}

// Blocks holding `tokens` tokens: ceil(tokens / block_size), without the wrap of tokens + N - 1
// for a token count near 2^63 (tokens come from the wire).
int64_t BlocksFor(int64_t tokens, int64_t block_size) {
  return tokens / block_size + (tokens % block_size != 0);
}

Status CheckBlockIds(const char* side, std::span<const int64_t> ids, int64_t blocks) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= blocks)
      return Status::OutOfRange(std::string(side) + " block id " + std::to_string(ids[i]) +
                                " (position " + std::to_string(i) + ") is outside [0, " +
                                std::to_string(blocks) + ")");
  }
  return Status::Ok();
}

Status CheckBlockCount(const char* side, size_t given, int64_t tokens, int64_t block_size) {
  const int64_t needed = BlocksFor(tokens, block_size);
  if (static_cast<int64_t>(given) >= needed) return Status::Ok();
  return Status::InvalidArgument("too few " + std::string(side) +
                                 " blocks: " + std::to_string(tokens) + " tokens in blocks of " +
                                 std::to_string(block_size) + " need " + std::to_string(needed) +
                                 ", got " + std::to_string(given));
}

// Sorts (block id, position) pairs by id, 8 bits a pass up to the largest id. Ids are small
// non-negative integers, and a comparison sort here was half of planning one layer.
void RadixSortById(std::vector<std::pair<int64_t, int64_t>>& pairs, int64_t max_id) {
  std::vector<std::pair<int64_t, int64_t>> sorted(pairs.size());
  for (int shift = 0; shift < 64 && (max_id >> shift) > 0; shift += 8) {
    size_t starts[257] = {};
    for (const auto& p : pairs) ++starts[((p.first >> shift) & 0xff) + 1];
    for (int digit = 0; digit < 256; ++digit) starts[digit + 1] += starts[digit];
    for (const auto& p : pairs) sorted[starts[(p.first >> shift) & 0xff]++] = p;
    pairs.swap(sorted);
  }
}

Status BlockUsedTwice(int64_t block) {
  return Status::InvalidArgument("destination block " + std::to_string(block) +
                                 " is used twice: its bytes would be written twice");
}

// Positions in spec.dst_blocks of the blocks that tokens use, in ascending block id, so in
// ascending destination offset when B is outside N. Each destination byte must be written once,
// so a block used twice is an error.
Result<std::vector<int64_t>> DestinationOrder(const TransferSpec& spec, int64_t block_size,
                                              int64_t max_id) {
  const auto used = spec.dst_blocks.first(BlocksFor(spec.tokens, block_size));
  std::vector<int64_t> order(used.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int64_t>(j);
  if (std::is_sorted(used.begin(), used.end())) {
    auto twice = std::adjacent_find(used.begin(), used.end());
    if (twice != used.end()) return BlockUsedTwice(*twice);
    return order;
  }
  std::vector<std::pair<int64_t, int64_t>> by_id(used.size());
  for (size_t j = 0; j < used.size(); ++j) by_id[j] = {used[j], static_cast<int64_t>(j)};
  RadixSortById(by_id, max_id);
  for (size_t i = 0; i < by_id.size(); ++i) {
    if (i > 0 && by_id[i].first == by_id[i - 1].first) return BlockUsedTwice(by_id[i].first);
    order[i] = by_id[i].second;
  }
  return order;
}

Status CheckCompatible(const KvRegion& src, const KvRegion& dst) {
  if (src.size(Axis::kL) != dst.size(Axis::kL))
    return Status::Incompatible("different layer counts: source " +
                                std::to_string(src.size(Axis::kL)) + ", destination " +
                                std::to_string(dst.size(Axis::kL)));
  if (src.logical_content_bytes() != dst.logical_content_bytes())
    return Status::Incompatible(
        "different logical content sizes: source " + std::to_string(src.logical_content_bytes()) +
        " bytes per head-token, destination " + std::to_string(dst.logical_content_bytes()));
  if (src.total_heads() != dst.total_heads())
    return Status::Incompatible("different total head counts: source " +
                                std::to_string(src.total_heads()) + ", destination " +
                                std::to_string(dst.total_heads()));
  return Status::Ok();
}

// Cuts [0, tokens) where a block of either side ends, joins neighbours (in destination order)
// that stay affine on both sides, and returns the ranges in ascending destination order.
std::vector<TokenRange> TokenRanges(const KvRegion& src, const KvRegion& dst,
                                    const TransferSpec& spec, std::span<const int64_t> dst_order,
                                    bool slot_outside_block, bool join_groups) {
  const int64_t ns = src.size(Axis::kN), nd = dst.size(Axis::kN);
  const int64_t src_n = src.stride(Axis::kN), dst_n = dst.stride(Axis::kN);
  std::vector<TokenRange> pieces;
  pieces.reserve(dst_order.size() + spec.tokens / ns + 1);
  // Tokens [begin, end) of one destination block (begin is its slot 0), cut where source
  // blocks end.
  auto cut = [&](int64_t begin, int64_t end) {
    const int64_t block_d = spec.dst_blocks[begin / nd];
    int64_t src_block = begin / ns, slot_s = begin % ns;
    for (int64_t t = begin; t < end;) {
      const int64_t count = std::min(ns - slot_s, end - t);
      const int64_t slot_d = t - begin;
      const int64_t src0 = spec.src_blocks[src_block] * src.stride(Axis::kB) + slot_s * src_n;
      const int64_t dst0 = block_d * dst.stride(Axis::kB) + slot_d * dst_n;
      if (slot_outside_block) {
        // Slots of one block are not neighbours in destination order: one range per token.
        for (int64_t i = 0; i < count; ++i)
          pieces.push_back({src0 + i * src_n, dst0 + i * dst_n, 1, slot_d + i});
      } else {
        pieces.push_back({src0, dst0, count, block_d});
      }
      t += count;
      slot_s += count;
      if (slot_s == ns) {
        slot_s = 0;
        ++src_block;
      }
    }
  };
  for (int64_t j : dst_order) cut(j * nd, std::min((j + 1) * nd, spec.tokens));
  if (slot_outside_block) {
    std::sort(pieces.begin(), pieces.end(),
              [](const TokenRange& a, const TokenRange& b) { return a.dst < b.dst; });
  }
  std::vector<TokenRange> ranges;
  for (const TokenRange& p : pieces) {
    if (!ranges.empty()) {
      TokenRange& last = ranges.back();
      if ((join_groups || last.group == p.group) && last.dst + last.count * dst_n == p.dst &&
          last.src + last.count * src_n == p.src) {
        last.count += p.count;
        continue;
      }
    }
    ranges.push_back(p);
  }
  return ranges;
}

// The transfer's loops in the destination's physical order, outermost first: those outside its
// B and N axes, those between them, and those inside. Loops of one step are left out.
struct Nest {
  std::vector<Loop> outer, middle, inner;
  bool slot_outside_block = false;  // N comes before B in the destination
};

Nest BuildNest(const KvRegion& dst, const Loop& layers, const Loop& heads, const Loop& halves) {
  Nest nest;
  std::vector<Loop>* level[] = {&nest.outer, &nest.middle, &nest.inner};
  int depth = 0;
  for (char axis : dst.order()) {
    const Loop* loop = nullptr;
    switch (axis) {
      case 'L':
        loop = &layers;
        break;
      case 'H':
        loop = &heads;
        break;
      case 'S':
        loop = &halves;
        break;
      case 'C':
        loop = dst.has_kv_axis() ? nullptr : &halves;
        break;  // K, V: halves of C
      case 'N':
        nest.slot_outside_block = depth == 0;
        [[fallthrough]];
      case 'B':
        ++depth;
        break;
    }
    if (loop != nullptr && loop->count > 1) level[depth]->push_back(*loop);
  }
  return nest;
}

// Global heads [first, second) held by both regions; empty when first >= second.
std::pair<int64_t, int64_t> CommonHeads(const KvRegion& src, const KvRegion& dst) {
  return {std::max(src.first_global_head(), dst.first_global_head()),
          std::min(src.first_global_head() + src.size(Axis::kH),
                   dst.first_global_head() + dst.size(Axis::kH))};
}

// Everything PlanTransfer checks before it looks at a byte.
Status ValidateRequest(const KvRegion& src, const KvRegion& dst, const TransferSpec& spec) {
  KV_RETURN_IF_ERROR(CheckCompatible(src, dst));
  const int64_t layers = src.size(Axis::kL);
  const int64_t layer_end = spec.layer_end == -1 ? layers : spec.layer_end;
  if (spec.layer_begin < 0 || spec.layer_begin > layer_end || layer_end > layers)
    return Status::InvalidArgument("layer range [" + std::to_string(spec.layer_begin) + ", " +
                                   std::to_string(spec.layer_end) + ") is not inside [0, " +
                                   std::to_string(layers) + "]");
  if (spec.tokens < 0)
    return Status::InvalidArgument("tokens must not be negative, got " +
                                   std::to_string(spec.tokens));
  KV_RETURN_IF_ERROR(CheckBlockIds("source", spec.src_blocks, src.size(Axis::kB)));
  KV_RETURN_IF_ERROR(CheckBlockIds("destination", spec.dst_blocks, dst.size(Axis::kB)));
  KV_RETURN_IF_ERROR(
      CheckBlockCount("source", spec.src_blocks.size(), spec.tokens, src.size(Axis::kN)));
  KV_RETURN_IF_ERROR(
      CheckBlockCount("destination", spec.dst_blocks.size(), spec.tokens, dst.size(Axis::kN)));

  const auto [head_begin, head_end] = CommonHeads(src, dst);
  if (head_begin >= head_end)
    return Status::Incompatible(
        "no head in common: source holds global heads [" + std::to_string(src.first_global_head()) +
        ", " + std::to_string(src.first_global_head() + src.size(Axis::kH)) + "), destination [" +
        std::to_string(dst.first_global_head()) + ", " +
        std::to_string(dst.first_global_head() + dst.size(Axis::kH)) + ")");
  return Status::Ok();
}

// Reserves room for every piece the nest can emit (each becomes at most one run), so that
// appending never reallocates; capacity at least doubles, so repeated appends stay amortised.
// Past kMaxReservedRuns the vector grows as it fills instead: a bound that counts mostly pieces
// that merge must not reserve gigabytes.
void ReservePieces(Plan* plan, std::span<const Loop> outer, std::span<const Loop> middle,
                   std::span<const Loop> inner, std::span<const TokenRange> ranges,
                   bool fold_tokens) {
  constexpr uint64_t kMaxReservedRuns = uint64_t{1} << 22;
  uint64_t pieces = 0;
  for (const TokenRange& r : ranges) pieces += fold_tokens ? 1 : static_cast<uint64_t>(r.count);
  for (std::span<const Loop> loops :
       {outer, middle, fold_tokens ? std::span<const Loop>() : inner}) {
    for (const Loop& loop : loops) {
      const uint64_t count = static_cast<uint64_t>(loop.count);
      if (pieces > kMaxReservedRuns / count) return;
      pieces *= count;
    }
  }
  auto& runs = plan->runs;
  if (pieces > kMaxReservedRuns || runs.capacity() - runs.size() >= pieces) return;
  runs.reserve(std::max<size_t>(runs.size() + pieces, 2 * runs.capacity()));
}

// Whether `b`'s rows are the runs its groups expanded would be: its blocks lie apart on the
// destination, and no block's first row continues the row before it (the previous block's last,
// or `before`, the last row already written, if any), where runs would have been joined.
bool BlockKeepsRuns(const GroupBlocks& b, const Run* before) {
  const RunGroup& g = b.group;
  if (b.outer_count > 1 && !BlocksClearOnDestination(g, b.dst_outer_stride)) return false;
  auto continues = [](const Run& a, const Run& next) {
    return a.src_offset + a.length == next.src_offset && a.dst_offset + a.length == next.dst_offset;
  };
  if (before != nullptr && continues(*before, g.row(0))) return false;
  return b.outer_count == 1 || !continues(g.row(g.count - 1), b.block(1).row(0));
}

}  // namespace

namespace internal {

Status PlanInto(const KvRegion& src, const KvRegion& dst, const TransferSpec& spec, Plan* plan,
                bool groups, Blocks* blocks) {
  KV_RETURN_IF_ERROR(ValidateRequest(src, dst, spec));
  KV_ASSIGN_OR_RETURN(const std::vector<int64_t> dst_order,
                      DestinationOrder(spec, dst.size(Axis::kN), dst.size(Axis::kB) - 1));
  const int64_t layer_end = spec.layer_end == -1 ? src.size(Axis::kL) : spec.layer_end;
  const auto [head_begin, head_end] = CommonHeads(src, dst);
  if (spec.tokens == 0 || spec.layer_begin == layer_end) return Status::Ok();

  // A half is K or V when either side keeps them apart; otherwise the whole logical content.
  const bool split = src.has_kv_axis() || dst.has_kv_axis();
  const int64_t halves = split ? 2 : 1;
  const int64_t piece = src.logical_content_bytes() / halves;
  auto half_stride = [&](const KvRegion& r) {
    return r.has_kv_axis() ? r.stride(Axis::kS) : piece;
  };
  const Loop layer_loop{layer_end - spec.layer_begin, src.stride(Axis::kL), dst.stride(Axis::kL)};
  const Loop head_loop{head_end - head_begin, src.stride(Axis::kH), dst.stride(Axis::kH)};
  const Loop half_loop{halves, half_stride(src), half_stride(dst)};

  Nest nest = BuildNest(dst, layer_loop, head_loop, half_loop);
  std::vector<Loop>& outer = nest.outer;
  std::vector<Loop>& middle = nest.middle;
  std::vector<Loop>& inner = nest.inner;
  const bool slot_outside_block = nest.slot_outside_block;

  const std::vector<TokenRange> ranges =
      TokenRanges(src, dst, spec, dst_order, slot_outside_block, middle.empty());

  const int64_t src_n = src.stride(Axis::kN), dst_n = dst.stride(Axis::kN);
  int64_t token_bytes = piece;
  FoldContiguous(inner, &token_bytes);
  const bool fold_tokens = inner.empty() && src_n == token_bytes && dst_n == token_bytes;
  // A destination block filled by one token range is a box; fold the loops around it too.
  const int64_t nd = dst.size(Axis::kN);
  std::vector<Loop> middle_rest = middle;
  int64_t block_bytes = nd * token_bytes;
  if (fold_tokens && !slot_outside_block) FoldContiguous(middle_rest, &block_bytes);
  const bool fold_blocks = middle_rest.size() < middle.size();

  // Groups are written as such only where ranges replicate a pattern (a TP split's page);
  // elsewhere a range is one run, and LayerPlan groups them after if that pays.
  const bool write_groups = groups && !fold_tokens;
  if (!write_groups) ReservePieces(plan, outer, middle, inner, ranges, fold_tokens);

  const int64_t src_base =
      spec.layer_begin * src.stride(Axis::kL) + src.local_head(head_begin) * src.stride(Axis::kH);
  const int64_t dst_base =
      spec.layer_begin * dst.stride(Axis::kL) + dst.local_head(head_begin) * dst.stride(Axis::kH);
  RunWriter writer(plan);
  auto add_piece = [&](int64_t length) {
    return [&writer, length](int64_t s, int64_t d) { writer.Add(s, d, length); };
  };
  const auto add_block_piece = add_piece(block_bytes);
  // A range's pieces relative to its first byte depend on its token count alone: most ranges
  // are one whole block, so their pieces are planned once and replicated by offset.
  Plan pattern;
  std::vector<RunGroup> pattern_groups;
  int64_t pattern_count = -1;
  auto plan_pattern = [&](int64_t count) {
    if (count == pattern_count) return;
    pattern = Plan{};
    RunWriter relative(&pattern);
    for (int64_t i = 0; i < count; ++i) {
      ForEach(inner, i * src_n, i * dst_n,
              [&](int64_t ps, int64_t pd) { relative.Add(ps, pd, token_bytes); });
    }
    pattern_count = count;
    pattern_groups.clear();
    if (write_groups) GroupRuns(pattern.runs, &pattern_groups);
  };
  auto emit_range = [&](const TokenRange& r, int64_t s, int64_t d) {
    if (fold_tokens) {
      writer.Add(s + r.src, d + r.dst, r.count * token_bytes);
      return;
    }
    plan_pattern(r.count);
    if (write_groups) {
      writer.AddPattern(pattern_groups, pattern.bytes, s + r.src, d + r.dst);
    } else {
      writer.AddPattern(pattern.runs, pattern.bytes, s + r.src, d + r.dst);
    }
  };
  // A page of one token range whose heads (the one middle loop) repeat its one group: a block.
  const bool write_blocks = write_groups && blocks != nullptr && *blocks == Blocks::kAsk &&
                            middle.size() == 1 && middle[0].count > 1 && plan->runs.empty() &&
                            plan->groups.empty() && plan->blocks.empty();
  if (blocks != nullptr) *blocks = write_blocks ? Blocks::kWritten : Blocks::kNo;
  auto emit_block = [&](const TokenRange& r, int64_t s, int64_t d) {
    plan_pattern(r.count);
    if (pattern_groups.size() != 1) return false;
    GroupBlocks b{pattern_groups[0], static_cast<uint64_t>(middle[0].count), middle[0].src_stride,
                  middle[0].dst_stride};
    b.group.src_offset += static_cast<uint64_t>(s + r.src);
    b.group.dst_offset += static_cast<uint64_t>(d + r.dst);
    Run before;
    if (!plan->blocks.empty()) {
      const GroupBlocks& last = plan->blocks.back();
      before = last.block(last.outer_count - 1).row(last.group.count - 1);
    }
    if (!BlockKeepsRuns(b, plan->blocks.empty() ? nullptr : &before)) return false;
    plan->blocks.push_back(b);
    plan->bytes += pattern.bytes * b.outer_count;
    return true;
  };
  ForEach(outer, src_base, dst_base, [&](int64_t s, int64_t d) {
    if (write_blocks) {
      for (const TokenRange& r : ranges) {
        if (*blocks != Blocks::kWritten) return;
        const bool alone = (&r == &ranges.front() || (&r)[-1].group != r.group) &&
                           (&r == &ranges.back() || (&r)[1].group != r.group);
        if (!alone || !emit_block(r, s, d)) *blocks = Blocks::kAbandoned;
      }
      return;
    }
    if (middle.empty()) {
      for (const TokenRange& r : ranges) emit_range(r, s, d);
      return;
    }
    for (size_t begin = 0; begin < ranges.size();) {
      size_t end = begin + 1;
      while (end < ranges.size() && ranges[end].group == ranges[begin].group) ++end;
      const std::span<const TokenRange> group(ranges.data() + begin, end - begin);
      if (fold_blocks && group.size() == 1 && group[0].count == nd) {
        ForEach(middle_rest, s + group[0].src, d + group[0].dst, add_block_piece);
      } else {
        ForEach(middle, s, d, [&](int64_t ms, int64_t md) {
          for (const TokenRange& r : group) emit_range(r, ms, md);
        });
      }
      begin = end;
    }
  });
  return Status::Ok();
}

}  // namespace internal

Status PlanTransfer(const KvRegion& src, const KvRegion& dst, const TransferSpec& spec,
                    Plan* plan) {
  return internal::PlanInto(src, dst, spec, plan, /*groups=*/false);
}

Result<Plan> PlanTransfer(const KvRegion& src, const KvRegion& dst, const TransferSpec& spec) {
  Plan plan;
  KV_RETURN_IF_ERROR(PlanTransfer(src, dst, spec, &plan));
  return plan;
}

}  // namespace kv
