#include "kernels/half.h"

#include <cmath>

#include <gtest/gtest.h>

namespace kv::kernels {
namespace {

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = HalfToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), bits) << "half bits " << bits;
  }
}

TEST(Half, EveryBfloat16RoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = Bfloat16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBfloat16(f), bits) << "bf16 bits " << bits;
  }
}

TEST(Half, RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between halves 1.0 and 1 + 2^-10: ties go to the even one (1.0).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalf(70000.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0);  // half of the smallest subnormal: to even
  EXPECT_EQ(FloatToBfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBfloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_FLOAT_EQ(HalfToFloat(0xc000), -2.0f);
}

}  // namespace
}  // namespace kv::kernels
