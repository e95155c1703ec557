#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gather.h"
#include "tests/support/random_layout.h"

namespace kv::kernels {
namespace {

using testing::RandomLayout;

// The staging byte x of the definition: decompose x in staging order, then add up strides.
uint64_t SourceByte(const StridedKv& kv, const std::vector<int64_t>& blocks, const PageSlice& s,
                    uint64_t x) {
  const uint64_t c = x % kv.content_bytes;
  x /= kv.content_bytes;
  const uint64_t p = x % kv.planes;
  x /= kv.planes;
  const uint64_t n = x % kv.block_size;
  x /= kv.block_size;
  const uint64_t h = s.head_begin + x % (s.head_end - s.head_begin);
  x /= (s.head_end - s.head_begin);
  const uint64_t l = s.layer_begin + x % (s.layer_end - s.layer_begin);
  const uint64_t i = x / (s.layer_end - s.layer_begin);
  return l * kv.layer_stride + blocks[i] * kv.block_stride + h * kv.head_stride +
         n * kv.token_stride + p * kv.plane_stride + c;
}

TEST(GatherRef, MatchesDefinitionOnRandomLayouts) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const RandomLayout layout = testing::RandomLayoutOf(rng, 32 * (1 + trial % 3), trial % 2);
    const StridedKv& kv = layout.kv;
    ASSERT_TRUE(ValidateStridedKv(kv).ok()) << layout.order;
    std::vector<unsigned char> cache(kv.span_bytes);
    for (auto& b : cache) b = static_cast<unsigned char>(rng());
    std::vector<int64_t> blocks;
    for (int i = 0; i < 1 + trial % 5; ++i) blocks.push_back(rng() % kv.blocks);
    PageSlice slice;
    slice.layer_begin = rng() % kv.layers;
    slice.layer_end = slice.layer_begin + 1 + rng() % (kv.layers - slice.layer_begin);
    slice.head_begin = rng() % kv.heads;
    const auto bytes = StagingBytes(kv, slice, blocks.size());
    ASSERT_TRUE(bytes.ok());
    std::vector<unsigned char> staging(*bytes, 0xEE);
    ASSERT_TRUE(GatherHost(kv, cache.data(), blocks, slice, staging.data()).ok());
    const PageSlice s = *ResolveSlice(kv, slice);
    for (uint64_t x = 0; x < staging.size(); ++x) {
      ASSERT_EQ(staging[x], cache[SourceByte(kv, blocks, s, x)])
          << layout.order << " trial " << trial << " byte " << x;
    }
  }
}

TEST(GatherRef, ScatterWritesExactlyTheSelectedBytes) {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 40; ++trial) {
    const RandomLayout layout = testing::RandomLayoutOf(rng, 64, true);
    const StridedKv& kv = layout.kv;
    std::vector<int64_t> blocks = {static_cast<int64_t>(rng() % kv.blocks)};
    if (kv.blocks > 1) blocks.push_back((blocks[0] + 1) % kv.blocks);
    PageSlice slice;
    slice.head_end = 1 + rng() % kv.heads;
    const uint64_t bytes = *StagingBytes(kv, slice, blocks.size());
    std::vector<unsigned char> staging(bytes), cache(kv.span_bytes, 0xEE);
    for (auto& b : staging) b = static_cast<unsigned char>(rng());
    ASSERT_TRUE(ScatterHost(kv, cache.data(), blocks, slice, staging.data()).ok());
    std::vector<unsigned char> want(kv.span_bytes, 0xEE);
    const PageSlice s = *ResolveSlice(kv, slice);
    for (uint64_t x = 0; x < bytes; ++x) want[SourceByte(kv, blocks, s, x)] = staging[x];
    ASSERT_EQ(cache, want) << layout.order << " trial " << trial;
  }
}

TEST(GatherRef, RejectsBadBlocksAndSlices) {
  std::mt19937_64 rng(13);
  const RandomLayout layout = testing::MakeLayout("LBNHC", 2, 4, 2, 4, 32, rng, false);
  std::vector<unsigned char> cache(layout.kv.span_bytes), staging(1 << 16);
  const std::vector<int64_t> bad = {0, 4};
  EXPECT_EQ(GatherHost(layout.kv, cache.data(), bad, {}, staging.data()).code(), Code::kOutOfRange);
  PageSlice slice;
  slice.layer_end = 3;
  const std::vector<int64_t> good = {1};
  EXPECT_EQ(GatherHost(layout.kv, cache.data(), good, slice, staging.data()).code(),
            Code::kInvalidArgument);
  slice = {};
  slice.head_begin = 2;
  EXPECT_EQ(StagingBytes(layout.kv, slice, 1).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kv::kernels
