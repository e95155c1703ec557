#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/decode_attention.h"
#include "kernels/half.h"
#include "tests/support/attention_problem.h"

namespace kv::kernels {
namespace {

// The definition on dense, gathered K and V: softmax(scale·K q)ᵀ V through log-sum-exp.
std::vector<double> Definition(const testing::AttentionProblem& p, int64_t s, int64_t qh) {
  const StridedKv& kv = p.layout.kv;
  const int64_t d = p.paged.head_dim, group = p.args.num_q_heads / kv.heads, h = qh / group;
  const int64_t len = p.seq_lens[s];
  std::vector<std::vector<double>> k(len, std::vector<double>(d)), v = k;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t block = p.block_table[s * p.args.block_table_stride + j / kv.block_size];
    const int64_t n = j % kv.block_size;
    const uint64_t k_at = kv.offset(p.layer, block, h, n, 0);
    const uint64_t v_at = kv.planes == 2 ? kv.offset(p.layer, block, h, n, 1) : k_at + d * 2;
    for (int64_t i = 0; i < d; ++i) {
      k[j][i] = LoadElement(&p.cache[k_at + i * 2], p.paged.dtype);
      v[j][i] = LoadElement(&p.cache[v_at + i * 2], p.paged.dtype);
    }
  }
  std::vector<double> logits(len), out(d, 0.0);
  for (int64_t j = 0; j < len; ++j) {
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) {
      dot += k[j][i] * LoadElement(&p.query[(s * p.args.num_q_heads + qh) * d + i], p.paged.dtype);
    }
    logits[j] = dot * p.args.scale;
  }
  if (len == 0) return out;
  double lse = logits[0];
  for (int64_t j = 1; j < len; ++j) {
    lse = std::max(lse, logits[j]) + std::log1p(std::exp(-std::fabs(lse - logits[j])));
  }
  for (int64_t j = 0; j < len; ++j) {
    for (int64_t i = 0; i < d; ++i) out[i] += std::exp(logits[j] - lse) * v[j][i];
  }
  return out;
}

TEST(DecodeAttentionRef, MatchesDefinitionOnRandomLayouts) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 16; ++trial) {
    const std::string order = testing::kOrders[trial % 8];
    const int64_t head_dim = 16 << (trial % 3);
    const int64_t group = 1 + trial % 4;
    const DType dtype = trial % 2 ? DType::kBFloat16 : DType::kFloat16;
    auto p = testing::MakeAttentionProblem(rng, order, head_dim, 2, group, 4, 3, 37, dtype,
                                           trial % 3 == 0);
    std::vector<uint16_t> out(p.query.size(), 0xFFFF);
    p.args.out = out.data();
    ASSERT_TRUE(DecodeAttentionHost(p.paged, p.layer_base(), p.args).ok());
    double err = 0, norm = 0;
    for (int64_t s = 0; s < p.args.num_seqs; ++s) {
      for (int64_t qh = 0; qh < p.args.num_q_heads; ++qh) {
        const auto want = Definition(p, s, qh);
        for (int64_t i = 0; i < head_dim; ++i) {
          const double got = LoadElement(&out[(s * p.args.num_q_heads + qh) * head_dim + i], dtype);
          ASSERT_TRUE(std::isfinite(got));
          err += (got - want[i]) * (got - want[i]);
          norm += want[i] * want[i];
        }
      }
    }
    // Only the final rounding to 16 bits separates the two.
    EXPECT_LE(std::sqrt(err / std::max(norm, 1e-30)), dtype == DType::kBFloat16 ? 4e-3 : 5e-4)
        << order << " trial " << trial;
  }
}

TEST(DecodeAttentionRef, EmptySequenceGivesZerosAndBadHeadsAreRejected) {
  std::mt19937_64 rng(32);
  auto p = testing::MakeAttentionProblem(rng, "LBNHC", 16, 2, 2, 4, 2, 8, DType::kFloat16, false);
  p.seq_lens = {0, 0};
  std::vector<uint16_t> out(p.query.size(), 0x3c00);
  p.args.out = out.data();
  ASSERT_TRUE(DecodeAttentionHost(p.paged, p.layer_base(), p.args).ok());
  for (uint16_t e : out) EXPECT_EQ(e, 0);
  p.args.num_q_heads = 3;
  EXPECT_EQ(DecodeAttentionHost(p.paged, p.layer_base(), p.args).code(), Code::kInvalidArgument);
}

TEST(DecodeAttentionRef, PartitionsShrinkForShortContextsAndSizeTheWorkspace) {
  PagedKv kv;
  kv.heads = 8;
  kv.head_dim = 128;
  DecodeAttentionArgs args;
  args.num_q_heads = 32;
  args.num_seqs = 64;
  args.max_seq_len = 8192;  // 64·8·16 = 8192 CTAs at 512 tokens: enough
  EXPECT_EQ(DecodePartitionTokens(kv, args), kDecodeMaxPartitionTokens);
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(kv, args), 64u * 32 * 16 * 130 * 4);
  args.max_seq_len = 1024;  // 1024 CTAs at 512 tokens: halve once
  EXPECT_EQ(DecodePartitionTokens(kv, args), 256);
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(kv, args), 64u * 32 * 4 * 130 * 4);
  args.num_seqs = 1;
  args.max_seq_len = 100;  // never below 128 tokens
  EXPECT_EQ(DecodePartitionTokens(kv, args), 128);
}

}  // namespace
}  // namespace kv::kernels
