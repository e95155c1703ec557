// Paged decode attention: one new query token per sequence against its cached K/V.
//
// For sequence s and query head q (KV head q / (num_q_heads / kv.heads), i.e. GQA with
// num_q_heads a multiple of kv.heads):
//   out[s, q] = softmax_j(scale · <query[s, q], K_j>) · V_j  over tokens j < seq_lens[s],
// token j at block block_table[s · block_table_stride + j / block_size], offset j % block_size.
// Inputs fp16 or bf16, accumulation in fp32, output in the input dtype. A sequence of length 0
// gets zeros. Tokens whose block id lies outside [0, kv.blocks) are left out of the softmax
// (they should never occur; this keeps a bad table from reading outside the cache). A row must
// hold ceil(min(seq_len, max_seq_len) / block_size) ids: the CPU reference checks this
// (kOutOfRange, nothing written); the kernel cannot see seq_lens on the host and trusts it.
//
// The GPU path is flash-decoding: the context is split into partitions of
// DecodePartitionTokens() tokens, each (sequence, KV head, partition) is one CTA that serves
// every query head of its group from one read of K and V, and a merge kernel combines the
// partitions. It needs a workspace of DecodeAttentionWorkspaceBytes(); head_dim 64, 128 or 256.
#pragma once

#include <cstdint>

#include "kernels/strided_kv.h"
#include "base/status.h"

namespace kv::kernels {

struct DecodeAttentionArgs {
  const void* query = nullptr;           // [num_seqs, num_q_heads, head_dim] of kv.dtype
  void* out = nullptr;                   // same shape and dtype
  const int32_t* block_table = nullptr;  // [num_seqs, block_table_stride]
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;  // [num_seqs]; each ≤ max_seq_len
  int64_t num_seqs = 0;
  int64_t num_q_heads = 0;
  int64_t max_seq_len = 0;  // bounds the workspace and the partitions launched
  float scale = 1.0f;       // usually 1/sqrt(head_dim)
};

// Partitions hold kDecodeMaxPartitionTokens tokens, halved (down to 128) while the launch would
// have fewer than kDecodeMinCtas CTAs, so short contexts still fill the GPU.
inline constexpr int64_t kDecodeMaxPartitionTokens = 512;
inline constexpr int64_t kDecodeMinCtas = 2048;
int64_t DecodePartitionTokens(const PagedKv& kv, const DecodeAttentionArgs& args);

// CPU reference, accumulating in double.
Status DecodeAttentionHost(const PagedKv& kv, const void* layer_base,
                           const DecodeAttentionArgs& args);

uint64_t DecodeAttentionWorkspaceBytes(const PagedKv& kv, const DecodeAttentionArgs& args);
// All pointers device-resident; `workspace` holds at least DecodeAttentionWorkspaceBytes().
// Sequence lengths above max_seq_len are clamped to it. Asynchronous on `stream`.
Status LaunchDecodeAttention(const PagedKv& kv, const void* layer_base,
                             const DecodeAttentionArgs& args, void* workspace,
                             uint64_t workspace_bytes, void* stream);

}  // namespace kv::kernels
