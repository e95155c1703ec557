// The plan-copy tables (kernels/plan_copy.h) of one batch's chunks: its runs' chunks, then its
// run groups' chunks (the block kernel's table). Encoded on the host in one pass, uploaded by one
// copy on the caller's stream, then one kernel launch per chunk reads its slice. So a chunk costs
// the host a launch, and a batch one upload, however many chunks.
//
// kTableBuffers table buffers take turns between batches, each named by its index, so a batch's
// last copies may be enqueued after the next batch's tables were loaded. A buffer is rewritten
// only once the copies of the batch that last used it are done: Load waits for that on the host
// (bounded, cancellable). So the host runs at most that many batches ahead of the copies; eight,
// not two, because a TP split's batches are small (~40 MiB: two batches are ~0.1 ms of GPU work,
// about one NCCL launch of host time). Memory grows to the largest batch seen (16 bytes per 32 KiB
// of runs, plus one descriptor per run) per buffer; outgrown buffers are kept until destruction,
// because freeing CUDA memory synchronises the device (the engine's gated work included) and
// this runs on the data path.
//
// Not thread-safe: one owner thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "gpu/cuda_util.h"
#include "transport/nccl/chunk_tables.h"
#include "transport/nccl/nccl_comm.h"
#include "transport/nccl/wire.h"

namespace kv::transport::nccl {

// Launches the copy kernels once on a private stream and waits for it: under lazy module loading
// the first launch loads the kernel, which may synchronise the whole context and so wait for
// copies gated on an engine's event. Call before any such copy exists.
Status LoadCopyKernel(int device);

class RunTables {
 public:
  // copy_ctas: the grid of each copy kernel; 0 for one CTA per SM of `device`.
  static Result<std::unique_ptr<RunTables>> Create(int device, int copy_ctas,
                                                   const std::atomic<bool>& cancelled);
  ~RunTables();  // waits for the copies that read its buffers
  RunTables(const RunTables&) = delete;
  RunTables& operator=(const RunTables&) = delete;

  static constexpr int kTableBuffers = 8;

  // Encodes every chunk of `chunks` and of `groups` into the next table buffer and enqueues its
  // upload on `stream`; returns the table's index. kTimeout when the buffer is still in use at
  // `deadline`, kAborted when cancelled meanwhile, kInternal when it was loaded and never
  // released (the caller holds more than kTableBuffers tables).
  Result<int> Load(const Chunks& chunks, const GroupChunks& groups, cudaStream_t stream,
                   SteadyTime deadline);
  // Enqueues chunk k's copy of `table` from src_base to dst_base on `stream`, which must be
  // ordered after the upload: k below the table's chunks of runs is one of them, the rest groups'.
  Status Copy(int table, size_t k, const void* src_base, void* dst_base, cudaStream_t stream) const;
  // Chunks of `table`, runs' and groups', and the staging bytes of its chunk k.
  size_t count(int table) const;
  uint64_t bytes(int table, size_t k) const;
  // `table` is free once the work enqueued on `stream` so far is done: call after its last Copy.
  Status Release(int table, cudaStream_t stream);

 private:
  struct Buffer;
  RunTables(int device, int copy_ctas, const std::atomic<bool>& cancelled);

  const int device_;
  const int copy_ctas_;
  const std::atomic<bool>& cancelled_;
  std::vector<std::unique_ptr<Buffer>> outgrown_;  // idle; destroyed after buffers_
  std::unique_ptr<Buffer> buffers_[kTableBuffers];
  TableLayout scratch_;  // Load's, reused
  int current_ = kTableBuffers - 1;
};

}  // namespace kv::transport::nccl
