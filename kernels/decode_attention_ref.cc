#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/decode_attention.h"
#include "kernels/half.h"

namespace kv::kernels {

Status DecodeAttentionHost(const PagedKv& kv, const void* layer_base,
                           const DecodeAttentionArgs& args) {
  if (kv.block_size <= 0) return Status::InvalidArgument("block_size must be positive");
  if (kv.heads <= 0 || args.num_seqs < 0 || args.num_q_heads <= 0 ||
      args.num_q_heads % kv.heads != 0) {
    return Status::InvalidArgument("num_q_heads " + std::to_string(args.num_q_heads) +
                                   " must be a positive multiple of the " +
                                   std::to_string(kv.heads) + " kv heads");
  }
  const auto* cache = static_cast<const unsigned char*>(layer_base);
  const auto* query = static_cast<const unsigned char*>(args.query);
  auto* out = static_cast<unsigned char*>(args.out);
  const int64_t group = args.num_q_heads / kv.heads;
  const int64_t d = kv.head_dim;
  std::vector<double> q(d), scores, acc(d);
  // Each sequence reads its own row of the block table only; check before writing any output.
  for (int64_t s = 0; s < args.num_seqs; ++s) {
    const int64_t len = std::min<int64_t>(args.seq_lens[s], args.max_seq_len);
    if (len > 0 && (len + kv.block_size - 1) / kv.block_size > args.block_table_stride) {
      return Status::OutOfRange("sequence " + std::to_string(s) + " of " + std::to_string(len) +
                                " tokens needs more blocks than a block-table row holds (" +
                                std::to_string(args.block_table_stride) + ")");
    }
  }
  for (int64_t s = 0; s < args.num_seqs; ++s) {
    const int64_t len = std::min<int64_t>(args.seq_lens[s], args.max_seq_len);
    for (int64_t qh = 0; qh < args.num_q_heads; ++qh) {
      const int64_t h = qh / group;
      const unsigned char* q_row = query + ((s * args.num_q_heads + qh) * d) * kDTypeBytes;
      for (int64_t i = 0; i < d; ++i) q[i] = LoadElement(q_row + i * kDTypeBytes, kv.dtype);
      scores.assign(std::max<int64_t>(len, 0), -std::numeric_limits<double>::infinity());
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < len; ++j) {
        const int32_t block = args.block_table[s * args.block_table_stride + j / kv.block_size];
        if (block < 0 || block >= kv.blocks) continue;
        const unsigned char* k = cache + kv.token_offset(block, h, j % kv.block_size) + kv.k_offset;
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += q[i] * LoadElement(k + i * kDTypeBytes, kv.dtype);
        scores[j] = dot * args.scale;
        max_score = std::max(max_score, scores[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0;
      for (int64_t j = 0; j < len && std::isfinite(max_score); ++j) {
        if (!std::isfinite(scores[j])) continue;
        const int32_t block = args.block_table[s * args.block_table_stride + j / kv.block_size];
        const unsigned char* v = cache + kv.token_offset(block, h, j % kv.block_size) + kv.v_offset;
        const double p = std::exp(scores[j] - max_score);
        sum += p;
        for (int64_t i = 0; i < d; ++i) acc[i] += p * LoadElement(v + i * kDTypeBytes, kv.dtype);
      }
      unsigned char* o_row = out + ((s * args.num_q_heads + qh) * d) * kDTypeBytes;
      for (int64_t i = 0; i < d; ++i) {
        const double o = sum > 0 ? acc[i] / sum : 0.0;
        StoreElement(o_row + i * kDTypeBytes, kv.dtype, static_cast<float>(o));
      }
    }
  }
  return Status::Ok();
}

int64_t DecodePartitionTokens(const PagedKv& kv, const DecodeAttentionArgs& args) {
  const int64_t group = args.num_q_heads / std::max<int64_t>(kv.heads, 1);
  const int64_t ctas_per_partition = args.num_seqs * kv.heads * ((group + 7) / 8);
  int64_t tokens = kDecodeMaxPartitionTokens;
  while (tokens > 128 &&
         ctas_per_partition * ((args.max_seq_len + tokens - 1) / tokens) < kDecodeMinCtas) {
    tokens /= 2;
  }
  return tokens;
}

uint64_t DecodeAttentionWorkspaceBytes(const PagedKv& kv, const DecodeAttentionArgs& args) {
  const int64_t tokens = DecodePartitionTokens(kv, args);
  const int64_t partitions = std::max<int64_t>(1, (args.max_seq_len + tokens - 1) / tokens);
  // Per (sequence, query head, partition): head_dim partial sums, the max and the sum of exps.
  return static_cast<uint64_t>(args.num_seqs * args.num_q_heads * partitions * (kv.head_dim + 2)) *
         sizeof(float);
}

}  // namespace kv::kernels
