// Paged decode attention, flash-decoding style. Contract: decode_attention.h.
//
// Grid (partition, KV head × query-head chunk, sequence); 128 threads. One CTA reads the K and V
// of one partition (≤ 512 tokens) of one KV head once and serves up to kMaxGroup query heads
// from it, which is what makes GQA memory-bound on K/V rather than on re-reads.
//  1. Scores: a token's K row is split over D/8 lanes (16 bytes each); the lanes' partial dot
//     products with every query head (held in registers) are reduced by shuffles that trade
//     halves of the group rather than reducing each head alone.
//  2. Softmax of the partition per query head, in base 2 (exp2f), kept in shared memory.
//  3. P·V: thread owns 8 columns of one token stripe; stripes are reduced through shared memory.
// The CTA writes its unnormalised output, max and sum; the merge kernel combines partitions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <string>

#include "kernels/cuda_util.cuh"
#include "kernels/decode_attention.h"

namespace kv::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;
constexpr int kUnroll = 8;
constexpr int kPartition = static_cast<int>(kDecodeMaxPartitionTokens);
constexpr float kLog2e = 1.4426950408889634f;

struct Workspace {
  float* out;  // [seqs][q_heads][partitions][head_dim]
  float* max;  // [seqs][q_heads][partitions]
  float* sum;
  int partitions;
  int partition_tokens;  // ≤ kPartition
};

template <bool kBf16>
__device__ __forceinline__ void ToFloat8(const uint4& raw, float (&f)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 pair;
    if constexpr (kBf16) {
      pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
    } else {
      pair = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
    }
    f[2 * i] = pair.x;
    f[2 * i + 1] = pair.y;
  }
}

// 16 bytes at p: one vector load when the layout keeps rows 16-byte aligned, else 8 two-byte
// loads (PagedKv strides may be padded to any even byte count).
__device__ __forceinline__ uint4 Load16(const unsigned char* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const uint4*>(p);
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return make_uint4(h[0] | (uint32_t{h[1]} << 16), h[2] | (uint32_t{h[3]} << 16),
                    h[4] | (uint32_t{h[5]} << 16), h[6] | (uint32_t{h[7]} << 16));
}

// Sums each of kGroup values over the kLanes lanes of a token with kGroup - 1 + log2(kLanes /
// kGroup) shuffles instead of kGroup·log2(kLanes): at each of the first log2(kGroup) steps a lane
// keeps one half of its values and trades the other half with its partner. Afterwards v[0] of
// every lane is the full sum of one value; returns which one (kGroup ≤ kLanes).
template <int kGroup, int kLanes>
__device__ __forceinline__ int SumAcrossLanes(float (&v)[kGroup], int lane) {
  static_assert(kGroup <= kLanes, "more values than lanes");
  int which = 0;
#pragma unroll
  for (int width = kGroup, offset = kLanes / 2; width > 1; width /= 2, offset /= 2) {
    const bool upper = (lane & offset) != 0;
    if (upper) which += width / 2;
#pragma unroll
    for (int i = 0; i < width / 2; ++i) {
      const float send = upper ? v[i] : v[i + width / 2];
      const float keep = upper ? v[i + width / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
  }
#pragma unroll
  for (int offset = kLanes / kGroup / 2; offset > 0; offset /= 2) {
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
  }
  return which;
}

template <int kHeadDim, int kGroup, bool kBf16>
__global__ void __launch_bounds__(kThreads)
    PartitionKernel(PagedKv kv, const unsigned char* cache, DecodeAttentionArgs args, Workspace ws,
                    int chunks_per_kv_head, bool aligned) {
  constexpr int kLanesPerToken = kHeadDim / 8;
  constexpr int kTokensPerWarp = 32 / kLanesPerToken;
  constexpr int kStripes = kThreads / kLanesPerToken;
  // Scores for phase 1-2, then the stripe partial sums of phase 3.
  constexpr int kScoreFloats = kGroup * kPartition;
  constexpr int kReduceFloats = kStripes * kGroup * kHeadDim;
  __shared__ float shared[kScoreFloats > kReduceFloats ? kScoreFloats : kReduceFloats];
  __shared__ float head_max[kGroup], head_sum[kGroup];
  __shared__ int32_t block_ids[kPartition];  // this partition's slice of the block table

  const int partition = blockIdx.x;
  const int kv_head = blockIdx.y / chunks_per_kv_head;
  const int chunk = blockIdx.y % chunks_per_kv_head;
  const int seq = blockIdx.z;
  const int group = static_cast<int>(args.num_q_heads / kv.heads);
  const int q_first = kv_head * group + chunk * kMaxGroup;
  const int q_count = min(kGroup, group - chunk * kMaxGroup);
  const int seq_len = min(args.seq_lens[seq], static_cast<int>(args.max_seq_len));
  const int token_begin = partition * ws.partition_tokens;
  const int tokens = min(ws.partition_tokens, seq_len - token_begin);
  if (tokens <= 0) return;  // the merge kernel ignores partitions past the sequence
  const int block_size = static_cast<int>(kv.block_size);
  const int first_block = token_begin / block_size;
  const int32_t* table = args.block_table + seq * args.block_table_stride;
  // Address loads then depend on shared memory, not on a global load per token.
  for (int i = threadIdx.x; i <= (token_begin + tokens - 1) / block_size - first_block;
       i += kThreads) {
    block_ids[i] = table[first_block + i];
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int column = (threadIdx.x % kLanesPerToken) * 8;
  const auto* query = static_cast<const unsigned char*>(args.query);

  float q[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (g < q_count) {
      const int64_t row = (static_cast<int64_t>(seq) * args.num_q_heads + q_first + g) * kHeadDim;
      ToFloat8<kBf16>(Load16(query + (row + column) * kDTypeBytes, aligned), q[g]);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[g][i] *= args.scale * kLog2e;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) q[g][i] = 0.0f;
    }
  }

  auto token_row = [&](int j, int64_t plane_offset) -> const unsigned char* {
    const int token = token_begin + j;
    const int32_t block = block_ids[token / block_size - first_block];
    if (block < 0 || block >= kv.blocks) return nullptr;
    return cache + kv.token_offset(block, kv_head, token % block_size) + plane_offset +
           column * kDTypeBytes;
  };

  // 1. Scores.
  const int sub = lane / kLanesPerToken;
  for (int base = warp * kTokensPerWarp; base < tokens; base += kWarps * kTokensPerWarp * kUnroll) {
    uint4 raw[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kWarps * kTokensPerWarp + sub;
      const unsigned char* row = j < tokens ? token_row(j, kv.k_offset) : nullptr;
      valid[u] = row != nullptr;
      raw[u] = valid[u] ? Load16(row, aligned) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float k[8];
      ToFloat8<kBf16>(raw[u], k);
      const int j = base + u * kWarps * kTokensPerWarp + sub;
      float dot[kGroup];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        dot[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot[g] = fmaf(q[g][i], k[i], dot[g]);
      }
      const int head = SumAcrossLanes<kGroup, kLanesPerToken>(dot, lane);
      if ((lane & (kLanesPerToken / kGroup - 1)) == 0 && j < tokens) {
        shared[head * kPartition + j] = valid[u] ? dot[0] : -FLT_MAX;
      }
    }
  }
  __syncthreads();

  // 2. Softmax per query head (one warp per head).
  for (int g = warp; g < kGroup; g += kWarps) {
    float* s = shared + g * kPartition;
    float m = -FLT_MAX;
    for (int j = lane; j < tokens; j += 32) m = fmaxf(m, s[j]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(~0u, m, offset));
    float l = 0.0f;
    for (int j = lane; j < tokens; j += 32) {
      const float p = s[j] == -FLT_MAX ? 0.0f : exp2f(s[j] - m);
      s[j] = p;
      l += p;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) l += __shfl_xor_sync(~0u, l, offset);
    if (lane == 0) {
      head_max[g] = m;
      head_sum[g] = l;
    }
  }
  __syncthreads();

  // 3. P·V over token stripes.
  const int stripe = threadIdx.x / kLanesPerToken;
  float acc[kGroup][8] = {};
  for (int base = stripe; base < tokens; base += kStripes * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kStripes;
      const unsigned char* row = j < tokens ? token_row(j, kv.v_offset) : nullptr;
      raw[u] = row ? Load16(row, aligned) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kStripes;
      if (j >= tokens) break;
      float v[8];
      ToFloat8<kBf16>(raw[u], v);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float p = shared[g * kPartition + j];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p, v[i], acc[g][i]);
      }
    }
  }
  __syncthreads();  // scores are dead; reuse shared for the stripe reduction
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) shared[(stripe * kGroup + g) * kHeadDim + column + i] = acc[g][i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < q_count * kHeadDim; e += kThreads) {
    const int g = e / kHeadDim, d = e % kHeadDim;
    float total = 0.0f;
    for (int s = 0; s < kStripes; ++s) total += shared[(s * kGroup + g) * kHeadDim + d];
    const int64_t slot =
        (static_cast<int64_t>(seq) * args.num_q_heads + q_first + g) * ws.partitions + partition;
    ws.out[slot * kHeadDim + d] = total;
    if (d == 0) {
      ws.max[slot] = head_max[g];
      ws.sum[slot] = head_sum[g];
    }
  }
}

// One CTA of head_dim threads per (sequence, query head): rescale and add the partitions.
template <bool kBf16>
__global__ void MergeKernel(DecodeAttentionArgs args, Workspace ws, int head_dim) {
  const int seq = blockIdx.x / args.num_q_heads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * ws.partitions;
  const int seq_len = min(args.seq_lens[seq], static_cast<int>(args.max_seq_len));
  const int used = seq_len <= 0 ? 0 : (seq_len + ws.partition_tokens - 1) / ws.partition_tokens;
  float m = -FLT_MAX;
  for (int p = 0; p < used; ++p) {
    if (ws.sum[first + p] > 0.0f) m = fmaxf(m, ws.max[first + p]);
  }
  const int d = threadIdx.x;
  float numerator = 0.0f, denominator = 0.0f;
  for (int p = 0; p < used; ++p) {
    const float l = ws.sum[first + p];
    if (l <= 0.0f) continue;
    const float w = exp2f(ws.max[first + p] - m);
    denominator += w * l;
    numerator += w * ws.out[(first + p) * head_dim + d];
  }
  const float o = denominator > 0.0f ? numerator / denominator : 0.0f;
  auto* out = static_cast<unsigned char*>(args.out) +
              (static_cast<int64_t>(blockIdx.x) * head_dim + d) * kDTypeBytes;
  if constexpr (kBf16) {
    *reinterpret_cast<__nv_bfloat16*>(out) = __float2bfloat16_rn(o);
  } else {
    *reinterpret_cast<__half*>(out) = __float2half_rn(o);
  }
}

template <int kHeadDim, bool kBf16>
Status LaunchFor(const PagedKv& kv, const unsigned char* cache, const DecodeAttentionArgs& args,
                 const Workspace& ws, bool aligned, cudaStream_t stream) {
  const int group = static_cast<int>(args.num_q_heads / kv.heads);
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const dim3 grid(ws.partitions, static_cast<unsigned>(kv.heads * chunks),
                  static_cast<unsigned>(args.num_seqs));
  const int widest = std::min(group, kMaxGroup);
  if (widest <= 1) {
    PartitionKernel<kHeadDim, 1, kBf16>
        <<<grid, kThreads, 0, stream>>>(kv, cache, args, ws, chunks, aligned);
  } else if (widest <= 2) {
    PartitionKernel<kHeadDim, 2, kBf16>
        <<<grid, kThreads, 0, stream>>>(kv, cache, args, ws, chunks, aligned);
  } else if (widest <= 4) {
    PartitionKernel<kHeadDim, 4, kBf16>
        <<<grid, kThreads, 0, stream>>>(kv, cache, args, ws, chunks, aligned);
  } else {
    PartitionKernel<kHeadDim, 8, kBf16>
        <<<grid, kThreads, 0, stream>>>(kv, cache, args, ws, chunks, aligned);
  }
  KV_RETURN_IF_ERROR(detail::LaunchStatus("decode attention partitions"));
  MergeKernel<kBf16>
      <<<static_cast<unsigned>(args.num_seqs * args.num_q_heads), kHeadDim, 0, stream>>>(args, ws,
                                                                                         kHeadDim);
  return detail::LaunchStatus("decode attention merge");
}

template <int kHeadDim>
Status LaunchForDim(const PagedKv& kv, const unsigned char* cache, const DecodeAttentionArgs& args,
                    const Workspace& ws, bool aligned, cudaStream_t stream) {
  if (kv.dtype == DType::kBFloat16) {
    return LaunchFor<kHeadDim, true>(kv, cache, args, ws, aligned, stream);
  }
  return LaunchFor<kHeadDim, false>(kv, cache, args, ws, aligned, stream);
}

}  // namespace

Status LaunchDecodeAttention(const PagedKv& kv, const void* layer_base,
                             const DecodeAttentionArgs& args, void* workspace,
                             uint64_t workspace_bytes, void* stream) {
  if (args.num_seqs < 0 || args.num_q_heads <= 0 || args.num_q_heads % kv.heads != 0) {
    return Status::InvalidArgument("num_q_heads " + std::to_string(args.num_q_heads) +
                                   " must be a positive multiple of the " +
                                   std::to_string(kv.heads) + " kv heads");
  }
  if (args.num_seqs == 0) return Status::Ok();
  if (args.num_seqs > 65535 || kv.heads * ((args.num_q_heads / kv.heads + 7) / 8) > 65535) {
    return Status::Unsupported("decode attention launches at most 65535 sequences and head chunks");
  }
  if (args.max_seq_len < 0 || args.max_seq_len > (int64_t{1} << 30)) {
    return Status::InvalidArgument("max_seq_len out of range");
  }
  const uint64_t need = DecodeAttentionWorkspaceBytes(kv, args);
  if (workspace_bytes < need) {
    return Status::ResourceExhausted("decode attention needs " + std::to_string(need) +
                                     " workspace bytes, got " + std::to_string(workspace_bytes));
  }
  if ((kv.k_offset | kv.v_offset | kv.block_stride | kv.head_stride | kv.token_stride) & 1) {
    return Status::InvalidArgument("K/V rows must be 2-byte aligned");
  }
  const auto base = reinterpret_cast<uintptr_t>(layer_base);
  const bool aligned = ((base | kv.k_offset | kv.v_offset | kv.block_stride | kv.head_stride |
                         kv.token_stride | reinterpret_cast<uintptr_t>(args.query)) &
                        15) == 0;
  if (kv.block_size > (int64_t{1} << 30)) return Status::Unsupported("block size above 2^30");
  Workspace ws;
  ws.partition_tokens = static_cast<int>(DecodePartitionTokens(kv, args));
  ws.partitions = static_cast<int>(
      std::max<int64_t>(1, (args.max_seq_len + ws.partition_tokens - 1) / ws.partition_tokens));
  const uint64_t slots = static_cast<uint64_t>(args.num_seqs * args.num_q_heads) * ws.partitions;
  ws.out = static_cast<float*>(workspace);
  ws.max = ws.out + slots * kv.head_dim;
  ws.sum = ws.max + slots;
  const auto* cache = static_cast<const unsigned char*>(layer_base);
  auto s = static_cast<cudaStream_t>(stream);
  switch (kv.head_dim) {
    case 64:
      return LaunchForDim<64>(kv, cache, args, ws, aligned, s);
    case 128:
      return LaunchForDim<128>(kv, cache, args, ws, aligned, s);
    case 256:
      return LaunchForDim<256>(kv, cache, args, ws, aligned, s);
    default:
      return Status::Unsupported("decode attention supports head_dim 64, 128 and 256, not " +
                                 std::to_string(kv.head_dim));
  }
}

}  // namespace kv::kernels
