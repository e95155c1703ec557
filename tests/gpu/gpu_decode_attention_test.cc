#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/decode_attention.h"
#include "kernels/half.h"
#include "tests/support/attention_problem.h"
#include "tests/support/cuda_test_util.h"

namespace kv::kernels {
namespace {

using testing::AttentionProblem;
using testing::DeviceBuffer;

// Runs the kernel on `p`; returns the output as floats (NaN where the kernel wrote nothing).
std::vector<float> RunOnDevice(const AttentionProblem& p) {
  DeviceBuffer cache(p.cache.size()), query(p.query.size() * 2), out(p.query.size() * 2),
      table(p.block_table.size() * 4), lens(p.seq_lens.size() * 4);
  cache.Upload(p.cache);
  query.Upload(p.query);
  table.Upload(p.block_table);
  lens.Upload(p.seq_lens);
  cudaMemset(out.get(), 0xFF, out.bytes());  // NaN in both fp16 and bf16
  DecodeAttentionArgs args = p.args;
  args.query = query.get();
  args.out = out.get();
  args.block_table = reinterpret_cast<int32_t*>(table.get());
  args.seq_lens = reinterpret_cast<int32_t*>(lens.get());
  const uint64_t ws_bytes = DecodeAttentionWorkspaceBytes(p.paged, args);
  DeviceBuffer workspace(ws_bytes);
  const Status s = LaunchDecodeAttention(p.paged, cache.get() + p.layer * p.layout.kv.layer_stride,
                                         args, workspace.get(), ws_bytes, nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto raw = out.Download<uint16_t>(p.query.size());
  std::vector<float> result(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) result[i] = LoadElement(&raw[i], p.paged.dtype);
  return result;
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    err += (got[i] - want[i]) * double(got[i] - want[i]);
    norm += want[i] * double(want[i]);
  }
  return std::sqrt(err / std::max(norm, 1e-30));
}

std::vector<float> Reference(AttentionProblem& p) {
  std::vector<uint16_t> out(p.query.size());
  p.args.out = out.data();
  EXPECT_TRUE(DecodeAttentionHost(p.paged, p.layer_base(), p.args).ok());
  std::vector<float> result(out.size());
  for (size_t i = 0; i < out.size(); ++i) result[i] = LoadElement(&out[i], p.paged.dtype);
  return result;
}

struct Case {
  int64_t head_dim, kv_heads, group, block_size, seqs, max_len;
  int pad_quantum;  // 0: dense; 2: rows at any even alignment (scalar loads)
};

TEST(GpuDecodeAttention, MatchesReferenceAcrossShapesOrdersAndDtypes) {
  KV_SKIP_WITHOUT_CUDA();
  const Case cases[] = {{64, 2, 1, 16, 3, 700, 0},   {128, 2, 4, 16, 4, 1500, 16},
                        {256, 1, 8, 32, 2, 1030, 0}, {128, 1, 12, 16, 2, 600, 0},
                        {128, 4, 3, 8, 3, 513, 2},   {64, 8, 4, 64, 5, 2100, 0},
                        {256, 2, 2, 16, 2, 90, 2},   {128, 8, 4, 16, 6, 4096, 0},
                        {128, 2, 4, 12, 3, 1100, 0}};  // a block size that is no power of two
  std::mt19937_64 rng(61);
  int index = 0;
  for (const Case& c : cases) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const std::string order = testing::kOrders[index++ % 8];
      auto p =
          testing::MakeAttentionProblem(rng, order, c.head_dim, c.kv_heads, c.group, c.block_size,
                                        c.seqs, c.max_len, dtype, c.pad_quantum != 0);
      if (c.pad_quantum == 2) {
        // Re-lay the cache with 2-byte padding: K/V rows lose 16-byte alignment.
        p = testing::MakeAttentionProblem(rng, order, c.head_dim, c.kv_heads, c.group, c.block_size,
                                          c.seqs, c.max_len, dtype, false);
        auto layout = testing::MakeLayout(order, 2, p.layout.kv.blocks, c.kv_heads, c.block_size,
                                          p.layout.kv.content_bytes, rng, true, 2);
        p.layout = layout;
        p.paged = *SplitKv(layout.kv, c.head_dim, dtype);
        p.cache.resize(layout.kv.span_bytes);
        std::uniform_real_distribution<float> v(-1.0f, 1.0f);
        for (size_t i = 0; i + 1 < p.cache.size(); i += 2) StoreElement(&p.cache[i], dtype, v(rng));
      }
      const auto got = RunOnDevice(p);
      const auto want = Reference(p);
      EXPECT_LE(RelativeError(got, want), 1e-2)
          << order << " head_dim " << c.head_dim << " group " << c.group << " " << DTypeName(dtype);
    }
  }
}

// Block ids outside the cache drop their tokens from the softmax (as in the reference), and
// sharply peaked scores make the running max grow mid-partition, so every rescale path runs.
TEST(GpuDecodeAttention, DropsBadBlockIdsAndRescalesPeakedScores) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(62);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    auto p = testing::MakeAttentionProblem(rng, "LBNHC", 128, 2, 4, 16, 4, 2000, dtype, false);
    p.args.scale = 3.0f;
    for (size_t i = 0; i < p.block_table.size(); i += 7) {
      p.block_table[i] = i % 2 ? -1 : static_cast<int32_t>(p.paged.blocks + i);
    }
    const auto got = RunOnDevice(p);
    const auto want = Reference(p);
    EXPECT_LE(RelativeError(got, want), 1e-2) << DTypeName(dtype);
  }
}

// The kernel streams a partition in tiles with a running max: leading tiles with no valid token
// (max still -inf) must rescale to nothing once a real one arrives; a partition and a whole
// sequence without valid tokens must give a zero sum that the merge drops, or zeros.
TEST(GpuDecodeAttention, LeadingEmptyTilesAndEmptySequences) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(63);
  for (int64_t head_dim : {64, 128, 256}) {
    auto p = testing::MakeAttentionProblem(rng, "LBNHC", head_dim, 2, 4, 16, 3, 1800,
                                           DType::kBFloat16, false);
    p.args.scale = 3.0f;
    const int64_t stride = p.args.block_table_stride;
    for (int64_t b = 0; b < 5; ++b) p.block_table[b] = -1;                // 80 tokens: > 1 tile
    for (int64_t b = 0; b < stride; ++b) p.block_table[stride + b] = -1;  // all of sequence 1
    for (int64_t b = 32; b < 64 && b < stride; ++b) {
      p.block_table[2 * stride + b] = -1;  // tokens 512..1023: one whole partition or more
    }
    p.seq_lens[1] = 700;
    p.seq_lens[2] = 1800;
    const auto got = RunOnDevice(p);
    const auto want = Reference(p);
    EXPECT_LE(RelativeError(got, want), 1e-2) << "head_dim " << head_dim;
    const int64_t row = p.args.num_q_heads * head_dim;  // sequence 1's outputs are all zero
    for (int64_t i = row; i < 2 * row; ++i) ASSERT_EQ(got[i], 0.0f) << "element " << i;
  }
}

}  // namespace
}  // namespace kv::kernels
