#include "kernels/strided_kv.h"

#include <random>
#include <string>

#include <gtest/gtest.h>

#include "layout/kv_region.h"

namespace kv::kernels {
namespace {

// The kernels' view of a region must address exactly what the layout model addresses, for every
// order, with padding, and the virtual K/V split must agree with KvRegion::kv().
TEST(StridedKv, AgreesWithTheLayoutModel) {
  std::mt19937_64 rng(81);
  const char* orders[] = {"LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", "SBNHC", "BSNHC"};
  for (const char* order : orders) {
    for (bool padded : {false, true}) {
      LayoutSpec spec;
      spec.order = order;
      spec.layers = 3;
      spec.blocks = 5;
      spec.heads = 2;
      spec.block_size = 4;
      const bool planes = std::string(order).find('S') != std::string::npos;
      const int64_t head_dim = 16;
      spec.content_bytes = (planes ? 1 : 2) * head_dim * kDTypeBytes;
      auto dense = KvRegion::Create(spec);
      ASSERT_TRUE(dense.ok()) << order << ": " << dense.status().ToString();
      if (padded) {
        // Pad the outermost axis's stride, which cannot make elements collide.
        const Axis outer = AxisFromName(dense->order()[0]).value();
        spec.strides[static_cast<int>(outer)] = dense->stride(outer) + 64;
      }
      auto region = KvRegion::Create(spec);
      ASSERT_TRUE(region.ok()) << order << ": " << region.status().ToString();
      const StridedKv kv = DescribeRegion(*region);
      ASSERT_TRUE(ValidateStridedKv(kv).ok()) << order;
      EXPECT_EQ(kv.span_bytes, region->span_bytes());
      EXPECT_EQ(kv.planes, planes ? 2 : 1);
      const auto paged = SplitKv(kv, head_dim, DType::kBFloat16);
      ASSERT_TRUE(paged.ok()) << paged.status().ToString();
      for (int i = 0; i < 50; ++i) {
        const int64_t l = rng() % 3, b = rng() % 5, h = rng() % 2, n = rng() % 4;
        const int64_t s = planes ? rng() % 2 : 0;
        ASSERT_EQ(kv.offset(l, b, h, n, s), region->offset(l, b, h, n, s)) << order;
        const auto where = region->kv(l, b, h, n);
        const uint64_t at = l * kv.layer_stride + paged->token_offset(b, h, n);
        EXPECT_EQ(at + paged->k_offset, where.k_offset) << order;
        EXPECT_EQ(at + paged->v_offset, where.v_offset) << order;
        EXPECT_EQ(static_cast<uint64_t>(head_dim * kDTypeBytes), where.bytes);
      }
    }
  }
}

}  // namespace
}  // namespace kv::kernels
