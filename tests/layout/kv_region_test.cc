#include "layout/kv_region.h"

#include <gtest/gtest.h>

namespace kv {
namespace {

LayoutSpec Llama(const std::string& order) {
  LayoutSpec s;
  s.order = order;
  s.layers = 4;
  s.blocks = 64;
  s.heads = 8;
  s.block_size = 16;
  s.content_bytes = 512;
  return s;
}

KvRegion MustCreate(const LayoutSpec& spec) {
  auto r = KvRegion::Create(spec);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *r;
}

TEST(KvRegion, DenseStridesOfDefaultOrder) {
  KvRegion r = MustCreate(Llama("LBNHC"));
  EXPECT_EQ(r.stride(Axis::kC), 1);
  EXPECT_EQ(r.stride(Axis::kH), 512);
  EXPECT_EQ(r.stride(Axis::kN), 8 * 512);
  EXPECT_EQ(r.stride(Axis::kB), 16 * 8 * 512);
  EXPECT_EQ(r.stride(Axis::kL), 64 * 16 * 8 * 512);
  EXPECT_EQ(r.span_bytes(), uint64_t{4} * 64 * 16 * 8 * 512);
  EXPECT_EQ(r.offset(1, 2, 3, 4),
            uint64_t(1 * r.stride(Axis::kL) + 2 * r.stride(Axis::kB) + 3 * 512 + 4 * 8 * 512));
  EXPECT_FALSE(r.blocks_first());
  EXPECT_TRUE(r.page_is_contiguous());
  EXPECT_EQ(r.page_bytes(), uint64_t{16} * 8 * 512);
  EXPECT_EQ(r.page_offset(1, 2), uint64_t(r.stride(Axis::kL) + 2 * r.stride(Axis::kB)));
}

TEST(KvRegion, BlocksFirstPageHoldsEveryLayer) {
  KvRegion r = MustCreate(Llama("BLHNC"));
  EXPECT_TRUE(r.blocks_first());
  EXPECT_TRUE(r.page_is_contiguous());
  EXPECT_EQ(r.page_bytes(), uint64_t{4} * 8 * 16 * 512);
  EXPECT_EQ(r.page_offset(3, 5), uint64_t(5 * r.stride(Axis::kB)));
  EXPECT_EQ(r.stride(Axis::kN), 512);
  EXPECT_EQ(r.stride(Axis::kH), 16 * 512);
}

TEST(KvRegion, HeadsOutsideBlocksMakeScatteredPages) {
  KvRegion r = MustCreate(Llama("LHBNC"));
  EXPECT_FALSE(r.page_is_contiguous());
}

TEST(KvRegion, LegacyOrderGetsLayerPrepended) {
  KvRegion r = MustCreate(Llama("SBNHC"));
  EXPECT_EQ(r.order(), "LSBNHC");
  EXPECT_TRUE(r.has_kv_axis());
  EXPECT_EQ(r.size(Axis::kS), 2);
  EXPECT_EQ(r.logical_content_bytes(), 1024);
  auto kv = r.kv(0, 1, 2, 3);
  EXPECT_EQ(kv.bytes, 512u);
  EXPECT_EQ(kv.v_offset - kv.k_offset, uint64_t(r.stride(Axis::kS)));
  EXPECT_EQ(r.stride(Axis::kS), 64 * 16 * 8 * 512);
}

TEST(KvRegion, PackedKvSplitIsHalvesOfContent) {
  KvRegion r = MustCreate(Llama("LBNHC"));
  auto kv = r.kv(1, 2, 3, 4);
  EXPECT_EQ(kv.k_offset, r.offset(1, 2, 3, 4));
  EXPECT_EQ(kv.v_offset, kv.k_offset + 256);
  EXPECT_EQ(kv.bytes, 256u);
}

TEST(KvRegion, PaddedStridesAreKeptAndSpanIsMinimal) {
  LayoutSpec s = Llama("LBNHC");
  s.strides[int(Axis::kB)] = 16 * 8 * 512 + 4096;
  KvRegion r = MustCreate(s);
  EXPECT_EQ(r.stride(Axis::kB), 16 * 8 * 512 + 4096);
  EXPECT_EQ(r.stride(Axis::kL), 64 * (16 * 8 * 512 + 4096));
  EXPECT_EQ(r.span_bytes(),
            uint64_t(3 * r.stride(Axis::kL) + 63 * r.stride(Axis::kB) + 16 * 8 * 512));
}

TEST(KvRegion, NormalisedSpecRecreatesTheSameRegion) {
  LayoutSpec s = Llama("BSNHC");
  s.strides[int(Axis::kB)] = 1 << 20;
  s.tp_size = 2;
  KvRegion first = MustCreate(s);
  KvRegion again = MustCreate(first.spec());
  for (int a = 0; a < kNumAxes; ++a) {
    EXPECT_EQ(again.stride(Axis(a)), first.stride(Axis(a))) << AxisName(Axis(a));
    EXPECT_EQ(again.size(Axis(a)), first.size(Axis(a))) << AxisName(Axis(a));
  }
  EXPECT_EQ(again.total_heads(), 16);
  EXPECT_EQ(again.span_bytes(), first.span_bytes());
}

TEST(KvRegion, RejectsOverlappingStrides) {
  LayoutSpec s = Llama("LBNHC");
  s.strides[int(Axis::kN)] = 256;
  auto r = KvRegion::Create(s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("overlap"), std::string::npos);
}

TEST(KvRegion, RejectsStridesPastTheRegion) {
  LayoutSpec s = Llama("LBNHC");
  s.region_bytes = 1000;
  auto r = KvRegion::Create(s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kOutOfRange);
}

TEST(KvRegion, RejectsBadOrders) {
  for (const char* order : {"LBNH", "LBNCH", "LBBNHC", "LBNHXC", ""}) {
    auto r = KvRegion::Create(Llama(order));
    EXPECT_FALSE(r.ok()) << order;
  }
}

TEST(KvRegion, RejectsNonPositiveSizes) {
  LayoutSpec s = Llama("LBNHC");
  s.heads = 0;
  EXPECT_FALSE(KvRegion::Create(s).ok());
}

TEST(KvRegion, TensorParallelHeadsSplitAcrossRanks) {
  LayoutSpec s = Llama("LBNHC");
  s.heads = 2;
  s.tp_size = 4;
  s.tp_rank = 3;
  KvRegion r = MustCreate(s);
  EXPECT_EQ(r.total_heads(), 8);
  EXPECT_EQ(r.global_head(0), 6);
  EXPECT_EQ(r.global_head(1), 7);
  EXPECT_EQ(r.local_head(7), 1);
  EXPECT_EQ(r.local_head(5), -1);
}

TEST(KvRegion, FewerHeadsThanRanksReplicates) {
  LayoutSpec s = Llama("LBNHC");
  s.heads = 1;
  s.total_heads = 2;
  s.tp_size = 8;
  for (int rank = 0; rank < 8; ++rank) {
    s.tp_rank = rank;
    KvRegion r = MustCreate(s);
    EXPECT_EQ(r.global_head(0), rank * 2 / 8);
    EXPECT_EQ(r.local_head(rank * 2 / 8), 0);
  }
}

TEST(KvRegion, ReplicatedCacheHoldsEveryHead) {
  LayoutSpec s = Llama("LBNHC");
  s.heads = 1;
  s.content_bytes = 576 * 2;
  s.replicated = true;
  s.tp_size = 4;
  s.tp_rank = 2;
  KvRegion r = MustCreate(s);
  EXPECT_EQ(r.global_head(0), 0);
  EXPECT_EQ(r.total_heads(), 1);
}

TEST(KvRegion, RejectsInconsistentTensorParallel) {
  LayoutSpec s = Llama("LBNHC");
  s.tp_size = 2;
  s.total_heads = 10;  // 8 x 2 != 10
  EXPECT_FALSE(KvRegion::Create(s).ok());
  s.total_heads = 0;
  s.tp_rank = 2;
  EXPECT_FALSE(KvRegion::Create(s).ok());
  s.tp_rank = 0;
  s.tp_size = 4;
  s.heads = (int64_t{1} << 62) + 1;  // heads x tp_size wraps int64
  EXPECT_EQ(KvRegion::Create(s).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kv
