// Run groups (plan.h): compressing a run list into arithmetic progressions, expanding it back,
// and bounds-checking groups without expanding them.
#include <algorithm>
#include <string>

#include "layout/plan.h"

namespace kv {

size_t GroupRuns(std::span<const Run> runs, std::vector<RunGroup>* groups) {
  const size_t before = groups->size();
  const size_t n = runs.size();
  for (size_t i = 0; i < n;) {
    const Run& first = runs[i];
    RunGroup g{first.src_offset, first.dst_offset, first.length, 1, 0, 0};
    size_t j = i + 1;
    if (j < n && runs[j].length == first.length) {
      const uint64_t src_step = runs[j].src_offset - first.src_offset;
      const uint64_t dst_step = runs[j].dst_offset - first.dst_offset;
      g.src_stride = static_cast<int64_t>(src_step);
      g.dst_stride = static_cast<int64_t>(dst_step);
      for (++j; j < n && runs[j].length == first.length &&
                runs[j].src_offset - runs[j - 1].src_offset == src_step &&
                runs[j].dst_offset - runs[j - 1].dst_offset == dst_step;
           ++j) {
      }
      g.count = j - i;
    }
    groups->push_back(g);
    i = j;
  }
  return groups->size() - before;
}

void ExpandGroups(std::span<const RunGroup> groups, std::vector<Run>* runs) {
  for (const RunGroup& g : groups) {
    for (uint64_t i = 0; i < g.count; ++i) runs->push_back(g.row(i));
  }
}

namespace {

__extension__ typedef __int128 Wide;

Wide WideMagnitude(int64_t v) {
  return v < 0 ? -static_cast<Wide>(v) : static_cast<Wide>(v);
}

// Bytes a group's rows span on one side, first row's start to last row's end.
Wide Extent(uint64_t count, uint64_t length, int64_t stride) {
  return static_cast<Wide>(count - 1) * WideMagnitude(stride) + static_cast<Wide>(length);
}

bool SameShape(const RunGroup& a, const RunGroup& b) {
  return a.length == b.length && a.count == b.count && a.src_stride == b.src_stride &&
         a.dst_stride == b.dst_stride;
}

}  // namespace

bool BlocksClearOnDestination(const RunGroup& g, int64_t dst_outer_stride) {
  return WideMagnitude(dst_outer_stride) >= Extent(g.count, g.length, g.dst_stride);
}

size_t JoinGroups(std::span<const RunGroup> groups, std::vector<GroupBlocks>* blocks) {
  const size_t before = blocks->size();
  const size_t n = groups.size();
  for (size_t i = 0; i < n;) {
    GroupBlocks b{groups[i], 1, 0, 0};
    size_t j = i + 1;
    if (j < n && SameShape(groups[j], groups[i])) {
      const uint64_t src_step = groups[j].src_offset - groups[i].src_offset;
      const uint64_t dst_step = groups[j].dst_offset - groups[i].dst_offset;
      const RunGroup& g = groups[i];
      if (BlocksClearOnDestination(g, static_cast<int64_t>(dst_step))) {
        for (++j; j < n && SameShape(groups[j], g) &&
                  groups[j].src_offset - groups[j - 1].src_offset == src_step &&
                  groups[j].dst_offset - groups[j - 1].dst_offset == dst_step;
             ++j) {
        }
        b.outer_count = j - i;
        b.src_outer_stride = static_cast<int64_t>(src_step);
        b.dst_outer_stride = static_cast<int64_t>(dst_step);
      }
    }
    blocks->push_back(b);
    i = j;
  }
  return blocks->size() - before;
}

void ExpandBlocks(std::span<const GroupBlocks> blocks, std::vector<RunGroup>* groups) {
  for (const GroupBlocks& b : blocks) {
    for (uint64_t o = 0; o < b.outer_count; ++o) groups->push_back(b.block(o));
  }
}

namespace {

// Whether every row of `g` on one side (first offset `offset`, step `stride`) lies in
// [0, bytes). The rows are affine in the row index, so the first and the last bound them all;
// 128-bit arithmetic cannot wrap for any 64-bit inputs.
bool SideFits(uint64_t offset, int64_t stride, uint64_t count, uint64_t length, uint64_t bytes) {
  const Wide first = static_cast<Wide>(offset);
  const Wide last = first + static_cast<Wide>(count - 1) * static_cast<Wide>(stride);
  const Wide lo = std::min(first, last), hi = std::max(first, last);
  return length <= bytes && lo >= 0 && hi <= static_cast<Wide>(bytes - length);
}

uint64_t Magnitude(int64_t v) {
  return v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
}

// Group i checked in full, naming what is wrong with it.
Status CheckGroup(size_t i, const RunGroup& g, uint64_t src_bytes, uint64_t dst_bytes) {
  if (g.count == 0) {
    return Status::InvalidArgument("run group " + std::to_string(i) + " has no rows");
  }
  if (g.count > 1 && Magnitude(g.dst_stride) < std::max<uint64_t>(g.length, 1)) {
    return Status::InvalidArgument("run group " + std::to_string(i) + " has rows " +
                                   std::to_string(g.dst_stride) + " bytes apart (of " +
                                   std::to_string(g.length) + ") on the destination");
  }
  const bool src_ok = SideFits(g.src_offset, g.src_stride, g.count, g.length, src_bytes);
  const bool dst_ok = SideFits(g.dst_offset, g.dst_stride, g.count, g.length, dst_bytes);
  if (!src_ok || !dst_ok) {
    return Status::OutOfRange("run group " + std::to_string(i) + " (" + std::to_string(g.count) +
                              " rows of " + std::to_string(g.length) + " bytes from " +
                              std::to_string(g.src_offset) + " step " +
                              std::to_string(g.src_stride) + " -> " + std::to_string(g.dst_offset) +
                              " step " + std::to_string(g.dst_stride) + ") reaches outside the " +
                              (src_ok ? "destination (" + std::to_string(dst_bytes)
                                      : "source (" + std::to_string(src_bytes)) +
                              " bytes)");
  }
  return Status::Ok();
}

// The first offsets at which groups of one shape (length, count, strides) fit: a group of the
// shape passes iff its source offset lies in [src_min, src_max] and its destination offset in
// [dst_min, dst_max]. Groups of a batch nearly always share one shape (a TP 1 -> 2 layer: pages
// of 16 rows of 2 KiB), so each group costs a comparison of its shape and four of offsets; the
// 128-bit check per group was the largest cost of a post after the encoder's divisions.
class ShapeBounds {
 public:
  // Bounds in 64-bit arithmetic, which is exact where count - 1 is below 2^30, steps below 2^32
  // in magnitude and the length below 2^62: every term is under 2^62 and no sum of two wraps.
  // Outside that domain, and for a shape no group may have (no rows, rows overlapping on the
  // destination), the bounds admit no offset: such groups go to CheckGroup.
  ShapeBounds(const RunGroup& g, uint64_t src_bytes, uint64_t dst_bytes)
      : length_(g.length), count_(g.count), src_stride_(g.src_stride), dst_stride_(g.dst_stride) {
    const uint64_t rows = g.count - 1;  // 2^64 - 1 for no rows: outside the domain
    const uint64_t src_step = Magnitude(g.src_stride), dst_step = Magnitude(g.dst_stride);
    const bool narrow = (rows >> 30 | (src_step | dst_step) >> 32 | g.length >> 62) == 0;
    const bool apart = rows == 0 || dst_step >= std::max<uint64_t>(g.length, 1);
    if (!narrow || !apart) return;
    // Rows reach `below` bytes under the first offset (a negative step) or `above` over it.
    auto side = [&](int64_t stride, uint64_t step, uint64_t bytes, uint64_t* min, uint64_t* max) {
      const uint64_t span = rows * step;
      const uint64_t below = stride < 0 ? span : 0, above = span - below;
      if (above + g.length > bytes) return false;
      *min = below;
      *max = bytes - above - g.length;
      return *min <= *max;
    };
    if (side(g.src_stride, src_step, src_bytes, &src_min_, &src_max_) &&
        side(g.dst_stride, dst_step, dst_bytes, &dst_min_, &dst_max_)) {
      return;
    }
    src_min_ = 1;
    src_max_ = 0;
  }

  bool Matches(const RunGroup& g) const {
    return g.length == length_ && g.count == count_ && g.src_stride == src_stride_ &&
           g.dst_stride == dst_stride_;
  }
  // For a group that Matches: true means CheckGroup's Ok; false sends it to CheckGroup.
  bool Fits(const RunGroup& g) const {
    return (g.src_offset >= src_min_) & (g.src_offset <= src_max_) & (g.dst_offset >= dst_min_) &
           (g.dst_offset <= dst_max_);
  }

 private:
  uint64_t length_, count_;
  int64_t src_stride_, dst_stride_;
  uint64_t src_min_ = 1, src_max_ = 0, dst_min_ = 1, dst_max_ = 0;  // none yet
};

}  // namespace

Status ValidateGroups(std::span<const RunGroup> groups, uint64_t src_bytes, uint64_t dst_bytes) {
  if (groups.empty()) return Status::Ok();
  ShapeBounds bounds(groups[0], src_bytes, dst_bytes);
  for (size_t i = 0; i < groups.size(); ++i) {
    const RunGroup& g = groups[i];
    if (!bounds.Matches(g)) bounds = ShapeBounds(g, src_bytes, dst_bytes);
    if (bounds.Fits(g)) continue;
    KV_RETURN_IF_ERROR(CheckGroup(i, g, src_bytes, dst_bytes));
  }
  return Status::Ok();
}

namespace {

// Whether every row of every block of `b` on one side (first row at `offset`, rows `stride`
// apart, blocks `outer_stride` apart) lies in [0, bytes). Offsets are affine in the row and the
// block index, so the extreme corners bound them all; with both counts below 2^62 no term
// passes 2^125, so 128-bit sums cannot wrap.
bool BlocksFit(const GroupBlocks& b, uint64_t offset, int64_t stride, int64_t outer_stride,
               uint64_t bytes) {
  const Wide inner = static_cast<Wide>(b.group.count - 1) * static_cast<Wide>(stride);
  const Wide outer = static_cast<Wide>(b.outer_count - 1) * static_cast<Wide>(outer_stride);
  const Wide lo = static_cast<Wide>(offset) + std::min<Wide>(inner, 0) + std::min<Wide>(outer, 0);
  const Wide hi = static_cast<Wide>(offset) + std::max<Wide>(inner, 0) + std::max<Wide>(outer, 0) +
                  static_cast<Wide>(b.group.length);
  return lo >= 0 && hi <= static_cast<Wide>(bytes);
}

}  // namespace

namespace {

// The first offsets at which entries of one shape (a block's group shape, the block count and
// the outer strides) pass, as ShapeBounds has them for groups: a batch's entries nearly all
// share one shape (a page's 8 heads), so each costs a comparison of its shape and four of its
// offsets instead of the 128-bit checks.
class BlockShapeBounds {
 public:
  BlockShapeBounds() = default;
  // A shape that no entry may have (CheckBlock would refuse every offset) admits no offset.
  BlockShapeBounds(const GroupBlocks& b, uint64_t src_bytes, uint64_t dst_bytes) : shape_(b) {
    const RunGroup& g = b.group;
    if (!ShapeOk(b)) return;
    if (Side(g.count, g.length, g.src_stride, b.outer_count, b.src_outer_stride, src_bytes,
             &src_min_, &src_max_) &&
        Side(g.count, g.length, g.dst_stride, b.outer_count, b.dst_outer_stride, dst_bytes,
             &dst_min_, &dst_max_)) {
      return;
    }
    src_min_ = 1;
    src_max_ = 0;
  }

  bool Matches(const GroupBlocks& b) const {
    return SameShape(b.group, shape_.group) && b.outer_count == shape_.outer_count &&
           b.src_outer_stride == shape_.src_outer_stride &&
           b.dst_outer_stride == shape_.dst_outer_stride;
  }
  bool Fits(const GroupBlocks& b) const {
    const RunGroup& g = b.group;
    return (g.src_offset >= src_min_) & (g.src_offset <= src_max_) & (g.dst_offset >= dst_min_) &
           (g.dst_offset <= dst_max_);
  }

  static constexpr uint64_t kMaxCount = uint64_t{1} << 62;
  // Counts that keep every product below 2^125, at least one row and block, rows and blocks
  // clear of each other on the destination.
  static bool ShapeOk(const GroupBlocks& b) {
    const RunGroup& g = b.group;
    return b.outer_count > 0 && b.outer_count < kMaxCount && g.count > 0 && g.count < kMaxCount &&
           (g.count == 1 || WideMagnitude(g.dst_stride) >= std::max<uint64_t>(g.length, 1)) &&
           (b.outer_count == 1 || BlocksClearOnDestination(g, b.dst_outer_stride));
  }

 private:
  // First offsets in [*min, *max] put every row of every block inside [0, bytes).
  static bool Side(uint64_t count, uint64_t length, int64_t stride, uint64_t outer_count,
                   int64_t outer_stride, uint64_t bytes, uint64_t* min, uint64_t* max) {
    const Wide inner = static_cast<Wide>(count - 1) * static_cast<Wide>(stride);
    const Wide outer = static_cast<Wide>(outer_count - 1) * static_cast<Wide>(outer_stride);
    const Wide below = -std::min<Wide>(inner, 0) - std::min<Wide>(outer, 0);
    const Wide above = std::max<Wide>(inner, 0) + std::max<Wide>(outer, 0) + length;
    if (below + above > static_cast<Wide>(bytes)) return false;
    *min = static_cast<uint64_t>(below);
    *max = static_cast<uint64_t>(static_cast<Wide>(bytes) - above);
    return true;
  }

  GroupBlocks shape_{};
  uint64_t src_min_ = 1, src_max_ = 0, dst_min_ = 1, dst_max_ = 0;  // none
};

}  // namespace

Status ValidateBlocks(std::span<const GroupBlocks> blocks, uint64_t src_bytes, uint64_t dst_bytes) {
  if (blocks.empty()) return Status::Ok();
  constexpr uint64_t kMaxCount = BlockShapeBounds::kMaxCount;
  BlockShapeBounds bounds(blocks[0], src_bytes, dst_bytes);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const GroupBlocks& b = blocks[i];
    if (!bounds.Matches(b)) bounds = BlockShapeBounds(b, src_bytes, dst_bytes);
    if (bounds.Fits(b)) continue;
    // Refused: the checks below name why.
    const RunGroup& g = b.group;
    auto name = [i] { return "block entry " + std::to_string(i); };
    if (b.outer_count == 0 || b.outer_count >= kMaxCount || g.count >= kMaxCount) {
      return Status::InvalidArgument(name() + " has " + std::to_string(b.outer_count) +
                                     " blocks of " + std::to_string(g.count) + " rows");
    }
    if (Status s = CheckGroup(i, g, src_bytes, dst_bytes); !s.ok()) return s.WithContext(name());
    if (b.outer_count > 1 && !BlocksClearOnDestination(g, b.dst_outer_stride)) {
      return Status::InvalidArgument(name() + " has blocks " + std::to_string(b.dst_outer_stride) +
                                     " bytes apart on the destination, closer than a block's " +
                                     "extent: their rows would overlap");
    }
    if (!BlocksFit(b, g.src_offset, g.src_stride, b.src_outer_stride, src_bytes) ||
        !BlocksFit(b, g.dst_offset, g.dst_stride, b.dst_outer_stride, dst_bytes)) {
      return Status::OutOfRange(
          name() + " (" + std::to_string(b.outer_count) + " blocks " +
          std::to_string(b.src_outer_stride) + " -> " + std::to_string(b.dst_outer_stride) +
          " bytes apart) reaches outside the source (" + std::to_string(src_bytes) +
          " bytes) or the destination (" + std::to_string(dst_bytes) + " bytes)");
    }
    // Unreachable: an entry that fails the bounds fails a check above.
    return Status::Internal(std::string("block entry ") + std::to_string(i) + " refused");
  }
  return Status::Ok();
}

}  // namespace kv
