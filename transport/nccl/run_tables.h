// The plan-copy tables (kernels/plan_copy.h) of one batch's chunks: its runs' chunks, then its
// run groups' chunks (the group kernel's table). Encoded on the host in one pass, uploaded by one
// copy on the caller's stream, then one kernel launch per chunk reads its slice. So a chunk costs
// the host a launch, and a batch one upload, however many chunks.
//
// kTableBuffers table buffers take turns between batches. A buffer is rewritten only once the
// copies of the batch that last used it are done: Load waits for that on the host (bounded,
// cancellable). So the host runs at most that many batches ahead of the copies; eight, not two,
// because a TP split's batches are small (~40 MiB: two batches are ~0.1 ms of GPU work, about
// one NCCL launch of host time). Memory grows to the largest batch seen (16 bytes per 32 KiB of
// runs, plus one descriptor per run) per buffer; outgrown buffers are kept until destruction,
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

  // Encodes every chunk of `chunks` and of `groups` and enqueues their upload on `stream`.
  // kTimeout when the buffer is still in use at `deadline`, kAborted when cancelled meanwhile.
  Status Load(const Chunks& chunks, const GroupChunks& groups, cudaStream_t stream,
              SteadyTime deadline);
  // Enqueues chunk k's copy (of the last Load) from src_base to dst_base on `stream`, which must
  // be ordered after the upload: k < chunks.count() is a chunk of runs, the rest of groups.
  Status Copy(size_t k, const void* src_base, void* dst_base, cudaStream_t stream) const;
  // Chunks of the last Load, runs' and groups', and the staging bytes of chunk k.
  size_t count() const { return first_.size(); }
  uint64_t bytes(size_t k) const { return bytes_[k]; }
  // The loaded tables are free once the work enqueued on `stream` so far is done: call after the
  // batch's last Copy.
  Status Release(cudaStream_t stream);

 private:
  struct Buffer;
  RunTables(int device, int copy_ctas, const std::atomic<bool>& cancelled);

  const int device_;
  const int copy_ctas_;
  const std::atomic<bool>& cancelled_;
  std::vector<std::unique_ptr<Buffer>> outgrown_;  // idle; destroyed after buffers_
  static constexpr int kTableBuffers = 8;
  std::unique_ptr<Buffer> buffers_[kTableBuffers];
  int current_ = kTableBuffers - 1;
  // Per chunk of the last Load: its first descriptor (in its table), how many it has, its
  // staging bytes. Chunks from runs_ on are groups', whose table starts group_table_ bytes in.
  std::vector<uint64_t> first_;
  std::vector<uint64_t> count_;
  std::vector<uint64_t> bytes_;
  size_t runs_ = 0;
  uint64_t group_table_ = 0;
};

}  // namespace kv::transport::nccl
