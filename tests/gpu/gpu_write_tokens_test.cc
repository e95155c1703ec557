#include <algorithm>
#include <random>
#include <vector>

#include "kernels/write_tokens.h"
#include "tests/support/cuda_test_util.h"
#include "tests/support/random_layout.h"

namespace kv::kernels {
namespace {

using testing::DeviceBuffer;

TEST(GpuWriteTokens, MatchesReferenceOnRandomLayouts) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(51);
  for (int trial = 0; trial < 48; ++trial) {
    const int64_t head_dim = (trial % 5 == 0) ? 40 : 64 << (trial % 3);
    const bool planes = trial % 8 >= 6;
    // Padding of 2 bytes puts K/V rows at every even alignment; 16 keeps vectors whole.
    const auto layout = testing::MakeLayout(testing::kOrders[trial % 8], 2, 7, 1 + trial % 4, 16,
                                            (planes ? 1 : 2) * head_dim * kDTypeBytes, rng, true,
                                            trial % 3 == 0 ? 2 : 16);
    const StridedKv& kv = layout.kv;
    const auto paged = SplitKv(kv, head_dim, trial % 2 ? DType::kBFloat16 : DType::kFloat16);
    ASSERT_TRUE(paged.ok()) << paged.status().ToString();
    const int64_t tokens = 1 + rng() % 40;
    const int64_t stride = kv.heads * head_dim + (trial % 3) * 3;  // odd token strides too
    std::vector<uint16_t> key(tokens * stride), value(tokens * stride);
    for (auto& e : key) e = static_cast<uint16_t>(rng());
    for (auto& e : value) e = static_cast<uint16_t>(rng());
    std::vector<int64_t> all(kv.blocks * kv.block_size);
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int64_t> slots(tokens);
    for (int64_t t = 0; t < tokens; ++t) slots[t] = rng() % 6 == 0 ? -1 : all[t];

    std::vector<unsigned char> cache(kv.span_bytes);
    for (auto& b : cache) b = static_cast<unsigned char>(rng());
    const int64_t layer = 1;
    NewTokens host_tokens{key.data(), value.data(), slots.data(), tokens, stride, stride};
    std::vector<unsigned char> want = cache;
    ASSERT_TRUE(WriteTokensHost(*paged, want.data() + layer * kv.layer_stride, host_tokens).ok());

    DeviceBuffer d_cache(kv.span_bytes), d_key(key.size() * 2), d_value(value.size() * 2),
        d_slots(slots.size() * 8);
    d_cache.Upload(cache);
    d_key.Upload(key);
    d_value.Upload(value);
    d_slots.Upload(slots);
    NewTokens dev_tokens{d_key.get(), d_value.get(), reinterpret_cast<int64_t*>(d_slots.get()),
                         tokens,      stride,        stride};
    const Status s =
        LaunchWriteTokens(*paged, d_cache.get() + layer * kv.layer_stride, dev_tokens, nullptr);
    ASSERT_TRUE(s.ok()) << s.ToString();
    KV_CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(d_cache.Download<unsigned char>(kv.span_bytes), want)
        << layout.order << " trial " << trial;
  }
}

}  // namespace
}  // namespace kv::kernels
