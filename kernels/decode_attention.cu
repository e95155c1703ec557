// Paged decode attention, flash-decoding on tensor cores. Contract: decode_attention.h.
//
// Grid (partition, KV head × query-head chunk, sequence); 4 warps. One CTA reads the K and V of
// one partition (≤ 512 tokens) of one KV head once and serves up to kHeads query heads from it.
// CUDA-core FMAs cost 4 per K/V byte at GQA 4, which made the previous kernel issue-bound
// (benchmarks/kernels.md); here both products run as mma.m16n8k16 with the query heads as N = 8,
// so no mma row is wasted on padding up to 16 query heads:
//   S^T = K · Q^T   M = 16 tokens, N = 8 query heads, K = head_dim
//   O^T = V^T · P^T M = 16 columns of head_dim, N = 8 query heads, K = 16 tokens
// A dot product does not care in which order its terms are summed, so the fragments take K and
// V straight from 16-byte global loads in whatever element order those loads deliver, and Q and
// the output use the same order; no shared-memory staging or ldmatrix is needed. The scores'
// accumulator is the transpose of the B fragment P^T needs, which movmatrix.trans fixes in
// registers. Each warp runs an online softmax (base 2, one max and rescale per 16-token tile)
// over every fourth tile; the warps combine in shared memory and the CTA writes its
// unnormalised output, max and sum, which the merge kernel combines across partitions.
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
constexpr int kHeads = 8;  // query heads per CTA: the mma's N
constexpr int kTile = 16;  // tokens per mma tile
constexpr int kPartition = static_cast<int>(kDecodeMaxPartitionTokens);
constexpr float kLog2e = 1.4426950408889634f;

struct Workspace {
  float* out;  // [seqs][q_heads][partitions][head_dim]
  float* max;  // [seqs][q_heads][partitions]
  float* sum;
  int partitions;
  int partition_tokens;  // ≤ kPartition, a multiple of kTile
};

// 16 bytes at p: one vector load when the layout keeps rows 16-byte aligned, else 8 two-byte
// loads (PagedKv strides may be padded to any even byte count). Zeros for a null row.
__device__ __forceinline__ uint4 Load16(const unsigned char* p, bool aligned) {
  if (p == nullptr) return make_uint4(0, 0, 0, 0);
  if (aligned) return *reinterpret_cast<const uint4*>(p);
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return make_uint4(h[0] | (uint32_t{h[1]} << 16), h[2] | (uint32_t{h[3]} << 16),
                    h[4] | (uint32_t{h[5]} << 16), h[6] | (uint32_t{h[7]} << 16));
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// d += a · b for one m16n8k16 tile, fp32 accumulation.
template <bool kBf16>
__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Two floats as one register of two 16-bit elements, `low` in the low half.
template <bool kBf16>
__device__ __forceinline__ uint32_t Pack(float low, float high) {
  uint32_t packed;
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(low, high);
    packed = *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(low, high);
    packed = *reinterpret_cast<const uint32_t*>(&v);
  }
  return packed;
}

// The warp's 8×8 matrix of 16-bit elements, transposed (lane l holds row l/4, columns 2(l%4)
// and 2(l%4)+1, before and after).
__device__ __forceinline__ uint32_t Transpose(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// Lane l = 4g + t of a warp. Element orders (c: 32-column chunk of head_dim, h: its half):
//  - K: the lane loads 16 bytes of tokens g and g+8 at columns 32c + 8t; mma k-step (c, h)
//    takes words 2h and 2h+1 of them, so Q's B fragment is Q[head g] at the same columns.
//  - V: the lane loads 16 bytes of tokens 2t, 2t+1, 2t+8, 2t+9 at columns 64c + 8g; m-tile
//    (c, p) of O^T has rows g and g+8 at columns 64c + 8g + 2p and + 2p + 1 (low and high
//    halves of word p), interleaved across the two tokens by byte permutes.
template <int kHeadDim, bool kBf16>
__global__ void __launch_bounds__(kThreads)
    PartitionKernel(PagedKv kv, const unsigned char* cache, DecodeAttentionArgs args, Workspace ws,
                    int chunks_per_kv_head, bool aligned) {
  constexpr int kKChunks = kHeadDim / 32;
  constexpr int kVChunks = kHeadDim / 64;
  constexpr int kMTiles = kHeadDim / 16;
  __shared__ int64_t row_offset[kPartition];  // K row of each token from the cache; -1: skip
  __shared__ float warp_max[kWarps][kHeads], warp_sum[kWarps][kHeads];
  __shared__ float warp_out[kWarps][kHeads][kHeadDim];

  const int partition = blockIdx.x;
  const int kv_head = blockIdx.y / chunks_per_kv_head;
  const int chunk = blockIdx.y % chunks_per_kv_head;
  const int seq = blockIdx.z;
  const int group = static_cast<int>(args.num_q_heads / kv.heads);
  const int q_first = kv_head * group + chunk * kHeads;
  const int q_count = min(kHeads, group - chunk * kHeads);
  const int seq_len = min(args.seq_lens[seq], static_cast<int>(args.max_seq_len));
  const int token_begin = partition * ws.partition_tokens;
  const int tokens = min(ws.partition_tokens, seq_len - token_begin);
  if (tokens <= 0) return;  // the merge kernel ignores partitions past the sequence

  // One division and table lookup per token for the whole CTA, not per lane and product.
  const int padded = (tokens + kTile - 1) / kTile * kTile;
  const int32_t* table = args.block_table + seq * args.block_table_stride;
  for (int j = threadIdx.x; j < padded; j += kThreads) {
    int64_t offset = -1;
    if (j < tokens) {
      const int token = token_begin + j;
      const int32_t block = table[token / kv.block_size];
      if (block >= 0 && block < kv.blocks) {
        offset = kv.token_offset(block, kv_head, token % kv.block_size) + kv.k_offset;
      }
    }
    row_offset[j] = offset;
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const auto* query = static_cast<const unsigned char*>(args.query);
  uint4 q[kKChunks];
  {
    const unsigned char* row =
        g < q_count ? query + ((static_cast<int64_t>(seq) * args.num_q_heads + q_first + g) *
                               kHeadDim * kDTypeBytes)
                    : nullptr;
#pragma unroll
    for (int c = 0; c < kKChunks; ++c) {
      q[c] = Load16(row ? row + (32 * c + 8 * t) * kDTypeBytes : nullptr, aligned);
    }
  }
  const float score_scale = args.scale * kLog2e;
  const int64_t v_from_k = kv.v_offset - kv.k_offset;

  float acc[kMTiles][4] = {};  // O^T: [m-tile][row g / g+8 × head 2t / 2t+1]
  float running_max[2] = {-FLT_MAX, -FLT_MAX}, running_sum[2] = {0.0f, 0.0f};
  for (int tile = warp * kTile; tile < tokens; tile += kWarps * kTile) {
    const int64_t k_lo = row_offset[tile + g], k_hi = row_offset[tile + g + 8];
    uint4 k_rows[2][kKChunks];
#pragma unroll
    for (int c = 0; c < kKChunks; ++c) {
      const int column = (32 * c + 8 * t) * kDTypeBytes;
      k_rows[0][c] = Load16(k_lo < 0 ? nullptr : cache + k_lo + column, aligned);
      k_rows[1][c] = Load16(k_hi < 0 ? nullptr : cache + k_hi + column, aligned);
    }
    int64_t v_row[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t offset = row_offset[tile + 2 * t + (i & 1) + (i >> 1) * 8];
      v_row[i] = offset < 0 ? -1 : offset + v_from_k;
    }
    uint4 v_rows[4][kVChunks];
    auto load_v = [&] {
#pragma unroll
      for (int c = 0; c < kVChunks; ++c) {
        const int column = (64 * c + 8 * g) * kDTypeBytes;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v_rows[i][c] = Load16(v_row[i] < 0 ? nullptr : cache + v_row[i] + column, aligned);
        }
      }
    };
    // V's loads overlap the score math, except at head_dim 256 where they would not fit in
    // registers next to K's.
    if constexpr (kHeadDim <= 128) load_v();

    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // tokens g, g+8 × heads 2t, 2t+1
#pragma unroll
    for (int c = 0; c < kKChunks; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        Mma<kBf16>(s, Word(k_rows[0][c], 2 * h), Word(k_rows[1][c], 2 * h),
                   Word(k_rows[0][c], 2 * h + 1), Word(k_rows[1][c], 2 * h + 1), Word(q[c], 2 * h),
                   Word(q[c], 2 * h + 1));
      }
    }
    if constexpr (kHeadDim > 128) load_v();

    const bool valid_lo = k_lo >= 0, valid_hi = k_hi >= 0;
    float p[4];
#pragma unroll
    for (int head = 0; head < 2; ++head) {
      const float lo = valid_lo ? s[head] * score_scale : -FLT_MAX;
      const float hi = valid_hi ? s[head + 2] * score_scale : -FLT_MAX;
      float m = fmaxf(lo, hi);
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
      }
      m = fmaxf(m, running_max[head]);
      const float rescale = exp2f(running_max[head] - m);
      running_max[head] = m;
      p[head] = valid_lo ? exp2f(lo - m) : 0.0f;
      p[head + 2] = valid_hi ? exp2f(hi - m) : 0.0f;
      running_sum[head] = running_sum[head] * rescale + p[head] + p[head + 2];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        acc[mt][head] *= rescale;
        acc[mt][head + 2] *= rescale;
      }
    }
    // P^T's B fragment: tokens 2t, 2t+1 (then +8) of query head g.
    const uint32_t pt_lo = Transpose(Pack<kBf16>(p[0], p[1]));
    const uint32_t pt_hi = Transpose(Pack<kBf16>(p[2], p[3]));
#pragma unroll
    for (int c = 0; c < kVChunks; ++c) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t a = Word(v_rows[0][c], w), b = Word(v_rows[1][c], w);
        const uint32_t e = Word(v_rows[2][c], w), f = Word(v_rows[3][c], w);
        Mma<kBf16>(acc[4 * c + w], __byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632),
                   __byte_perm(e, f, 0x5410), __byte_perm(e, f, 0x7632), pt_lo, pt_hi);
      }
    }
  }

  // Combine the warps: lanes of one t share heads 2t, 2t+1 and hold disjoint tokens and columns.
#pragma unroll
  for (int head = 0; head < 2; ++head) {
    float l = running_sum[head];
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) l += __shfl_xor_sync(0xffffffffu, l, offset);
    if (g == 0) {
      warp_max[warp][2 * t + head] = running_max[head];
      warp_sum[warp][2 * t + head] = l;
    }
  }
#pragma unroll
  for (int c = 0; c < kVChunks; ++c) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int column = 64 * c + 8 * g + 2 * w;
      const float* a = acc[4 * c + w];
      warp_out[warp][2 * t][column] = a[0];
      warp_out[warp][2 * t + 1][column] = a[1];
      warp_out[warp][2 * t][column + 1] = a[2];
      warp_out[warp][2 * t + 1][column + 1] = a[3];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < q_count * kHeadDim; e += kThreads) {
    const int head = e / kHeadDim, d = e % kHeadDim;
    float m = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_max[w][head]);
    float total = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (warp_sum[w][head] <= 0.0f) continue;  // no valid token: its max is meaningless
      const float weight = exp2f(warp_max[w][head] - m);
      total += weight * warp_out[w][head][d];
      sum += weight * warp_sum[w][head];
    }
    const int64_t slot =
        (static_cast<int64_t>(seq) * args.num_q_heads + q_first + head) * ws.partitions + partition;
    ws.out[slot * kHeadDim + d] = total;
    if (d == 0) {
      ws.max[slot] = m;
      ws.sum[slot] = sum;
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
  const int chunks = (group + kHeads - 1) / kHeads;
  const dim3 grid(ws.partitions, static_cast<unsigned>(kv.heads * chunks),
                  static_cast<unsigned>(args.num_seqs));
  PartitionKernel<kHeadDim, kBf16>
      <<<grid, kThreads, 0, stream>>>(kv, cache, args, ws, chunks, aligned);
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
  if (kv.heads <= 0 || args.num_seqs < 0 || args.num_q_heads <= 0 ||
      args.num_q_heads % kv.heads != 0) {
    return Status::InvalidArgument("num_q_heads " + std::to_string(args.num_q_heads) +
                                   " must be a positive multiple of the " +
                                   std::to_string(kv.heads) + " kv heads");
  }
  if (args.num_seqs == 0) return Status::Ok();
  if (args.num_seqs > 65535 ||
      kv.heads * ((args.num_q_heads / kv.heads + kHeads - 1) / kHeads) > 65535) {
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
