// Paged decode attention, flash-decoding style. Contract: decode_attention.h.
//
// Grid (KV head × query-head chunk fastest, partition; sequence); 128 threads. One CTA reads the
// K and V of one partition (≤ 512 tokens) of one KV head once and serves up to kMaxGroup query
// heads from it, which is what makes GQA memory-bound on K/V rather than on re-reads.
// Decode attention streams: every byte of K/V is used once, so speed is bytes in flight per SM.
// The CTA walks its partition in tiles whose K and V rows go to shared memory by cp.async,
// kStages - 1 tiles ahead of the one it computes (48 KiB in flight per CTA), with an online
// softmax across tiles:
//  1. Scores: a token's K row is split over D/8 lanes (16 bytes each); the lanes' partial dot
//     products with every query head (held in registers) are reduced by shuffles that trade
//     halves of the group rather than reducing each head alone.
//  2. One warp per query head: the tile's max, the rescale factor of the running sum and
//     output, and the tile's probabilities (base 2, exp2f) in place of its scores.
//  3. P·V: a thread accumulates 8 columns of its token stripe; stripes are reduced at the end.
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
constexpr int kStages = 4;          // tiles in flight per CTA, the one computed included
constexpr int kStageBytes = 16384;  // K and V rows of one tile
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

// 16 bytes from global memory to shared memory, zeros when src is null. Aligned rows go through
// cp.async (L2 only), so a thread keeps several tiles of loads in flight without holding them in
// registers; the caller waits with cp.async.wait_group. Unaligned rows are copied synchronously.
__device__ __forceinline__ void StageChunk(unsigned char* dst, const unsigned char* src,
                                           const unsigned char* any_valid, bool aligned) {
#if __CUDA_ARCH__ >= 800
  if (aligned) {
    const auto shared_dst = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    // src-size 0 reads nothing and fills zeros; the address must still be a global one.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_dst),
                 "l"(src ? src : any_valid), "r"(src ? 16 : 0)
                 : "memory");
    return;
  }
#endif
  *reinterpret_cast<uint4*>(dst) = src ? Load16(src, aligned) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ void CommitStage() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void WaitStages() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

template <int kHeadDim>
struct Tiling {
  static constexpr int kLanesPerToken = kHeadDim / 8;           // 16 bytes each
  static constexpr int kTokens = kStageBytes / (4 * kHeadDim);  // K and V rows of a stage
  static constexpr int kStripes = kThreads / kLanesPerToken;    // tokens side by side
  static constexpr int kPasses = kTokens / kStripes;            // tokens per thread per tile
  static_assert(kPasses * kStripes == kTokens, "a tile is whole passes");
  static_assert(kDecodeMaxPartitionTokens % kTokens == 0 && 128 % kTokens == 0,
                "partitions are whole tiles");
};

// One CTA per (KV head, query-head chunk, partition, sequence), KV heads fastest so the CTAs of
// one block's heads run together and read its pages as a whole. The partition streams through
// kStages tiles of kStageBytes: tile t + kStages - 1 is in flight while tile t is computed. A
// thread stages exactly the 16-byte pieces it later reads (token stripe × column), so staging
// needs no barrier; the two barriers per tile are for the shared scores.
template <int kHeadDim, int kGroup, bool kBf16>
__global__ void __launch_bounds__(kThreads)
    PartitionKernel(PagedKv kv, const unsigned char* cache, DecodeAttentionArgs args, Workspace ws,
                    int chunks_per_kv_head, bool aligned) {
  using T = Tiling<kHeadDim>;
  extern __shared__ __align__(16) unsigned char stages[];  // [kStages][K rows, V rows]
  __shared__ float scores[2][kGroup][T::kTokens];          // double-buffered: one barrier per reuse
  __shared__ float rescale[2][kGroup];
  __shared__ float head_max[kGroup], head_sum[kGroup];
  __shared__ int32_t block_ids[kPartition];  // this partition's slice of the block table

  const int head_chunks = static_cast<int>(kv.heads) * chunks_per_kv_head;
  const int partition = blockIdx.x / head_chunks;
  const int kv_head = blockIdx.x % head_chunks / chunks_per_kv_head;
  const int chunk = blockIdx.x % chunks_per_kv_head;
  const int seq = blockIdx.y;
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
  // Address computations then depend on shared memory, not on a global load per token.
  for (int i = threadIdx.x; i <= (token_begin + tokens - 1) / block_size - first_block;
       i += kThreads) {
    block_ids[i] = table[first_block + i];
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int piece = threadIdx.x % T::kLanesPerToken;
  const int stripe = threadIdx.x / T::kLanesPerToken;
  const int column = piece * 8;

  // Start of (token j of the partition, this KV head) plus this thread's piece; null when j is
  // past the partition or its block id lies outside the cache.
  auto token_piece = [&](int j) -> const unsigned char* {
    if (j >= tokens) return nullptr;
    const int token = token_begin + j;
    const int32_t block = block_ids[token / block_size - first_block];
    if (block < 0 || block >= kv.blocks) return nullptr;
    return cache + kv.token_offset(block, kv_head, token % block_size) + column * kDTypeBytes;
  };
  // The thread's pieces of tile t: chunk threadIdx.x + p·kThreads, i.e. token stripe + p·kStripes.
  auto stage_tile = [&](int t) {
    unsigned char* k_rows = stages + (t % kStages) * kStageBytes;
#pragma unroll
    for (int p = 0; p < T::kPasses; ++p) {
      const unsigned char* src = token_piece(t * T::kTokens + p * T::kStripes + stripe);
      const int at = (p * kThreads + threadIdx.x) * 16;
      StageChunk(k_rows + at, src ? src + kv.k_offset : nullptr, cache, aligned);
      StageChunk(k_rows + kStageBytes / 2 + at, src ? src + kv.v_offset : nullptr, cache, aligned);
    }
    CommitStage();
  };

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

  const int tiles = (tokens + T::kTokens - 1) / T::kTokens;
  // Every thread commits a group per tile, empty ones past the end, so wait counts stay exact.
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles) {
      stage_tile(t);
    } else {
      CommitStage();
    }
  }

  constexpr int kHeadsPerWarp = (kGroup + kWarps - 1) / kWarps;
  float running_max[kHeadsPerWarp], running_sum[kHeadsPerWarp];  // of heads warp + i·kWarps
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    running_max[i] = -FLT_MAX;
    running_sum[i] = 0.0f;
  }
  float acc[kGroup][8] = {};

  for (int t = 0; t < tiles; ++t) {
    if (t + kStages - 1 < tiles) {
      stage_tile(t + kStages - 1);  // into the stage this thread finished with in tile t - 1
    } else {
      CommitStage();
    }
    WaitStages<kStages - 1>();
    const unsigned char* k_rows = stages + (t % kStages) * kStageBytes;
    const unsigned char* v_rows = k_rows + kStageBytes / 2;
    float(*s)[T::kTokens] = scores[t & 1];

    // Scores of the tile: each token's lanes reduce their partial dot products.
#pragma unroll
    for (int p = 0; p < T::kPasses; ++p) {
      float k[8];
      ToFloat8<kBf16>(*reinterpret_cast<const uint4*>(k_rows + (p * kThreads + threadIdx.x) * 16),
                      k);
      float dot[kGroup];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        dot[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot[g] = fmaf(q[g][i], k[i], dot[g]);
      }
      const int head = SumAcrossLanes<kGroup, T::kLanesPerToken>(dot, lane);
      if ((lane & (T::kLanesPerToken / kGroup - 1)) == 0) {
        const int j = p * T::kStripes + stripe;
        s[head][j] = token_piece(t * T::kTokens + j) ? dot[0] : -FLT_MAX;
      }
    }
    __syncthreads();

    // Online softmax, one warp per head: the tile's max, the rescale of what came before, and
    // the tile's probabilities in place of its scores.
#pragma unroll
    for (int i = 0; i < kHeadsPerWarp; ++i) {
      const int g = warp + i * kWarps;
      if (g >= kGroup) break;
      constexpr int kPerLane = (T::kTokens + 31) / 32;
      float x[kPerLane];
      float m = running_max[i];
#pragma unroll
      for (int r = 0; r < kPerLane; ++r) {
        const int j = lane + 32 * r;
        x[r] = j < T::kTokens ? s[g][j] : -FLT_MAX;
        m = fmaxf(m, x[r]);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(~0u, m, offset));
      float l = 0.0f;
#pragma unroll
      for (int r = 0; r < kPerLane; ++r) {
        const int j = lane + 32 * r;
        const float prob = x[r] == -FLT_MAX ? 0.0f : exp2f(x[r] - m);
        if (j < T::kTokens) s[g][j] = prob;
        l += prob;
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) l += __shfl_xor_sync(~0u, l, offset);
      const float alpha = exp2f(running_max[i] - m);  // 0 on the first real tile, 1 if no growth
      running_sum[i] = running_sum[i] * alpha + l;
      running_max[i] = m;
      if (lane == 0) rescale[t & 1][g] = alpha;
    }
    __syncthreads();

    // P·V of the tile into this thread's columns of its token stripe.
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float alpha = rescale[t & 1][g];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
    }
#pragma unroll
    for (int p = 0; p < T::kPasses; ++p) {
      float v[8];
      ToFloat8<kBf16>(*reinterpret_cast<const uint4*>(v_rows + (p * kThreads + threadIdx.x) * 16),
                      v);
      const int j = p * T::kStripes + stripe;
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float prob = s[g][j];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(prob, v[i], acc[g][i]);
      }
    }
  }

  // Reduce the stripes through the (now idle) stage memory.
  WaitStages<0>();
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int g = warp + i * kWarps;
    if (g < kGroup && lane == 0) {
      head_max[g] = running_max[i];
      head_sum[g] = running_sum[i];
    }
  }
  __syncthreads();
  auto* partial = reinterpret_cast<float*>(stages);
  static_assert(T::kStripes * kMaxGroup * kHeadDim * sizeof(float) <= kStages * kStageBytes,
                "stripe partials fit the stages");
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) partial[(stripe * kGroup + g) * kHeadDim + column + i] = acc[g][i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < q_count * kHeadDim; e += kThreads) {
    const int g = e / kHeadDim, d = e % kHeadDim;
    float total = 0.0f;
    for (int r = 0; r < T::kStripes; ++r) total += partial[(r * kGroup + g) * kHeadDim + d];
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

template <int kHeadDim, int kGroup, bool kBf16>
Status LaunchPartitions(const PagedKv& kv, const unsigned char* cache,
                        const DecodeAttentionArgs& args, const Workspace& ws, int chunks,
                        bool aligned, cudaStream_t stream) {
  constexpr int kDynamicBytes = kStages * kStageBytes;  // above the 48 KiB default
  auto* kernel = &PartitionKernel<kHeadDim, kGroup, kBf16>;
  KV_RETURN_IF_ERROR(detail::CudaStatus(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynamicBytes),
      "decode attention shared memory"));
  const dim3 grid(static_cast<unsigned>(ws.partitions * kv.heads * chunks),
                  static_cast<unsigned>(args.num_seqs));
  kernel<<<grid, kThreads, kDynamicBytes, stream>>>(kv, cache, args, ws, chunks, aligned);
  return detail::LaunchStatus("decode attention partitions");
}

template <int kHeadDim, bool kBf16>
Status LaunchGroupWidth(const PagedKv& kv, const unsigned char* cache,
                        const DecodeAttentionArgs& args, const Workspace& ws, int chunks,
                        bool aligned, cudaStream_t stream) {
  const int widest = std::min(static_cast<int>(args.num_q_heads / kv.heads), kMaxGroup);
  if (widest <= 1) {
    return LaunchPartitions<kHeadDim, 1, kBf16>(kv, cache, args, ws, chunks, aligned, stream);
  }
  if (widest <= 2) {
    return LaunchPartitions<kHeadDim, 2, kBf16>(kv, cache, args, ws, chunks, aligned, stream);
  }
  if (widest <= 4) {
    return LaunchPartitions<kHeadDim, 4, kBf16>(kv, cache, args, ws, chunks, aligned, stream);
  }
  return LaunchPartitions<kHeadDim, 8, kBf16>(kv, cache, args, ws, chunks, aligned, stream);
}

template <int kHeadDim, bool kBf16>
Status LaunchFor(const PagedKv& kv, const unsigned char* cache, const DecodeAttentionArgs& args,
                 const Workspace& ws, bool aligned, cudaStream_t stream) {
  const int group = static_cast<int>(args.num_q_heads / kv.heads);
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const Status launched =
      LaunchGroupWidth<kHeadDim, kBf16>(kv, cache, args, ws, chunks, aligned, stream);
  KV_RETURN_IF_ERROR(launched);
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
  if (args.num_seqs > 65535) {
    return Status::Unsupported("decode attention launches at most 65535 sequences");
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
  const int64_t head_chunks =
      kv.heads * ((args.num_q_heads / kv.heads + kMaxGroup - 1) / kMaxGroup);
  if (ws.partitions * head_chunks > INT32_MAX) {
    return Status::Unsupported("decode attention launches at most 2^31 - 1 (partition, head) CTAs");
  }
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
