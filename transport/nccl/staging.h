// The staging half of the NCCL data path on one side of one direction: two device buffers
// ("slots") of a fixed size that chunks of a batch alternate through, a copy stream (gather on
// the sender, scatter on the receiver), an NCCL stream, and the run copier.
//
// Memory is bounded (two slots per direction per link, allocated on first use) and reuse is
// ordered on the device: before a slot is refilled, its stream waits for the event that marks
// the slot drained, so the host never waits and the copy of chunk k+1 overlaps the NCCL
// transfer of chunk k. Used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "layout/plan.h"
#include "layout/status.h"
#include "transport/cuda_ipc/cuda_util.h"
#include "transport/cuda_ipc/run_copier.h"

namespace kv::transport::nccl {

struct Slot {
  gpu::DeviceBuffer buffer;
  gpu::CudaEvent filled;   // sender: gather done; receiver: ncclRecv done
  gpu::CudaEvent drained;  // sender: ncclSend done; receiver: scatter done
  bool used = false;       // drained has been recorded at least once
};

struct StagingPipeline {
  gpu::CudaStream copy_stream;
  gpu::CudaStream nccl_stream;
  std::unique_ptr<gpu::RunCopier> copier;
  Slot slots[2];
  size_t next = 0;

  static Result<std::unique_ptr<StagingPipeline>> Create(int device, uint64_t slot_bytes);
  Slot& NextSlot() { return slots[next++ % 2]; }
};

// Bytes of a chunk's runs.
uint64_t ChunkLength(const std::vector<Run>& chunk);

// Makes `stream` wait on the device for `event`.
Status WaitOn(cudaStream_t stream, const gpu::CudaEvent& event);

}  // namespace kv::transport::nccl
