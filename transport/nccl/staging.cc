#include "transport/nccl/staging.h"

#include <algorithm>
#include <deque>

namespace kv::transport::nccl {
namespace {

Status WaitOn(cudaStream_t stream, const gpu::CudaEvent& event) {
  return gpu::CudaStatus(cudaStreamWaitEvent(stream, event.get(), 0), "cudaStreamWaitEvent");
}

}  // namespace

Result<std::unique_ptr<Staging>> Staging::Create(const StagingOptions& options,
                                                 const std::atomic<bool>& cancelled) {
  if (options.slots < 1 || options.slot_bytes == 0) {
    return Status::InvalidArgument("nccl staging needs at least one slot of at least one byte");
  }
  std::unique_ptr<Staging> s(new Staging(options, cancelled));
  KV_ASSIGN_OR_RETURN(s->copy_stream_, gpu::CudaStream::Create(options.device));
  KV_ASSIGN_OR_RETURN(s->tables_, RunTables::Create(options.device, options.copy_ctas, cancelled));
  KV_ASSIGN_OR_RETURN(
      s->memory_, gpu::DeviceBuffer::Allocate(options.device, options.slot_bytes * options.slots));
  s->slots_.resize(options.slots);
  for (int i = 0; i < options.slots; ++i) {
    Slot& slot = s->slots_[i];
    slot.data = static_cast<char*>(s->memory_.data()) + i * options.slot_bytes;
    KV_ASSIGN_OR_RETURN(slot.filled, gpu::CudaEvent::Create(options.device));
    KV_ASSIGN_OR_RETURN(slot.drained, gpu::CudaEvent::Create(options.device));
  }
  for (gpu::CudaEvent& done : s->lane_done_) {
    KV_ASSIGN_OR_RETURN(done, gpu::CudaEvent::Create(options.device));
  }
  return s;
}

Status Staging::CheckChunk(uint64_t chunk_bytes, const Lanes& lanes) {
  if (chunk_bytes == 0 || chunk_bytes > options_.slot_bytes) {
    return Status::Incompatible("chunks of " + std::to_string(chunk_bytes) +
                                " bytes do not fit this side's staging slots of " +
                                std::to_string(options_.slot_bytes));
  }
  if (lanes.count() == 0) return Status::InvalidArgument("nccl: data before the communicator");
  if (posted_.size() != lanes.count()) {
    posted_.assign(lanes.count(), 0);
    settled_.assign(lanes.count(), 0);
  }
  return Status::Ok();
}

Status Staging::Flush(Lanes& lanes, SteadyTime deadline) {
  if (group_.empty()) return Status::Ok();
  // Post settles every lane the group names first.
  for (const Lanes::Op& op : group_) settled_[op.lane] = posted_[op.lane];
  KV_RETURN_IF_ERROR(lanes.Post(group_, deadline));
  for (const Lanes::Op& op : group_) posted_[op.lane] = next_op_;
  ++next_op_;
  group_.clear();
  return Status::Ok();
}

Status Staging::Add(Lanes& lanes, const Lanes::Op& op, SteadyTime deadline) {
  group_.push_back(op);
  if (group_.size() >= GroupSize()) return Flush(lanes, deadline);
  return Status::Ok();
}

size_t Staging::GroupSize() const {
  // A slot is reused `slots` chunks later, after the launch that used it was settled, so a
  // group never holds two users of one slot; half the slots lets the gathers of the next group
  // run while this one's sends do.
  const int most = std::max(1, options_.slots / 2);
  return static_cast<size_t>(std::clamp(options_.group_ops, 1, most));
}

Status Staging::SettleSlot(Lanes& lanes, const Slot& slot, SteadyTime deadline) {
  if (!slot.used || slot.op <= settled_[slot.lane]) return Status::Ok();
  settled_[slot.lane] = posted_[slot.lane];
  return lanes.Settle(slot.lane, deadline);
}

Result<int> Staging::LoadTables(std::span<const Range> ranges, std::span<const Strided> rows,
                                uint64_t chunk_bytes, Direction direction, SteadyTime deadline) {
  const Chunks chunks = ChunkRuns(ranges, chunk_bytes, direction);
  const GroupChunks groups = ChunkGroups(rows, chunk_bytes, direction);
  if (chunks.count() + groups.count() == 0) return -1;
  return tables_->Load(chunks, groups, copy_stream_.get(), deadline);
}

Status Staging::Send(Lanes& lanes, const char* base, std::span<const Range> ranges,
                     std::span<const Strided> rows, uint64_t chunk_bytes, uint64_t direct_bytes,
                     SteadyTime deadline) {
  KV_RETURN_IF_ERROR(CheckChunk(chunk_bytes, lanes));
  const DirectSplit split = SplitDirect(ranges, direct_bytes, chunk_bytes);
  KV_ASSIGN_OR_RETURN(const int table,
                      LoadTables(split.staged, rows, chunk_bytes, Direction::kGather, deadline));
  const size_t staged = table < 0 ? 0 : tables_->count(table);
  cudaStream_t copy = copy_stream_.get();
  for (size_t k = 0; k < staged; ++k) {
    Slot& slot = NextSlot();
    if (slot.used) {
      KV_RETURN_IF_ERROR(SettleSlot(lanes, slot, deadline));
      KV_RETURN_IF_ERROR(WaitOn(copy, slot.drained));
    }
    KV_RETURN_IF_ERROR(tables_->Copy(table, k, base, slot.data, copy));
    KV_RETURN_IF_ERROR(slot.filled.Record(copy));
    const size_t lane = (first_lane_ + k) % lanes.count();
    slot.used = true;
    slot.op = next_op_;  // the launch of the group being built
    slot.lane = lane;
    KV_RETURN_IF_ERROR(
        Add(lanes, {lane, true, slot.data, tables_->bytes(table, k), &slot.filled, &slot.drained},
            deadline));
  }
  KV_RETURN_IF_ERROR(Flush(lanes, deadline));
  if (staged > 0) KV_RETURN_IF_ERROR(tables_->Release(table, copy));
  first_lane_ += staged;
  for (const Range& piece : split.direct) {
    const size_t lane = first_lane_++ % lanes.count();
    KV_RETURN_IF_ERROR(Add(
        lanes, {lane, true, const_cast<char*>(base) + piece.offset, piece.length, nullptr, nullptr},
        deadline));
  }
  return Flush(lanes, deadline);
}

Status Staging::ScatterFront(Lanes& lanes, SteadyTime deadline) {
  Scatter front = std::move(scatters_.front());
  scatters_.pop_front();
  cudaStream_t copy = copy_stream_.get();
  KV_RETURN_IF_ERROR(SettleSlot(lanes, *front.slot, deadline));  // records `filled`
  KV_RETURN_IF_ERROR(WaitOn(copy, front.slot->filled));
  KV_RETURN_IF_ERROR(tables_->Copy(front.table, front.k, front.slot->data, front.base, copy));
  KV_RETURN_IF_ERROR(front.slot->drained.Record(copy));
  if (!front.last) return Status::Ok();
  --pending_batches_;
  KV_RETURN_IF_ERROR(tables_->Release(front.table, copy));
  return front.landed ? front.landed(copy) : Status::Ok();
}

Status Staging::FinishPending(Lanes& lanes, SteadyTime deadline) {
  KV_RETURN_IF_ERROR(Flush(lanes, deadline));
  while (!scatters_.empty()) KV_RETURN_IF_ERROR(ScatterFront(lanes, deadline));
  return Status::Ok();
}

Status Staging::Receive(Lanes& lanes, char* base, std::span<const Range> ranges,
                        std::span<const Strided> rows, uint64_t chunk_bytes, uint64_t direct_bytes,
                        SteadyTime deadline, Landed landed) {
  KV_RETURN_IF_ERROR(CheckChunk(chunk_bytes, lanes));
  const DirectSplit split = SplitDirect(ranges, direct_bytes, chunk_bytes);
  // Each batch waiting for its last scatters holds a table.
  if (pending_batches_ >= RunTables::kTableBuffers - 1) {
    KV_RETURN_IF_ERROR(FinishPending(lanes, deadline));
  }
  KV_ASSIGN_OR_RETURN(const int table,
                      LoadTables(split.staged, rows, chunk_bytes, Direction::kScatter, deadline));
  const size_t staged = table < 0 ? 0 : tables_->count(table);
  // Receives of the group being built, ready to scatter once it is posted.
  std::vector<Scatter> building;
  auto flush = [&]() -> Status {
    KV_RETURN_IF_ERROR(Flush(lanes, deadline));
    for (Scatter& s : building) scatters_.push_back(std::move(s));
    building.clear();
    return Status::Ok();
  };
  // The usual case, no direct pieces: the batch's last scatters wait for the next batch's
  // receives, and the last one runs `landed`.
  const bool defer = split.direct.empty();
  if (staged > 0) ++pending_batches_;
  for (size_t k = 0; k < staged; ++k) {
    const size_t lane = (first_lane_ + k) % lanes.count();
    // Scatter what the lanes have had time to enqueue, oldest first, before asking more of them.
    while (!scatters_.empty() && scatters_.front().seq + lanes.count() + GroupSize() <= received_) {
      KV_RETURN_IF_ERROR(ScatterFront(lanes, deadline));
    }
    Slot& slot = NextSlot();
    if (slot.used) {
      // Its last receive is `slots` chunks back, so in a group already posted (GroupSize).
      while (std::any_of(scatters_.begin(), scatters_.end(),
                         [&](const Scatter& e) { return e.slot == &slot; })) {
        KV_RETURN_IF_ERROR(ScatterFront(lanes, deadline));
      }
    }
    const gpu::CudaEvent* wait = slot.used ? &slot.drained : nullptr;
    slot.used = true;
    slot.op = next_op_;
    slot.lane = lane;
    Scatter entry{received_++, table, k, &slot, base, k + 1 == staged, nullptr};
    if (entry.last && defer) entry.landed = std::move(landed);
    building.push_back(std::move(entry));
    group_.push_back({lane, false, slot.data, tables_->bytes(table, k), wait, &slot.filled});
    if (group_.size() >= GroupSize()) KV_RETURN_IF_ERROR(flush());
  }
  first_lane_ += staged;
  KV_RETURN_IF_ERROR(flush());
  if (staged > 0 && defer) return Status::Ok();
  KV_RETURN_IF_ERROR(FinishPending(lanes, deadline));
  // Direct pieces land in place; the copy stream waits for each lane's last one.
  bool direct_on[kMaxLanes] = {};
  for (const Range& piece : split.direct) {
    const size_t lane = first_lane_++ % lanes.count();
    KV_RETURN_IF_ERROR(
        Add(lanes, {lane, false, base + piece.offset, piece.length, nullptr, &lane_done_[lane]},
            deadline));
    direct_on[lane] = true;
  }
  KV_RETURN_IF_ERROR(Flush(lanes, deadline));
  cudaStream_t copy = copy_stream_.get();
  for (size_t lane = 0; lane < lanes.count(); ++lane) {
    if (!direct_on[lane]) continue;
    settled_[lane] = posted_[lane];
    KV_RETURN_IF_ERROR(lanes.Settle(lane, deadline));
    KV_RETURN_IF_ERROR(WaitOn(copy, lane_done_[lane]));
  }
  return landed ? landed(copy) : Status::Ok();
}

}  // namespace kv::transport::nccl
