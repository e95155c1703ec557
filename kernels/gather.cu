// Gather and scatter kernels. Contract: gather.h.
#include <string>

#include "kernels/cuda_util.cuh"
#include "kernels/gather.h"

namespace kv::kernels {
namespace {

constexpr int kThreads = 256;

struct RowSpace {
  StridedKv kv;
  const int64_t* blocks;
  int64_t layer_begin, layers, head_begin, heads;
  uint64_t rows;  // num_blocks · layers · heads · block_size · planes
};

// One warp per C-byte row, in staging order; `to_staging` picks the direction.
template <bool kToStaging>
__global__ void __launch_bounds__(kThreads)
    GatherScatterKernel(RowSpace space, unsigned char* cache, unsigned char* staging) {
  const int lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const StridedKv& kv = space.kv;
  for (uint64_t row = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) / 32;
       row < space.rows; row += warps) {
    uint64_t x = row;
    const int64_t p = x % kv.planes;
    x /= kv.planes;
    const int64_t n = x % kv.block_size;
    x /= kv.block_size;
    const int64_t h = space.head_begin + x % space.heads;
    x /= space.heads;
    const int64_t l = space.layer_begin + x % space.layers;
    const int64_t block = space.blocks[x / space.layers];
    if (block < 0 || block >= kv.blocks) continue;
    unsigned char* cached = cache + kv.offset(l, block, h, n, p);
    unsigned char* staged = staging + row * kv.content_bytes;
    if (kToStaging) {
      detail::WarpCopy(cached, staged, kv.content_bytes, lane);
    } else {
      detail::WarpCopy(staged, cached, kv.content_bytes, lane);
    }
  }
}

Result<RowSpace> MakeRowSpace(const StridedKv& kv, const int64_t* blocks, int64_t num_blocks,
                              const PageSlice& slice) {
  KV_RETURN_IF_ERROR(ValidateStridedKv(kv));
  KV_ASSIGN_OR_RETURN(PageSlice s, ResolveSlice(kv, slice));
  if (num_blocks < 0) return Status::InvalidArgument("negative block count");
  RowSpace space{kv,
                 blocks,
                 s.layer_begin,
                 s.layer_end - s.layer_begin,
                 s.head_begin,
                 s.head_end - s.head_begin,
                 0};
  space.rows =
      static_cast<uint64_t>(num_blocks * space.layers * space.heads * kv.block_size * kv.planes);
  return space;
}

template <bool kToStaging>
Status Launch(const RowSpace& space, unsigned char* cache, unsigned char* staging, void* stream,
              const char* what) {
  if (space.rows == 0) return Status::Ok();
  KV_ASSIGN_OR_RETURN(const int sms, detail::SmCount());
  const uint64_t ctas_needed = (space.rows + kThreads / 32 - 1) / (kThreads / 32);
  const int ctas = static_cast<int>(std::min<uint64_t>(ctas_needed, sms * 8));
  GatherScatterKernel<kToStaging>
      <<<ctas, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(space, cache, staging);
  return detail::LaunchStatus(what);
}

}  // namespace

Status LaunchGather(const StridedKv& kv, const void* base, const int64_t* device_blocks,
                    int64_t num_blocks, const PageSlice& slice, void* staging, void* stream) {
  KV_ASSIGN_OR_RETURN(RowSpace space, MakeRowSpace(kv, device_blocks, num_blocks, slice));
  return Launch<true>(space, static_cast<unsigned char*>(const_cast<void*>(base)),
                      static_cast<unsigned char*>(staging), stream, "gather kernel");
}

Status LaunchScatter(const StridedKv& kv, void* base, const int64_t* device_blocks,
                     int64_t num_blocks, const PageSlice& slice, const void* staging,
                     void* stream) {
  KV_ASSIGN_OR_RETURN(RowSpace space, MakeRowSpace(kv, device_blocks, num_blocks, slice));
  return Launch<false>(space, static_cast<unsigned char*>(base),
                       static_cast<unsigned char*>(const_cast<void*>(staging)), stream,
                       "scatter kernel");
}

}  // namespace kv::kernels
