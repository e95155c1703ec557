// LayerPlan (plan.h): layer 0 planned once per request, as runs, groups or blocks of groups,
// and shifted to any layer.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "layout/plan.h"
#include "layout/plan_into.h"

namespace kv {

using internal::Blocks;
using internal::PlanInto;

namespace {

// Whether a run of some layer ends where a run of another starts, on both sides: the only runs
// PlanTransfer over a range of layers could join across them. Layer a's run r and layer a + k's
// run q abut when r's end is q's start shifted by k strides on each side; the offsets bound k, so
// a layers-first plan (strides spanning the whole cache) has at most k = 1 to look up. Where k
// could be 2 or more (blocks-first), it says they may, and the range is planned whole as before.
bool RunsAdjoinAcrossLayers(std::span<const Run> runs, int64_t layers, uint64_t src_stride,
                            uint64_t dst_stride) {
  if (runs.empty() || layers < 2) return false;
  if (src_stride == 0 || dst_stride == 0) return true;  // no bound: say they may
  const auto s = static_cast<int64_t>(src_stride), d = static_cast<int64_t>(dst_stride);
  int64_t min_src = INT64_MAX, max_src = 0, min_src_end = INT64_MAX, max_src_end = 0;
  int64_t min_dst = INT64_MAX, max_dst = 0, min_dst_end = INT64_MAX, max_dst_end = 0;
  std::vector<std::pair<int64_t, int64_t>> starts;
  starts.reserve(runs.size());
  for (const Run& r : runs) {
    const auto src = static_cast<int64_t>(r.src_offset), dst = static_cast<int64_t>(r.dst_offset);
    const auto length = static_cast<int64_t>(r.length);
    min_src = std::min(min_src, src), max_src = std::max(max_src, src);
    min_dst = std::min(min_dst, dst), max_dst = std::max(max_dst, dst);
    min_src_end = std::min(min_src_end, src + length);
    max_src_end = std::max(max_src_end, src + length);
    min_dst_end = std::min(min_dst_end, dst + length);
    max_dst_end = std::max(max_dst_end, dst + length);
    starts.emplace_back(src, dst);
  }
  // end - start lies in [lo, hi] on each side, and must be k strides.
  auto floor_div = [](int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0); };
  auto ceil_div = [&](int64_t a, int64_t b) { return -floor_div(-a, b); };
  const int64_t k_lo = std::max(
      {ceil_div(min_src_end - max_src, s), ceil_div(min_dst_end - max_dst, d), -(layers - 1)});
  const int64_t k_hi = std::min(
      {floor_div(max_src_end - min_src, s), floor_div(max_dst_end - min_dst, d), layers - 1});
  if (k_lo > k_hi || (k_lo == 0 && k_hi == 0)) return false;
  // Layers two or more apart could abut (a blocks-first layout): say they may rather than search
  // every distance.
  if (k_lo < -1 || k_hi > 1) return true;
  std::sort(starts.begin(), starts.end());
  for (int64_t k = k_lo; k <= k_hi; ++k) {
    if (k == 0) continue;  // within a layer: PlanTransfer of the layer joined those already
    for (const Run& r : runs) {
      const auto length = static_cast<int64_t>(r.length);
      const std::pair<int64_t, int64_t> start{static_cast<int64_t>(r.src_offset) + length - k * s,
                                              static_cast<int64_t>(r.dst_offset) + length - k * d};
      if (std::binary_search(starts.begin(), starts.end(), start)) return true;
    }
  }
  return false;
}

}  // namespace

Result<LayerPlan> LayerPlan::Create(const KvRegion& src, const KvRegion& dst,
                                    const TransferSpec& spec, bool groups) {
  return Create(src, dst, spec, groups ? PlanEntries::kGroups : PlanEntries::kRuns);
}

Result<LayerPlan> LayerPlan::Create(const KvRegion& src, const KvRegion& dst,
                                    const TransferSpec& spec, PlanEntries entries) {
  const bool groups = entries != PlanEntries::kRuns;
  TransferSpec first = spec;
  first.layer_begin = 0;
  first.layer_end = std::min<int64_t>(1, src.size(Axis::kL));
  LayerPlan plan;
  plan.layers_ = src.size(Axis::kL);
  plan.src_layer_stride_ = static_cast<uint64_t>(src.stride(Axis::kL));
  plan.dst_layer_stride_ = static_cast<uint64_t>(dst.stride(Axis::kL));
  Plan& layer0 = plan.layer0_;
  Blocks blocks = entries == PlanEntries::kGroupBlocks ? Blocks::kAsk : Blocks::kNo;
  KV_RETURN_IF_ERROR(PlanInto(src, dst, first, &layer0, groups, &blocks));
  if (blocks == Blocks::kAbandoned) {
    layer0 = Plan{};
    KV_RETURN_IF_ERROR(PlanInto(src, dst, first, &layer0, groups));
  }
  // Planned as blocks: kept where they at least halve the groups, else taken as groups below.
  if (!layer0.blocks.empty()) {
    uint64_t joined = 0;
    for (const GroupBlocks& b : layer0.blocks) {
      joined += b.outer_count;
      layer0.group_rows += b.outer_count * b.group.count;
    }
    if (layer0.blocks.size() * 2 <= joined) return plan;
    ExpandBlocks(layer0.blocks, &layer0.groups);
    layer0.blocks = {};
    layer0.group_rows = 0;
  }
  if (groups && !layer0.runs.empty()) {
    GroupRuns(layer0.runs, &layer0.groups);
    if (layer0.groups.size() * kMinRowsPerGroup <= layer0.runs.size()) {
      layer0.group_rows = layer0.runs.size();
      layer0.runs = {};
    } else {
      layer0.groups = {};
    }
  } else if (!layer0.groups.empty()) {
    for (const RunGroup& g : layer0.groups) layer0.group_rows += g.count;
    if (layer0.groups.size() * kMinRowsPerGroup > layer0.group_rows) {
      layer0.runs.reserve(layer0.group_rows);
      ExpandGroups(layer0.groups, &layer0.runs);
      layer0.groups = {};
      layer0.group_rows = 0;
    }
  }
  if (entries == PlanEntries::kGroupBlocks && layer0.groups.size() > 1) {
    JoinGroups(layer0.groups, &layer0.blocks);
    if (layer0.blocks.size() * 2 <= layer0.groups.size()) {
      layer0.groups = {};
    } else {
      layer0.blocks = {};
    }
  }
  plan.layers_adjoin_ = RunsAdjoinAcrossLayers(layer0.runs, plan.layers_, plan.src_layer_stride_,
                                               plan.dst_layer_stride_);
  return plan;
}

namespace {

// An entry moved by s on the source and d on the destination (a block by its first group).
template <typename Entry>
void Shift(Entry& e, uint64_t s, uint64_t d) {
  e.src_offset += s;
  e.dst_offset += d;
}
void Shift(GroupBlocks& e, uint64_t s, uint64_t d) {
  Shift(e.group, s, d);
}

}  // namespace

Status LayerPlan::AppendLayers(int64_t begin, int64_t end, Plan* plan) const {
  if (begin < 0 || begin >= end || end > layers_) {
    return Status::OutOfRange("layers [" + std::to_string(begin) + ", " + std::to_string(end) +
                              ") are not a range inside [0, " + std::to_string(layers_) + ")");
  }
  for (int64_t layer = begin; layer < end; ++layer) KV_RETURN_IF_ERROR(AppendLayer(layer, plan));
  return Status::Ok();
}

Status LayerPlan::AppendLayer(int64_t layer, Plan* plan) const {
  if (layer < 0 || layer >= layers_) {
    return Status::OutOfRange("layer " + std::to_string(layer) + " is outside [0, " +
                              std::to_string(layers_) + ")");
  }
  const uint64_t s = static_cast<uint64_t>(layer) * src_layer_stride_;
  const uint64_t d = static_cast<uint64_t>(layer) * dst_layer_stride_;
  // A plain copy, then the shift while the copy is still in cache: cheaper than writing each
  // shifted entry through push_back (a capacity check per entry) or after resize (a pass that
  // value-initialises every entry first).
  auto append = [s, d](const auto& from, auto& to) {
    const size_t at = to.size(), count = from.size();
    if (count == 0) return;
    if (to.capacity() - at < count) to.reserve(std::max(at + count, 2 * to.capacity()));
    to.insert(to.end(), from.begin(), from.end());
    for (auto* e = to.data() + at; e != to.data() + at + count; ++e) Shift(*e, s, d);
  };
  append(layer0_.runs, plan->runs);
  append(layer0_.groups, plan->groups);
  append(layer0_.blocks, plan->blocks);
  plan->group_rows += layer0_.group_rows;
  plan->bytes += layer0_.bytes;
  return Status::Ok();
}

}  // namespace kv
