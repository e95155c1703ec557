// The P/D simulator's GPU kernels. Contract: pd_gpu_kernels.h. Throughput matters little here
// (a few passes over a request's bytes per wave, next to the transfer); one thread per element
// keeps each kernel obviously right.
#include <cuda_runtime.h>

#include <string>

#include "tools/kvbench/pd/pd_gpu_kernels.h"
#include "tools/kvbench/pd/pd_pattern.h"

namespace kv::connector::gpu {
namespace {

constexpr int kThreads = 256;

Status Launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(e));
}

Result<unsigned> Blocks(int64_t items) {
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > INT32_MAX) return Status::Unsupported("a launch of over 2^31 CTAs");
  return static_cast<unsigned>(blocks);
}

__device__ uint16_t Expected(const PatternSlice s, int64_t head, int64_t token, int64_t d, int kv) {
  return pattern::FiniteBf16(pattern::Element(pattern::Row(s.seed, s.layer, head, token), d, kv));
}

__global__ void GenerateKvKernel(int64_t heads, int64_t dim, PatternSlice s, uint16_t* key,
                                 uint16_t* value) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= s.tokens * heads * dim) return;
  const int64_t d = i % dim, h = i / dim % heads, t = i / (dim * heads);
  key[i] = Expected(s, s.head0 + h, t, d, 0);
  value[i] = Expected(s, s.head0 + h, t, d, 1);
}

__global__ void GenerateQueryKernel(uint64_t seed, int64_t layer, int64_t q_head0, int64_t items,
                                    int64_t dim, uint16_t* query) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < items) query[i] = pattern::QueryElement(seed, layer, q_head0 + i / dim, i % dim);
}

__global__ void CheckKvKernel(kernels::PagedKv kv, const unsigned char* layer, const int32_t* table,
                              PatternSlice s, unsigned long long* mismatches) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= s.tokens * kv.heads * kv.head_dim) return;
  const int64_t d = i % kv.head_dim, h = i / kv.head_dim % kv.heads,
                t = i / (kv.head_dim * kv.heads);
  const unsigned char* row =
      layer + kv.token_offset(table[t / kv.block_size], h, t % kv.block_size) + 2 * d;
  const auto k = *reinterpret_cast<const uint16_t*>(row + kv.k_offset);
  const auto v = *reinterpret_cast<const uint16_t*>(row + kv.v_offset);
  const int wrong =
      (k != Expected(s, s.head0 + h, t, d, 0)) + (v != Expected(s, s.head0 + h, t, d, 1));
  if (wrong) atomicAdd(mismatches, static_cast<unsigned long long>(wrong));
}

// One thread per (layer, block, head, token) of the guard blocks.
__global__ void CountNonZeroKernel(kernels::StridedKv kv, kernels::PagedKv layer,
                                   const unsigned char* base, int64_t first_block, int64_t items,
                                   unsigned long long* count) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= items) return;
  const int64_t guards = kv.blocks - first_block;
  const int64_t n = i % kv.block_size, h = i / kv.block_size % kv.heads,
                b = first_block + i / (kv.block_size * kv.heads) % guards,
                l = i / (kv.block_size * kv.heads * guards);
  const unsigned char* at = base + l * kv.layer_stride + layer.token_offset(b, h, n);
  unsigned long long found = 0;
  for (int64_t j = 0; j < layer.head_dim * kernels::kDTypeBytes; ++j) {
    found += (at[layer.k_offset + j] != 0) + (at[layer.v_offset + j] != 0);
  }
  if (found) atomicAdd(count, found);
}

__device__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void WaitKernel(int64_t nanoseconds) {
  const uint64_t start = GlobalTimer();
  while (GlobalTimer() - start < static_cast<uint64_t>(nanoseconds)) __nanosleep(1000);
}

}  // namespace

Status LaunchGenerateKv(const kernels::PagedKv& kv, const PatternSlice& slice, uint16_t* key,
                        uint16_t* value, void* stream) {
  KV_ASSIGN_OR_RETURN(unsigned blocks, Blocks(slice.tokens * kv.heads * kv.head_dim));
  GenerateKvKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      kv.heads, kv.head_dim, slice, key, value);
  return Launched("generate K/V");
}

Status LaunchGenerateQuery(uint64_t seed, int64_t layer, int64_t q_head0, int64_t q_heads,
                           int64_t head_dim, uint16_t* query, void* stream) {
  KV_ASSIGN_OR_RETURN(unsigned blocks, Blocks(q_heads * head_dim));
  GenerateQueryKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      seed, layer, q_head0, q_heads * head_dim, head_dim, query);
  return Launched("generate query");
}

Status LaunchCheckKv(const kernels::PagedKv& kv, const void* layer_base, const int32_t* block_table,
                     const PatternSlice& slice, unsigned long long* mismatches, void* stream) {
  if ((kv.k_offset | kv.v_offset | kv.block_stride | kv.head_stride | kv.token_stride) & 1) {
    return Status::InvalidArgument("K/V rows must be 2-byte aligned");
  }
  KV_ASSIGN_OR_RETURN(unsigned blocks, Blocks(slice.tokens * kv.heads * kv.head_dim));
  CheckKvKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      kv, static_cast<const unsigned char*>(layer_base), block_table, slice, mismatches);
  return Launched("check K/V");
}

Status LaunchCountNonZero(const kernels::StridedKv& kv, const kernels::PagedKv& layer,
                          const void* base, int64_t first_block, unsigned long long* count,
                          void* stream) {
  if (first_block >= kv.blocks) return Status::Ok();
  const int64_t items = kv.layers * (kv.blocks - first_block) * kv.heads * kv.block_size;
  KV_ASSIGN_OR_RETURN(unsigned blocks, Blocks(items));
  CountNonZeroKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      kv, layer, static_cast<const unsigned char*>(base), first_block, items, count);
  return Launched("count guard bytes");
}

Status LaunchWait(int64_t nanoseconds, void* stream) {
  if (nanoseconds <= 0) return Status::Ok();
  WaitKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(nanoseconds);
  return Launched("forward-pass wait");
}

}  // namespace kv::connector::gpu
