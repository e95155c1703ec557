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

Result<size_t> Staging::LoadTables(std::span<const Range> ranges, std::span<const Strided> rows,
                                   uint64_t chunk_bytes, Direction direction, SteadyTime deadline) {
  const Chunks chunks = ChunkRuns(ranges, chunk_bytes, direction);
  const GroupChunks groups = ChunkGroups(rows, chunk_bytes, direction);
  if (chunks.count() + groups.count() == 0) return size_t{0};
  KV_RETURN_IF_ERROR(tables_->Load(chunks, groups, copy_stream_.get(), deadline));
  return tables_->count();
}

Status Staging::Send(Lanes& lanes, const char* base, std::span<const Range> ranges,
                     std::span<const Strided> rows, uint64_t chunk_bytes, uint64_t direct_bytes,
                     SteadyTime deadline) {
  KV_RETURN_IF_ERROR(CheckChunk(chunk_bytes, lanes));
  const DirectSplit split = SplitDirect(ranges, direct_bytes, chunk_bytes);
  KV_ASSIGN_OR_RETURN(const size_t staged,
                      LoadTables(split.staged, rows, chunk_bytes, Direction::kGather, deadline));
  cudaStream_t copy = copy_stream_.get();
  for (size_t k = 0; k < staged; ++k) {
    Slot& slot = NextSlot();
    if (slot.used) {
      KV_RETURN_IF_ERROR(SettleSlot(lanes, slot, deadline));
      KV_RETURN_IF_ERROR(WaitOn(copy, slot.drained));
    }
    KV_RETURN_IF_ERROR(tables_->Copy(k, base, slot.data, copy));
    KV_RETURN_IF_ERROR(slot.filled.Record(copy));
    const size_t lane = (first_lane_ + k) % lanes.count();
    slot.used = true;
    slot.op = next_op_;  // the launch of the group being built
    slot.lane = lane;
    KV_RETURN_IF_ERROR(Add(
        lanes, {lane, true, slot.data, tables_->bytes(k), &slot.filled, &slot.drained}, deadline));
  }
  KV_RETURN_IF_ERROR(Flush(lanes, deadline));
  if (staged > 0) KV_RETURN_IF_ERROR(tables_->Release(copy));
  first_lane_ += staged;
  for (const Range& piece : split.direct) {
    const size_t lane = first_lane_++ % lanes.count();
    KV_RETURN_IF_ERROR(Add(
        lanes, {lane, true, const_cast<char*>(base) + piece.offset, piece.length, nullptr, nullptr},
        deadline));
  }
  return Flush(lanes, deadline);
}

Status Staging::Receive(Lanes& lanes, char* base, std::span<const Range> ranges,
                        std::span<const Strided> rows, uint64_t chunk_bytes, uint64_t direct_bytes,
                        SteadyTime deadline) {
  KV_RETURN_IF_ERROR(CheckChunk(chunk_bytes, lanes));
  const DirectSplit split = SplitDirect(ranges, direct_bytes, chunk_bytes);
  KV_ASSIGN_OR_RETURN(const size_t staged,
                      LoadTables(split.staged, rows, chunk_bytes, Direction::kScatter, deadline));
  cudaStream_t copy = copy_stream_.get();
  // Posted but not yet scattered, in chunk order: (chunk, slot).
  std::deque<std::pair<size_t, Slot*>> landed;
  auto scatter_front = [&]() -> Status {
    auto [k, slot] = landed.front();
    landed.pop_front();
    KV_RETURN_IF_ERROR(SettleSlot(lanes, *slot, deadline));  // records `filled`
    KV_RETURN_IF_ERROR(WaitOn(copy, slot->filled));
    KV_RETURN_IF_ERROR(tables_->Copy(k, slot->data, base, copy));
    return slot->drained.Record(copy);
  };
  // Receives of the group being built, posted (and so ready to scatter) at its flush.
  std::vector<std::pair<size_t, Slot*>> building;
  auto flush = [&]() -> Status {
    KV_RETURN_IF_ERROR(Flush(lanes, deadline));
    landed.insert(landed.end(), building.begin(), building.end());
    building.clear();
    return Status::Ok();
  };
  for (size_t k = 0; k < staged; ++k) {
    const size_t lane = (first_lane_ + k) % lanes.count();
    // Scatter what the lanes have had time to enqueue, oldest first, before asking more of them.
    while (!landed.empty() && landed.front().first + lanes.count() + GroupSize() <= k) {
      KV_RETURN_IF_ERROR(scatter_front());
    }
    Slot& slot = NextSlot();
    if (slot.used) {
      // Its last receive is `slots` chunks back, so in a group already posted (GroupSize).
      while (!landed.empty() && std::any_of(landed.begin(), landed.end(),
                                            [&](const auto& e) { return e.second == &slot; })) {
        KV_RETURN_IF_ERROR(scatter_front());
      }
    }
    const gpu::CudaEvent* wait = slot.used ? &slot.drained : nullptr;
    slot.used = true;
    slot.op = next_op_;
    slot.lane = lane;
    building.emplace_back(k, &slot);
    group_.push_back({lane, false, slot.data, tables_->bytes(k), wait, &slot.filled});
    if (group_.size() >= GroupSize()) KV_RETURN_IF_ERROR(flush());
  }
  KV_RETURN_IF_ERROR(flush());
  while (!landed.empty()) KV_RETURN_IF_ERROR(scatter_front());
  if (staged > 0) KV_RETURN_IF_ERROR(tables_->Release(copy));
  first_lane_ += staged;
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
  for (size_t lane = 0; lane < lanes.count(); ++lane) {
    if (!direct_on[lane]) continue;
    settled_[lane] = posted_[lane];
    KV_RETURN_IF_ERROR(lanes.Settle(lane, deadline));
    KV_RETURN_IF_ERROR(WaitOn(copy, lane_done_[lane]));
  }
  return Status::Ok();
}

}  // namespace kv::transport::nccl
