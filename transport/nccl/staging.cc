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
  if (in_flight_.size() != lanes.count()) in_flight_.assign(lanes.count(), 0);
  return Status::Ok();
}

Status Staging::SettleSlot(Lanes& lanes, const Slot& slot, SteadyTime deadline) {
  if (!slot.used || in_flight_[slot.lane] != slot.op) return Status::Ok();
  in_flight_[slot.lane] = 0;
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
    KV_RETURN_IF_ERROR(WaitOn(lanes.stream(lane), slot.filled));
    KV_RETURN_IF_ERROR(lanes.Send(lane, slot.data, tables_->bytes(k), &slot.drained, deadline));
    slot.used = true;
    slot.op = in_flight_[lane] = next_op_++;
    slot.lane = lane;
  }
  if (staged > 0) KV_RETURN_IF_ERROR(tables_->Release(copy));
  first_lane_ += staged;
  for (const Range& piece : split.direct) {
    const size_t lane = first_lane_++ % lanes.count();
    KV_RETURN_IF_ERROR(lanes.Send(lane, base + piece.offset, piece.length, nullptr, deadline));
    in_flight_[lane] = next_op_++;
  }
  return Status::Ok();
}

Status Staging::Receive(Lanes& lanes, char* base, std::span<const Range> ranges,
                        std::span<const Strided> rows, uint64_t chunk_bytes, uint64_t direct_bytes,
                        SteadyTime deadline) {
  KV_RETURN_IF_ERROR(CheckChunk(chunk_bytes, lanes));
  const DirectSplit split = SplitDirect(ranges, direct_bytes, chunk_bytes);
  KV_ASSIGN_OR_RETURN(const size_t staged,
                      LoadTables(split.staged, rows, chunk_bytes, Direction::kScatter, deadline));
  cudaStream_t copy = copy_stream_.get();
  // Received but not yet scattered, in chunk order: (chunk, slot).
  std::deque<std::pair<size_t, Slot*>> landed;
  auto scatter_front = [&]() -> Status {
    auto [k, slot] = landed.front();
    landed.pop_front();
    KV_RETURN_IF_ERROR(SettleSlot(lanes, *slot, deadline));  // records `filled`
    KV_RETURN_IF_ERROR(WaitOn(copy, slot->filled));
    KV_RETURN_IF_ERROR(tables_->Copy(k, slot->data, base, copy));
    return slot->drained.Record(copy);
  };
  for (size_t k = 0; k < staged; ++k) {
    const size_t lane = (first_lane_ + k) % lanes.count();
    // Scatter what the lanes have had time to enqueue, oldest first, before asking more of them.
    while (!landed.empty() && landed.front().first + lanes.count() <= k) {
      KV_RETURN_IF_ERROR(scatter_front());
    }
    Slot& slot = NextSlot();
    if (slot.used) {
      while (!landed.empty() && std::any_of(landed.begin(), landed.end(),
                                            [&](const auto& e) { return e.second == &slot; })) {
        KV_RETURN_IF_ERROR(scatter_front());
      }
      KV_RETURN_IF_ERROR(WaitOn(lanes.stream(lane), slot.drained));
    }
    KV_RETURN_IF_ERROR(lanes.Recv(lane, slot.data, tables_->bytes(k), &slot.filled, deadline));
    slot.used = true;
    slot.op = in_flight_[lane] = next_op_++;
    slot.lane = lane;
    landed.emplace_back(k, &slot);
  }
  while (!landed.empty()) KV_RETURN_IF_ERROR(scatter_front());
  if (staged > 0) KV_RETURN_IF_ERROR(tables_->Release(copy));
  first_lane_ += staged;
  // Direct pieces land in place; the copy stream waits for each lane's last one.
  bool direct_on[kMaxLanes] = {};
  for (const Range& piece : split.direct) {
    const size_t lane = first_lane_++ % lanes.count();
    KV_RETURN_IF_ERROR(
        lanes.Recv(lane, base + piece.offset, piece.length, &lane_done_[lane], deadline));
    in_flight_[lane] = next_op_++;
    direct_on[lane] = true;
  }
  for (size_t lane = 0; lane < lanes.count(); ++lane) {
    if (!direct_on[lane]) continue;
    in_flight_[lane] = 0;
    KV_RETURN_IF_ERROR(lanes.Settle(lane, deadline));
    KV_RETURN_IF_ERROR(WaitOn(copy, lane_done_[lane]));
  }
  return Status::Ok();
}

}  // namespace kv::transport::nccl
