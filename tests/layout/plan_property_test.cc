// Plans thousands of random small transfers and compares each with the byte-by-byte reference:
// the same bytes, each destination byte once, runs in destination order, and the minimal count.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "layout/kv_region.h"
#include "layout/plan.h"
#include "tests/support/plan_reference.h"

namespace kv {
namespace {

using testing::CountStretches;
using testing::HeldLocally;
using testing::PlanBytes;
using testing::ReferenceBytes;

class Gen {
 public:
  explicit Gen(uint32_t seed) : rng_(seed) {}
  int64_t Int(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool Chance(int percent) { return Int(0, 99) < percent; }
  template <typename T>
  T Pick(std::initializer_list<T> items) {
    return *(items.begin() + Int(0, static_cast<int64_t>(items.size()) - 1));
  }

  // A standard order, a legacy one, or any permutation (S before C when present).
  std::string Order(bool with_s) {
    if (Chance(50)) {
      if (with_s) return Pick<std::string>({"SBNHC", "BSNHC", "LSBNHC", "BLSHNC"});
      return Pick<std::string>({"LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"});
    }
    std::string axes = with_s ? "LBHNS" : "LBHN";
    std::shuffle(axes.begin(), axes.end(), rng_);
    if (Chance(20)) axes.erase(axes.find('L'), 1);
    return axes + "C";
  }

  // Pads up to two random axes beyond their dense stride, inner one first so that the outer
  // one's dense stride already includes the inner padding.
  void Pad(LayoutSpec& spec) {
    auto dense = KvRegion::Create(spec);
    ASSERT_TRUE(dense.ok()) << dense.status().ToString();
    std::string axes = dense->order();
    axes.pop_back();  // C is never padded
    std::shuffle(axes.begin(), axes.end(), rng_);
    axes.resize(Int(1, 2));
    std::sort(axes.begin(), axes.end(),
              [&](char a, char b) { return dense->order().find(a) > dense->order().find(b); });
    for (char name : axes) {
      auto region = KvRegion::Create(spec);
      ASSERT_TRUE(region.ok()) << region.status().ToString();
      const Axis axis = *AxisFromName(name);
      spec.strides[static_cast<int>(axis)] = region->stride(axis) + Int(1, 7);
    }
  }

  std::vector<int64_t> Blocks(int64_t count, int64_t blocks, bool distinct) {
    std::vector<int64_t> ids(blocks);
    for (int64_t i = 0; i < blocks; ++i) ids[i] = i;
    if (distinct) {
      if (Chance(30)) {  // a contiguous stretch, where merging across blocks shows
        const int64_t start = Int(0, blocks - count);
        return std::vector<int64_t>(ids.begin() + start, ids.begin() + start + count);
      }
      std::shuffle(ids.begin(), ids.end(), rng_);
      ids.resize(count);
      return ids;
    }
    std::vector<int64_t> out(count);
    for (auto& b : out) b = Int(0, blocks - 1);
    return out;
  }

 private:
  std::mt19937 rng_;
};

struct Case {
  LayoutSpec src, dst;
  std::vector<int64_t> src_blocks, dst_blocks;
  int64_t tokens = 0, layer_begin = 0, layer_end = -1;
};

Case RandomCase(Gen& gen) {
  Case c;
  const bool src_s = gen.Chance(30), dst_s = gen.Chance(30);
  // Odd logical content only where neither side splits K from V (an opaque Mamba-like page).
  const int64_t content = (src_s || dst_s) ? 2 * gen.Int(1, 4) : gen.Int(1, 9);
  const int64_t layers = gen.Int(1, 3);
  const int64_t total_heads = gen.Pick<int64_t>({1, 2, 4, 8});
  const bool mla = gen.Chance(15);
  int side = 0;
  for (LayoutSpec* spec : {&c.src, &c.dst}) {
    const bool with_s = side++ == 0 ? src_s : dst_s;
    spec->order = gen.Order(with_s);
    spec->layers = layers;
    spec->blocks = gen.Int(3, 8);
    spec->block_size = gen.Pick<int64_t>({1, 2, 3, 4, 8});
    spec->content_bytes = with_s ? content / 2 : content;
    if (mla) {
      spec->heads = 1;
      spec->total_heads = 1;
      spec->replicated = gen.Chance(70);
      spec->tp_size = gen.Pick<int>({1, 2, 4});
    } else {
      spec->tp_size = gen.Pick<int>({1, 2, 4, 8});
      spec->total_heads = total_heads;
      spec->heads = total_heads >= spec->tp_size ? total_heads / spec->tp_size : 1;
    }
    spec->tp_rank = static_cast<int>(gen.Int(0, spec->tp_size - 1));
    if (gen.Chance(40)) gen.Pad(*spec);
  }
  const int64_t max_tokens =
      std::min(c.src.blocks * c.src.block_size, c.dst.blocks * c.dst.block_size);
  c.tokens = gen.Chance(5) ? 0 : gen.Int(1, max_tokens);
  const int64_t src_used = (c.tokens + c.src.block_size - 1) / c.src.block_size;
  const int64_t dst_used = (c.tokens + c.dst.block_size - 1) / c.dst.block_size;
  c.src_blocks = gen.Blocks(std::max<int64_t>(src_used, 1), c.src.blocks, !gen.Chance(20));
  c.dst_blocks = gen.Blocks(std::max<int64_t>(dst_used, 1), c.dst.blocks, true);
  if (gen.Chance(40)) {
    c.layer_begin = gen.Int(0, layers - 1);
    c.layer_end = gen.Int(c.layer_begin, layers);
  }
  return c;
}

std::string Describe(const Case& c) {
  auto side = [](const LayoutSpec& s) {
    std::string out = s.order + " L" + std::to_string(s.layers) + " B" + std::to_string(s.blocks) +
                      " H" + std::to_string(s.heads) + " N" + std::to_string(s.block_size) + " C" +
                      std::to_string(s.content_bytes) + " tp " + std::to_string(s.tp_rank) + "/" +
                      std::to_string(s.tp_size) + " total " + std::to_string(s.total_heads) +
                      (s.replicated ? " replicated" : "") + " strides";
    for (int64_t st : s.strides) out += " " + std::to_string(st);
    return out;
  };
  std::string out = "src " + side(c.src) + "\ndst " + side(c.dst) + "\nsrc blocks";
  for (int64_t b : c.src_blocks) out += " " + std::to_string(b);
  out += "\ndst blocks";
  for (int64_t b : c.dst_blocks) out += " " + std::to_string(b);
  out += "\ntokens " + std::to_string(c.tokens) + " layers [" + std::to_string(c.layer_begin) +
         ", " + std::to_string(c.layer_end) + ")";
  return out;
}

TEST(PlanProperty, MatchesByteReferenceWithMinimalRuns) {
  Gen gen(20261121);
  int planned = 0, no_common_head = 0;
  for (int i = 0; i < 4000; ++i) {
    Case c = RandomCase(gen);
    auto src = KvRegion::Create(c.src);
    auto dst = KvRegion::Create(c.dst);
    ASSERT_TRUE(src.ok()) << src.status().ToString() << "\n" << Describe(c);
    ASSERT_TRUE(dst.ok()) << dst.status().ToString() << "\n" << Describe(c);
    TransferSpec spec{c.src_blocks, c.dst_blocks, c.tokens, c.layer_begin, c.layer_end};
    auto plan = PlanTransfer(*src, *dst, spec);

    bool common = false;
    for (int64_t g = 0; g < src->total_heads(); ++g)
      common |= HeldLocally(src->spec(), g) >= 0 && HeldLocally(dst->spec(), g) >= 0;
    if (!common) {
      ASSERT_FALSE(plan.ok()) << Describe(c);
      EXPECT_EQ(plan.status().code(), Code::kIncompatible);
      ++no_common_head;
      continue;
    }
    ASSERT_TRUE(plan.ok()) << plan.status().ToString() << "\n" << Describe(c);
    ++planned;

    const int64_t layer_end = c.layer_end == -1 ? c.src.layers : c.layer_end;
    const auto expected =
        ReferenceBytes(*src, *dst, c.src_blocks, c.dst_blocks, c.tokens, c.layer_begin, layer_end);
    const auto actual = PlanBytes(*plan);
    ASSERT_EQ(actual, expected) << Describe(c);
    ASSERT_EQ(plan->bytes, expected.size()) << Describe(c);
    ASSERT_EQ(std::adjacent_find(expected.begin(), expected.end(),
                                 [](auto& a, auto& b) { return a.first == b.first; }),
              expected.end())
        << "a destination byte is written twice\n"
        << Describe(c);
    ASSERT_EQ(plan->runs.size(), CountStretches(expected)) << Describe(c);
    for (size_t r = 1; r < plan->runs.size(); ++r)
      ASSERT_LT(plan->runs[r - 1].dst_offset, plan->runs[r].dst_offset) << Describe(c);
    EXPECT_TRUE(ValidateRuns(plan->runs, src->span_bytes(), dst->span_bytes()).ok());
  }
  // The generator must exercise the planner, not only the error path.
  EXPECT_GT(planned, 3000);
  EXPECT_GT(no_common_head, 0);
}

// LayerPlan against PlanTransfer over random layouts: every layer appended (behind a run
// already queued, as kvd appends to a batch) gives, with its groups expanded in order, exactly
// PlanTransfer's runs for that layer, and the groups pass the bounds check. Returns how many
// layers were compared and how many of them came out as groups.
struct LayerPlanCounts {
  int compared = 0, grouped = 0, adjoining = 0, apart = 0;
};
LayerPlanCounts CheckLayerPlans(uint32_t seed, bool groups) {
  Gen gen(seed);
  LayerPlanCounts counts;
  for (int i = 0; i < 2000; ++i) {
    Case c = RandomCase(gen);
    auto src = KvRegion::Create(c.src);
    auto dst = KvRegion::Create(c.dst);
    EXPECT_TRUE(src.ok() && dst.ok()) << Describe(c);
    if (!src.ok() || !dst.ok()) return counts;
    const TransferSpec spec{c.src_blocks, c.dst_blocks, c.tokens};
    auto layers = LayerPlan::Create(*src, *dst, spec, groups);
    EXPECT_EQ(layers.ok(), PlanTransfer(*src, *dst, spec).ok()) << Describe(c);
    if (!layers.ok()) continue;
    const kv::Run before{1, 2, 3};
    size_t layer_runs = 0;  // PlanTransfer's, layer by layer
    for (int64_t l = 0; l < c.src.layers; ++l) {
      auto expected = PlanTransfer(*src, *dst, {c.src_blocks, c.dst_blocks, c.tokens, l, l + 1});
      EXPECT_TRUE(expected.ok()) << Describe(c);
      if (!expected.ok()) return counts;
      Plan actual;
      actual.runs.push_back(before);
      EXPECT_TRUE(layers->AppendLayer(l, &actual).ok());
      EXPECT_EQ(actual.runs.front(), before);
      actual.runs.erase(actual.runs.begin());
      EXPECT_TRUE(ValidateGroups(actual.groups, src->span_bytes(), dst->span_bytes()).ok());
      EXPECT_EQ(actual.run_count(), expected->runs.size());
      EXPECT_EQ(layers->runs_per_layer(), expected->runs.size());
      layer_runs += expected->runs.size();
      if (!actual.groups.empty()) {
        EXPECT_TRUE(groups) << "groups from a plan without them";
        EXPECT_TRUE(actual.runs.empty());
        EXPECT_LE(actual.groups.size() * LayerPlan::kMinRowsPerGroup, expected->runs.size());
        ++counts.grouped;
      }
      ExpandGroups(actual.groups, &actual.runs);
      EXPECT_EQ(actual.runs, expected->runs) << "layer " << l << "\n" << Describe(c);
      EXPECT_EQ(actual.bytes, expected->bytes);
      if (::testing::Test::HasFailure()) return counts;
      ++counts.compared;
    }
    // Where the layers do not adjoin, PlanTransfer over them all joins no run across layers, so
    // kvd loses nothing appending a pulled range layer by layer (SendLayers).
    auto whole = PlanTransfer(*src, *dst, {c.src_blocks, c.dst_blocks, c.tokens, 0, c.src.layers});
    EXPECT_TRUE(whole.ok()) << Describe(c);
    if (!whole.ok()) return counts;
    if (layers->layers_adjoin()) {
      ++counts.adjoining;
    } else if (layers->entries_per_layer() == layers->runs_per_layer()) {  // planned as runs
      ++counts.apart;
      EXPECT_EQ(whole->runs.size(), layer_runs) << Describe(c);
    }
    Plan untouched;
    EXPECT_EQ(layers->AppendLayer(c.src.layers, &untouched).code(), Code::kOutOfRange);
    EXPECT_TRUE(untouched.runs.empty() && untouched.groups.empty());
  }
  return counts;
}

TEST(PlanProperty, LayerPlanShiftsLayerZeroToEveryLayer) {
  const LayerPlanCounts counts = CheckLayerPlans(20261122, /*groups=*/false);
  EXPECT_GT(counts.compared, 2000);
  EXPECT_EQ(counts.grouped, 0);
  // Both kinds of layout came up: blocks-first ones whose layers adjoin, and others.
  EXPECT_GT(counts.adjoining, 10);
  EXPECT_GT(counts.apart, 500);
}

// With groups on, a TP split's layer becomes groups that expand to the same runs.
TEST(PlanProperty, GroupedLayerPlanExpandsToPlanTransfer) {
  const LayerPlanCounts counts = CheckLayerPlans(20261123, /*groups=*/true);
  EXPECT_GT(counts.compared, 2000);
  EXPECT_GT(counts.grouped, 100);
}

}  // namespace
}  // namespace kv
