// Worked examples of the planner: every standard order, the legacy S forms, MLA, a Mamba-style
// opaque page, TP splits, block-size mismatch, per-layer planning and every error.
#include "layout/plan.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/support/plan_reference.h"

namespace kv {
namespace {

// A small Llama-like cache: 4 layers, 64 blocks of 16 tokens, 8 heads, 512 bytes per head-token
// (K and V of 128 bf16 each).
LayoutSpec Llama(const std::string& order, int64_t block_size = 16) {
  LayoutSpec s;
  s.order = order;
  s.layers = 4;
  s.blocks = 64;
  s.heads = 8;
  s.block_size = block_size;
  s.content_bytes = order.find('S') == std::string::npos ? 512 : 256;
  return s;
}

KvRegion Region(const LayoutSpec& spec) {
  auto r = KvRegion::Create(spec);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *r;
}

struct Request {
  std::vector<int64_t> src_blocks = {5, 9, 2};
  std::vector<int64_t> dst_blocks = {5, 9, 2};
  int64_t tokens = 40;
  int64_t layer_begin = 0;
  int64_t layer_end = -1;
};

Result<Plan> PlanFor(const KvRegion& src, const KvRegion& dst, const Request& q) {
  return PlanTransfer(src, dst, {q.src_blocks, q.dst_blocks, q.tokens, q.layer_begin, q.layer_end});
}

// Plans, checks the bytes and the run count against the byte reference, returns the plan.
Plan PlanAndCheck(const LayoutSpec& src_spec, const LayoutSpec& dst_spec, const Request& q = {}) {
  KvRegion src = Region(src_spec), dst = Region(dst_spec);
  auto plan = PlanFor(src, dst, q);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!plan.ok()) return {};
  const int64_t end = q.layer_end == -1 ? src_spec.layers : q.layer_end;
  auto expected =
      testing::ReferenceBytes(src, dst, q.src_blocks, q.dst_blocks, q.tokens, q.layer_begin, end);
  EXPECT_EQ(testing::PlanBytes(*plan), expected);
  EXPECT_EQ(plan->runs.size(), testing::CountStretches(expected));
  for (size_t i = 1; i < plan->runs.size(); ++i)
    EXPECT_LT(plan->runs[i - 1].dst_offset, plan->runs[i].dst_offset) << "run " << i;
  return *plan;
}

constexpr uint64_t kTokenBytes = 8 * 512;  // every head of one token
constexpr uint64_t kRequestBytes = 4 * 40 * kTokenBytes;

TEST(PlanExample, LBNHC) {
  // Per layer: two full blocks and half a block, none adjacent: three runs.
  Plan plan = PlanAndCheck(Llama("LBNHC"), Llama("LBNHC"));
  EXPECT_EQ(plan.runs.size(), 12u);
  EXPECT_EQ(plan.bytes, kRequestBytes);
  KvRegion r = Region(Llama("LBNHC"));
  // Destination order: block 2 (the half block) comes first in layer 0.
  EXPECT_EQ(plan.runs[0], (kv::Run{r.offset(0, 2, 0, 0), r.offset(0, 2, 0, 0), 8 * kTokenBytes}));
  EXPECT_EQ(plan.runs[1], (kv::Run{r.offset(0, 5, 0, 0), r.offset(0, 5, 0, 0), 16 * kTokenBytes}));
}

TEST(PlanExample, LBHNC) {
  // Full blocks are whole pages; the half block is one run per head.
  EXPECT_EQ(PlanAndCheck(Llama("LBHNC"), Llama("LBHNC")).runs.size(), 4u * (2 + 8));
}

TEST(PlanExample, LHBNC) {
  // Heads outside blocks: one run per layer, head and block.
  EXPECT_EQ(PlanAndCheck(Llama("LHBNC"), Llama("LHBNC")).runs.size(), 4u * 8 * 3);
}

TEST(PlanExample, BLHNC) {
  // A full block of every layer is one page; the half block is one run per layer and head.
  Plan plan = PlanAndCheck(Llama("BLHNC"), Llama("BLHNC"));
  EXPECT_EQ(plan.runs.size(), 2u + 4 * 8);
  EXPECT_EQ(plan.bytes, kRequestBytes);
}

TEST(PlanExample, BLNHC) {
  // The half block is one run per layer: its tokens carry every head.
  EXPECT_EQ(PlanAndCheck(Llama("BLNHC"), Llama("BLNHC")).runs.size(), 2u + 4);
}

TEST(PlanExample, BHLNC) {
  EXPECT_EQ(PlanAndCheck(Llama("BHLNC"), Llama("BHLNC")).runs.size(), 2u + 8 * 4);
}

TEST(PlanExample, LegacySBNHC) {
  // K and V planes of every layer: one run per layer, plane and block.
  EXPECT_EQ(PlanAndCheck(Llama("SBNHC"), Llama("SBNHC")).runs.size(), 4u * 2 * 3);
}

TEST(PlanExample, LegacyBSNHC) {
  // Full blocks hold K and V together; the half block has a K run and a V run.
  EXPECT_EQ(PlanAndCheck(Llama("BSNHC"), Llama("BSNHC")).runs.size(), 4u * (2 + 2));
}

TEST(PlanExample, LegacyToPackedSplitsKAndV) {
  // Every (layer, token, head) has K and V apart in the source: two 256-byte runs.
  Plan plan = PlanAndCheck(Llama("SBNHC"), Llama("LBNHC"));
  EXPECT_EQ(plan.runs.size(), 4u * 40 * 8 * 2);
  EXPECT_EQ(plan.bytes, kRequestBytes);
  EXPECT_EQ(plan.runs[0].length, 256u);
}

TEST(PlanExample, PrefillToDecodeConversion) {
  // LBNHC with 16-token blocks into BLHNC with 32-token blocks: the demo's request.
  Request q;
  q.dst_blocks = {7, 3};
  Plan plan = PlanAndCheck(Llama("LBNHC"), Llama("BLHNC", 32), q);
  EXPECT_EQ(plan.runs.size(), 4u * 40 * 8);
  EXPECT_EQ(plan.bytes, kRequestBytes);
}

TEST(PlanExample, AdjacentBlocksMergeAcrossBlockSizes) {
  Request q;
  q.src_blocks = {10, 11, 12};
  q.dst_blocks = {5, 6};
  // 16-token blocks 10..12 and 32-token blocks 5..6 start at the same byte: one run per layer.
  Plan plan = PlanAndCheck(Llama("LBNHC"), Llama("LBNHC", 32), q);
  EXPECT_EQ(plan.runs.size(), 4u);
  // And the other way round.
  std::swap(q.src_blocks, q.dst_blocks);
  EXPECT_EQ(PlanAndCheck(Llama("LBNHC", 32), Llama("LBNHC"), q).runs.size(), 4u);
}

TEST(PlanExample, DestinationOrderFindsAdjacencyTokenOrderHides) {
  // Token order visits destination block 4 before 3, but 3|4 and 6|5... continue each other.
  Request q;
  q.src_blocks = {6, 5};
  q.dst_blocks = {4, 3};
  q.tokens = 32;
  Plan plan = PlanAndCheck(Llama("BLHNC"), Llama("BLHNC"), q);
  EXPECT_EQ(plan.runs.size(), 1u);
}

TEST(PlanExample, TensorParallelSplitBothWays) {
  LayoutSpec full = Llama("LBNHC");
  LayoutSpec half = Llama("LBNHC");
  half.heads = 4;
  half.tp_size = 2;
  half.tp_rank = 1;
  // Heads 4..7 of every token: one 2 KiB run per layer and token.
  Plan down = PlanAndCheck(full, half);
  EXPECT_EQ(down.runs.size(), 4u * 40);
  EXPECT_EQ(down.runs[0].length, 4u * 512);
  EXPECT_EQ(PlanAndCheck(half, full).runs.size(), 4u * 40);
}

TEST(PlanExample, TensorParallelSplitWithScatteredBlocks) {
  // What kvd plans per decode rank for TP 1 -> 2 with an engine's scattered block ids: one run
  // per layer and token, the pieces of a block replicated from the first block's. A partial last
  // block and a source block size of 8 give ranges of other lengths in between.
  LayoutSpec full = Llama("LBNHC");
  LayoutSpec half = Llama("LBNHC");
  half.heads = 4;
  half.tp_size = 2;
  for (int rank = 0; rank < 2; ++rank) {
    half.tp_rank = rank;
    Request q;
    q.src_blocks = {17, 3, 60, 41, 8, 22};
    q.dst_blocks = {9, 51, 2, 30, 44, 13};
    q.tokens = 90;
    Plan plan = PlanAndCheck(full, half, q);
    EXPECT_EQ(plan.runs.size(), 4u * 90);
    EXPECT_EQ(plan.runs[0].length, 4u * 512);
    q.src_blocks = {17, 3, 60, 41, 8, 22, 35, 1, 48, 12, 27, 5};
    EXPECT_EQ(PlanAndCheck(Llama("LBNHC", 8), half, q).runs.size(), 4u * 90);
    q.layer_begin = 2;
    q.layer_end = 3;
    EXPECT_EQ(PlanAndCheck(Llama("LBNHC", 8), half, q).runs.size(), 90u);
  }
}

TEST(PlanExample, AppendsWithoutJoiningEarlierRuns) {
  // Runs appended to a plan are joined among themselves only, never to the runs before them
  // (kvd gathers several requests' runs in one vector and counts each request's).
  KvRegion r = Region(Llama("BLHNC"));
  Request q;
  q.src_blocks = {4, 5};
  q.dst_blocks = {6, 7};
  q.tokens = 32;
  Plan plan;
  const TransferSpec spec{q.src_blocks, q.dst_blocks, q.tokens};
  ASSERT_TRUE(PlanTransfer(r, r, spec, &plan).ok());
  ASSERT_EQ(plan.runs.size(), 1u);
  // A second request whose run continues the first's on both sides.
  const std::vector<int64_t> src2 = {6}, dst2 = {8};
  ASSERT_TRUE(PlanTransfer(r, r, {src2, dst2, 16}, &plan).ok());
  ASSERT_EQ(plan.runs.size(), 2u);
  EXPECT_EQ(plan.runs[1].src_offset, plan.runs[0].src_offset + plan.runs[0].length);
  EXPECT_EQ(plan.runs[1].dst_offset, plan.runs[0].dst_offset + plan.runs[0].length);
  EXPECT_EQ(plan.bytes, 3 * r.page_bytes());
  // A failing plan leaves what is there alone.
  const std::vector<int64_t> bad = {64};
  EXPECT_EQ(PlanTransfer(r, r, {bad, dst2, 16}, &plan).code(), Code::kOutOfRange);
  EXPECT_EQ(plan.runs.size(), 2u);
  EXPECT_EQ(plan.bytes, 3 * r.page_bytes());
}

TEST(PlanExample, ReplicatedHeadWhenFewerHeadsThanRanks) {
  LayoutSpec src = Llama("LBNHC");
  src.heads = 2;
  src.tp_size = 1;
  LayoutSpec dst = Llama("LBNHC");
  dst.heads = 1;
  dst.total_heads = 2;
  dst.tp_size = 4;
  dst.tp_rank = 3;  // holds global head 3·2/4 = 1
  Plan plan = PlanAndCheck(src, dst);
  EXPECT_EQ(plan.bytes, 4u * 40 * 512);
  KvRegion s = Region(src);
  EXPECT_EQ(plan.runs[0].src_offset, s.offset(0, 2, 1, 0));
}

TEST(PlanExample, MlaReplicatedOnEveryRank) {
  LayoutSpec src = Llama("LBNHC");
  src.heads = 1;
  src.content_bytes = 576 * 2;  // one latent vector of 576 bf16, no separate V
  src.replicated = true;
  LayoutSpec dst = src;
  dst.tp_size = 4;
  dst.tp_rank = 2;
  Plan plan = PlanAndCheck(src, dst);
  EXPECT_EQ(plan.runs.size(), 12u);
  EXPECT_EQ(plan.bytes, 4u * 40 * 1152);
}

TEST(PlanExample, MambaOpaquePage) {
  // One state page per layer and request: N = 1, H = 1, C the whole state.
  LayoutSpec mamba = Llama("LBNHC", 1);
  mamba.heads = 1;
  mamba.content_bytes = 8192 + 6;
  Request q;
  q.src_blocks = {3};
  q.dst_blocks = {7};
  q.tokens = 1;
  EXPECT_EQ(PlanAndCheck(mamba, mamba, q).runs.size(), 4u);
  LayoutSpec paged = mamba;
  paged.order = "BLHNC";
  Plan plan = PlanAndCheck(paged, paged, q);
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_EQ(plan.runs[0].length, 4u * (8192 + 6));
}

TEST(PlanExample, PaddedBlockStrideStopsMerging) {
  LayoutSpec padded = Llama("LBNHC");
  padded.strides[static_cast<int>(Axis::kB)] = 16 * kTokenBytes + 256;
  Request q;
  q.src_blocks = {10, 11, 12};
  q.dst_blocks = {10, 11, 12};
  // Dense source blocks are adjacent, padded destination blocks are not: three runs per layer.
  EXPECT_EQ(PlanAndCheck(Llama("LBNHC"), padded, q).runs.size(), 4u * 3);
  EXPECT_EQ(PlanAndCheck(padded, padded, q).runs.size(), 4u * 3);
}

TEST(PlanExample, OneLayerAtATime) {
  for (const char* order : {"LBNHC", "BLHNC", "BHLNC", "SBNHC"}) {
    // PlanAndCheck compares each layer's plan with the reference bytes of that layer alone.
    LayoutSpec spec = Llama(order);
    Plan whole = PlanAndCheck(spec, spec);
    uint64_t bytes = 0;
    for (int64_t l = 0; l < 4; ++l) {
      Request q;
      q.layer_begin = l;
      q.layer_end = l + 1;
      Plan layer = PlanAndCheck(spec, spec, q);
      bytes += layer.bytes;
    }
    EXPECT_EQ(bytes, whole.bytes) << order;
  }
}

TEST(PlanExample, ManyScatteredBlocks) {
  // 70000 blocks: destination ids need three radix passes to come out in order.
  LayoutSpec spec = Llama("LBNHC", 1);
  spec.layers = 2;
  spec.blocks = 70000;
  spec.heads = 1;
  spec.content_bytes = 2;
  Request q;
  q.tokens = 3000;
  q.src_blocks.clear();
  q.dst_blocks.clear();
  for (int64_t t = 0; t < q.tokens; ++t) {
    q.src_blocks.push_back((t * 7919) % 70000);
    q.dst_blocks.push_back((t * 30011 + 5) % 70000);
  }
  Plan plan = PlanAndCheck(spec, spec, q);
  EXPECT_EQ(plan.bytes, 2u * 3000 * 2);
}

TEST(PlanExample, NothingToCopy) {
  KvRegion r = Region(Llama("LBNHC"));
  Request q;
  q.tokens = 0;
  auto plan = PlanFor(r, r, q);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->runs.empty());
  q.tokens = 40;
  q.layer_begin = q.layer_end = 2;
  plan = PlanFor(r, r, q);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->bytes, 0u);
}

// ---- Errors ----------------------------------------------------------------------------------

Status PlanError(const LayoutSpec& src, const LayoutSpec& dst, const Request& q) {
  auto plan = PlanFor(Region(src), Region(dst), q);
  return plan.ok() ? Status::Ok() : plan.status();
}

TEST(PlanErrors, BlockIdOutOfRange) {
  Request q;
  q.dst_blocks = {5, 64, 2};
  Status s = PlanError(Llama("LBNHC"), Llama("LBNHC"), q);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.message().find("64"), std::string::npos) << s.ToString();
  q.dst_blocks = {5, -1, 2};
  EXPECT_EQ(PlanError(Llama("LBNHC"), Llama("LBNHC"), q).code(), Code::kOutOfRange);
}

TEST(PlanErrors, TooFewBlocks) {
  Request q;
  q.src_blocks = {5, 9};
  Status s = PlanError(Llama("LBNHC"), Llama("LBNHC"), q);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("need 3"), std::string::npos) << s.ToString();
  q.tokens = INT64_MAX;  // ceil(tokens / block_size) without wrapping
  s = PlanError(Llama("LBNHC"), Llama("LBNHC"), q);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("need " + std::to_string(INT64_MAX / 16 + 1)), std::string::npos)
      << s.ToString();
}

TEST(PlanErrors, DestinationBlockUsedTwice) {
  Request q;
  q.dst_blocks = {5, 9, 5};
  EXPECT_EQ(PlanError(Llama("LBNHC"), Llama("LBNHC"), q).code(), Code::kInvalidArgument);
  // A repeated source block is fine: the same bytes go to two places.
  q.src_blocks = {5, 5, 2};
  q.dst_blocks = {5, 9, 2};
  PlanAndCheck(Llama("LBNHC"), Llama("LBNHC"), q);
}

TEST(PlanErrors, DifferentLayerCounts) {
  LayoutSpec other = Llama("LBNHC");
  other.layers = 5;
  EXPECT_EQ(PlanError(Llama("LBNHC"), other, {}).code(), Code::kIncompatible);
}

TEST(PlanErrors, DifferentContentSizes) {
  LayoutSpec other = Llama("LBNHC");
  other.content_bytes = 256;
  EXPECT_EQ(PlanError(Llama("LBNHC"), other, {}).code(), Code::kIncompatible);
  // An S layout of 256-byte halves matches a packed 512-byte layout.
  EXPECT_TRUE(PlanError(Llama("SBNHC"), Llama("LBNHC"), {}).ok());
}

TEST(PlanErrors, NoHeadInCommon) {
  LayoutSpec a = Llama("LBNHC"), b = Llama("LBNHC");
  a.heads = b.heads = 4;
  a.tp_size = b.tp_size = 2;
  b.tp_rank = 1;
  Status s = PlanError(a, b, {});
  EXPECT_EQ(s.code(), Code::kIncompatible);
  EXPECT_NE(s.message().find("no head in common"), std::string::npos);
}

TEST(PlanErrors, BadLayerRangeAndTokens) {
  Request q;
  q.layer_begin = 3;
  q.layer_end = 2;
  EXPECT_EQ(PlanError(Llama("LBNHC"), Llama("LBNHC"), q).code(), Code::kInvalidArgument);
  q.layer_begin = 0;
  q.layer_end = 5;
  EXPECT_EQ(PlanError(Llama("LBNHC"), Llama("LBNHC"), q).code(), Code::kInvalidArgument);
  q.layer_end = -1;
  q.tokens = -1;
  EXPECT_EQ(PlanError(Llama("LBNHC"), Llama("LBNHC"), q).code(), Code::kInvalidArgument);
}

TEST(ValidateRuns, RejectsRunsPastEitherEnd) {
  std::vector<kv::Run> runs = {{0, 0, 100}, {50, 900, 100}};
  EXPECT_TRUE(ValidateRuns(runs, 1000, 1000).ok());
  EXPECT_EQ(ValidateRuns(runs, 1000, 999).code(), Code::kOutOfRange);
  std::vector<kv::Run> wrap = {{UINT64_MAX - 10, 0, 100}};
  EXPECT_EQ(ValidateRuns(wrap, 1000, 1000).code(), Code::kOutOfRange);
}

}  // namespace
}  // namespace kv
