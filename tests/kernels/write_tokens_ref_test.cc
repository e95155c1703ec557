#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/write_tokens.h"
#include "tests/support/random_layout.h"

namespace kv::kernels {
namespace {

TEST(WriteTokensRef, MatchesDefinitionOnRandomLayouts) {
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t head_dim = 8 << (trial % 3);
    const auto layout = testing::RandomLayoutOf(rng, 2 * head_dim * kDTypeBytes, trial % 2);
    const StridedKv& kv = layout.kv;
    const auto paged = SplitKv(kv, head_dim, trial % 2 ? DType::kBFloat16 : DType::kFloat16);
    ASSERT_TRUE(paged.ok()) << paged.status().ToString();
    const int64_t layer = rng() % kv.layers;
    const int64_t tokens = 1 + rng() % 12;
    const int64_t stride = kv.heads * head_dim + (trial % 3) * 8;  // fused-QKV style padding
    std::vector<uint16_t> key(tokens * stride), value(tokens * stride);
    for (auto& e : key) e = static_cast<uint16_t>(rng());
    for (auto& e : value) e = static_cast<uint16_t>(rng());
    // Distinct slots, some skipped.
    std::vector<int64_t> all(kv.blocks * kv.block_size);
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int64_t> slots(tokens);
    for (int64_t t = 0; t < tokens; ++t) slots[t] = (rng() % 5 == 0) ? -1 : all[t % all.size()];
    std::vector<unsigned char> cache(kv.span_bytes, 0xEE), want(kv.span_bytes, 0xEE);
    // Definition, element by element.
    for (int64_t t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      const int64_t b = slots[t] / kv.block_size, n = slots[t] % kv.block_size;
      for (int64_t h = 0; h < kv.heads; ++h) {
        for (int64_t d = 0; d < head_dim; ++d) {
          const uint64_t k_at = kv.offset(layer, b, h, n, 0) + d * 2;
          const uint64_t v_at =
              kv.planes == 2 ? kv.offset(layer, b, h, n, 1) + d * 2 : k_at + head_dim * 2;
          std::memcpy(&want[k_at], &key[t * stride + h * head_dim + d], 2);
          std::memcpy(&want[v_at], &value[t * stride + h * head_dim + d], 2);
        }
      }
    }
    NewTokens nt;
    nt.key = key.data();
    nt.value = value.data();
    nt.slots = slots.data();
    nt.tokens = tokens;
    nt.key_token_stride = stride;
    nt.value_token_stride = stride;
    ASSERT_TRUE(WriteTokensHost(*paged, cache.data() + layer * kv.layer_stride, nt).ok());
    ASSERT_EQ(cache, want) << layout.order << " trial " << trial;
  }
}

TEST(WriteTokensRef, RejectsSlotsPastTheCache) {
  std::mt19937_64 rng(22);
  const auto layout = testing::MakeLayout("LBNHC", 1, 2, 1, 4, 32, rng, false);
  const auto paged = *SplitKv(layout.kv, 8, DType::kFloat16);
  std::vector<unsigned char> cache(layout.kv.span_bytes);
  std::vector<uint16_t> key(8), value(8);
  const int64_t slot = 8;
  NewTokens nt{key.data(), value.data(), &slot, 1, 0, 0};
  EXPECT_EQ(WriteTokensHost(paged, cache.data(), nt).code(), Code::kOutOfRange);
  EXPECT_EQ(SplitKv(layout.kv, 16, DType::kFloat16).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kv::kernels
