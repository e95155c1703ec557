#include <algorithm>
#include <random>
#include <vector>

#include "kernels/gather.h"
#include "tests/support/cuda_test_util.h"
#include "tests/support/random_layout.h"

namespace kv::kernels {
namespace {

using testing::DeviceBuffer;

TEST(GpuGather, GatherAndScatterMatchReferenceOnRandomLayouts) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(41);
  for (int trial = 0; trial < 40; ++trial) {
    // Odd content sizes and 1-byte padding exercise every access width of the copy.
    const int64_t c = (trial % 4 == 0) ? 37 : 64 << (trial % 3);
    const auto layout =
        testing::MakeLayout(testing::kOrders[trial % 8], 1 + trial % 3, 9, 1 + trial % 4,
                            4 << (trial % 2), c, rng, true, trial % 2 ? 1 : 16);
    const StridedKv& kv = layout.kv;
    std::vector<unsigned char> cache(kv.span_bytes);
    for (auto& b : cache) b = static_cast<unsigned char>(rng());
    std::vector<int64_t> blocks;
    for (int i = 0; i < 1 + trial % 6; ++i) blocks.push_back(rng() % kv.blocks);
    PageSlice slice;
    slice.head_begin = rng() % kv.heads;
    slice.layer_end = 1 + rng() % kv.layers;
    const uint64_t bytes = *StagingBytes(kv, slice, blocks.size());

    std::vector<unsigned char> want(bytes);
    ASSERT_TRUE(GatherHost(kv, cache.data(), blocks, slice, want.data()).ok());
    DeviceBuffer d_cache(kv.span_bytes), d_staging(bytes), d_blocks(blocks.size() * 8);
    d_cache.Upload(cache);
    d_blocks.Upload(blocks);
    KV_CUDA_OK(cudaMemset(d_staging.get(), 0xEE, bytes));
    ASSERT_TRUE(LaunchGather(kv, d_cache.get(), reinterpret_cast<int64_t*>(d_blocks.get()),
                             blocks.size(), slice, d_staging.get(), nullptr)
                    .ok());
    KV_CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(d_staging.Download<unsigned char>(bytes), want) << layout.order << " " << trial;

    // Scatter fresh bytes back over a poisoned cache; compare every byte of the region.
    std::vector<unsigned char> staging(bytes);
    for (auto& b : staging) b = static_cast<unsigned char>(rng());
    std::vector<unsigned char> want_cache(kv.span_bytes, 0xEE);
    // Duplicate block ids would race on the device; the reference is last-writer-wins.
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    const uint64_t scatter_bytes = *StagingBytes(kv, slice, blocks.size());
    staging.resize(scatter_bytes);
    ASSERT_TRUE(ScatterHost(kv, want_cache.data(), blocks, slice, staging.data()).ok());
    d_blocks.Upload(blocks);
    d_staging.Upload(staging);
    KV_CUDA_OK(cudaMemset(d_cache.get(), 0xEE, kv.span_bytes));
    ASSERT_TRUE(LaunchScatter(kv, d_cache.get(), reinterpret_cast<int64_t*>(d_blocks.get()),
                              blocks.size(), slice, d_staging.get(), nullptr)
                    .ok());
    KV_CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(d_cache.Download<unsigned char>(kv.span_bytes), want_cache) << layout.order;
  }
}

TEST(GpuGather, SkipsOutOfRangeBlockIds) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(42);
  const auto layout = testing::MakeLayout("LBNHC", 1, 4, 1, 2, 32, rng, false);
  const std::vector<int64_t> blocks = {1, 99, -1};
  const uint64_t bytes = *StagingBytes(layout.kv, {}, 3);
  DeviceBuffer cache(layout.kv.span_bytes), staging(bytes), d_blocks(24);
  d_blocks.Upload(blocks);
  KV_CUDA_OK(cudaMemset(cache.get(), 0x11, layout.kv.span_bytes));
  KV_CUDA_OK(cudaMemset(staging.get(), 0xEE, bytes));
  ASSERT_TRUE(LaunchGather(layout.kv, cache.get(), reinterpret_cast<int64_t*>(d_blocks.get()), 3,
                           {}, staging.get(), nullptr)
                  .ok());
  KV_CUDA_OK(cudaDeviceSynchronize());
  const auto got = staging.Download<unsigned char>(bytes);
  for (uint64_t i = 0; i < bytes; ++i) ASSERT_EQ(got[i], i < bytes / 3 ? 0x11 : 0xEE) << i;
}

}  // namespace
}  // namespace kv::kernels
