// The data path of one side of one link direction: `slots` device buffers that a batch's staged
// chunks rotate through, a copy stream for the gathers (sender) or scatters (receiver), the
// batch's run tables, and the Lanes the operations travel on.
//
// The host enqueues a batch's whole pipeline at once and never waits for the GPU to move bytes:
//   sender:   gather(k) into the next slot on the copy stream, after the send that last used
//             the slot (its `drained` event); send(k) on the next lane after gather(k) (`filled`);
//   receiver: recv(k) on the next lane into the next slot after the scatter that last used the
//             slot (`drained`); scatter(k) on the copy stream after recv(k) (`filled`).
// Sends (receives) go to NCCL in groups of group_ops, one launch each (Lanes::Post).
// So gathers and scatters overlap the wire, and lanes overlap each other. Large ranges skip all
// that (SplitDirect): one ncclSend / ncclRecv per piece, between the regions themselves.
// The sender leaves its last operations in flight when a batch is enqueued, so the NCCL enqueues
// of consecutive batches overlap; it settles a lane only to reuse it or its slot. The only host
// waits are for NCCL to enqueue an operation (Lanes) and, rarely, for run tables two batches back.
//
// Memory is bounded: slots × slot bytes per side and direction, allocated on first use.
// Not thread-safe: the owner thread of the direction (sender thread or receive worker).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "gpu/cuda_util.h"
#include "transport/nccl/lanes.h"
#include "transport/nccl/run_tables.h"
#include "transport/nccl/wire.h"

namespace kv::transport::nccl {

// Set from LinkOptions, which holds the defaults; Create refuses zero slots or slot bytes.
struct StagingOptions {
  int device = 0;
  uint64_t slot_bytes = 0;
  int slots = 0;
  int copy_ctas = 0;  // grid of the gather/scatter kernels; 0 = one CTA per SM
  // Operations per NCCL launch (Lanes::Post), at most slots / 2 (at least 1): each launch of a
  // non-blocking communicator costs the host ~50 µs, so small chunks pay it once per group.
  int group_ops = 1;
};

class Staging {
 public:
  static Result<std::unique_ptr<Staging>> Create(const StagingOptions& options,
                                                 const std::atomic<bool>& cancelled);

  // Enqueues the sends of `ranges` and the rows of `rows` of `base` on `lanes`: the staged ones
  // gathered in chunks of chunk_bytes ≤ slot_bytes (the ranges' chunks, then the rows'), ranges
  // of at least direct_bytes (not 0) straight from `base`. Everything is enqueued (or on its way
  // into a lane) when it returns; the bytes move later.
  Status Send(Lanes& lanes, const char* base, std::span<const Range> ranges,
              std::span<const Strided> rows, uint64_t chunk_bytes, uint64_t direct_bytes,
              SteadyTime deadline);
  // Called with the copy stream once it is ordered after every byte of a batch.
  using Landed = std::function<Status(cudaStream_t copy)>;
  // Enqueues the receives of a batch sent that way, and the scatters into `ranges` and `rows` of
  // `base`; `landed` runs once every scatter of the batch is enqueued. That may be after Receive
  // returns: the scatters of a batch's last chunks wait (in order) until the next batch's
  // receives are posted, or until FinishPending, so the owner never waits for NCCL to enqueue a
  // batch's last receive before it posts the next batch's.
  Status Receive(Lanes& lanes, char* base, std::span<const Range> ranges,
                 std::span<const Strided> rows, uint64_t chunk_bytes, uint64_t direct_bytes,
                 SteadyTime deadline, Landed landed);
  // Whether scatters wait for FinishPending; FinishPending enqueues them (and runs their
  // batches' `landed`). Call it when no batch follows at once.
  bool pending() const { return !scatters_.empty(); }
  Status FinishPending(Lanes& lanes, SteadyTime deadline);

 private:
  struct Slot {
    char* data = nullptr;
    gpu::CudaEvent filled;   // sender: gather done; receiver: ncclRecv done
    gpu::CudaEvent drained;  // sender: ncclSend done; receiver: scatter done
    bool used = false;       // drained has been recorded (or is, once its lane settles)
    uint64_t op = 0;         // the launch of the last operation that used the slot
    size_t lane = 0;         // and its lane
  };

  // A received chunk waiting for its scatter: chunk k of table `table`, into `base`; the last
  // of its batch releases the table and runs the batch's `landed`.
  struct Scatter {
    uint64_t seq = 0;  // chunks received before it, over all batches
    int table = 0;
    size_t k = 0;
    Slot* slot = nullptr;
    char* base = nullptr;
    bool last = false;
    Landed landed;
  };

  Staging(const StagingOptions& options, const std::atomic<bool>& cancelled)
      : options_(options), cancelled_(cancelled) {}
  Status CheckChunk(uint64_t chunk_bytes, const Lanes& lanes);
  size_t GroupSize() const;
  // Adds an operation to the group being built, launching the group once it is full; Flush
  // launches what the group holds.
  Status Add(Lanes& lanes, const Lanes::Op& op, SteadyTime deadline);
  Status Flush(Lanes& lanes, SteadyTime deadline);
  // Chunks `ranges` and `rows` for `direction` and loads their tables on the copy stream;
  // returns the table (tables_->count(table) staged chunks), or -1 when nothing is staged.
  Result<int> LoadTables(std::span<const Range> ranges, std::span<const Strided> rows,
                         uint64_t chunk_bytes, Direction direction, SteadyTime deadline);
  Status ScatterFront(Lanes& lanes, SteadyTime deadline);
  Slot& NextSlot() { return slots_[next_slot_++ % slots_.size()]; }
  // Makes sure the launch that last used `slot` is enqueued and its events recorded.
  Status SettleSlot(Lanes& lanes, const Slot& slot, SteadyTime deadline);

  const StagingOptions options_;
  const std::atomic<bool>& cancelled_;
  gpu::DeviceBuffer memory_;
  gpu::CudaStream copy_stream_;
  std::unique_ptr<RunTables> tables_;
  std::vector<Slot> slots_;
  size_t next_slot_ = 0;
  uint64_t next_op_ = 1;  // the launch being built
  // Operations sent (received) so far: operation k of a batch takes lane (first_lane_ + k) %
  // lanes on both sides, so single-operation batches (a layer each) rotate through the lanes too.
  uint64_t first_lane_ = 0;
  std::vector<Lanes::Op> group_;         // the launch being built
  std::vector<uint64_t> posted_;         // per lane: its last launch
  std::vector<uint64_t> settled_;        // per lane: launches up to this one are settled
  gpu::CudaEvent lane_done_[kMaxLanes];  // receiver: behind a lane's direct receives
  std::deque<Scatter> scatters_;         // receiver: posted, not yet scattered, in order
  uint64_t received_ = 0;                // receiver: chunks posted so far
  int pending_batches_ = 0;              // receiver: batches with a chunk in scatters_
};

}  // namespace kv::transport::nccl
