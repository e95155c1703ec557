// The ceilings a GPU-to-GPU KV transfer is held to (issue 6), measured in this process:
//   peer: one cudaMemcpyPeerAsync of the bytes in one piece;
//   nccl: one ncclSend/ncclRecv of the same bytes in one contiguous buffer;
//   page kernel: kvd's plan copy kernel, launched on the source GPU, pushing the same bytes as
//     64 KiB pages between random block ids (one launch over a table already on the device):
//     what SMs reach over NVLink on scattered pages, where the copy engines cannot be used
//     (cudaMemcpyBatchAsync of 64 KiB pages runs at a fraction of the link).
// The same measurement as `kvbench gpu-transport`'s baseline, for `kvbench pd --memory cuda`.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace kv::bench {

struct GpuCeilings {
  double peer_seconds = 0;         // medians over the iterations
  double nccl_seconds = 0;         // 0: not measured (no NCCL in this build, or src == dst)
  double page_kernel_seconds = 0;  // 0: not measured (fewer bytes than one page)
};

// Builds with CUDA register it (gpu_ceiling.cu); elsewhere it stays null.
using GpuCeilingFn = Result<GpuCeilings> (*)(int src_device, int dst_device, uint64_t bytes,
                                             int iters);
GpuCeilingFn& GpuCeilingSlot();

}  // namespace kv::bench
