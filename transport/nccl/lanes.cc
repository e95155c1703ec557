#include "transport/nccl/lanes.h"

#include <thread>

namespace kv::transport::nccl {

Lanes::Lanes(int device, const std::atomic<bool>& cancelled)
    : device_(device), cancelled_(cancelled) {}

Status Lanes::Join(std::string_view unique_id, int rank, SteadyTime deadline) {
  if (lanes_.size() >= static_cast<size_t>(kMaxLanes)) {
    return Status::InvalidArgument("more than " + std::to_string(kMaxLanes) +
                                   " NCCL lanes on one link");
  }
  KV_ASSIGN_OR_RETURN(gpu::CudaStream stream, gpu::CudaStream::Create(device_));
  std::lock_guard lock(mu_);
  if (aborted_) return Status::Aborted("nccl: link failed");
  Lane& lane = *lanes_.emplace_back(std::make_unique<Lane>());
  lane.stream = std::move(stream);
  return lane.comm.Init(unique_id, rank, device_, deadline, cancelled_);
}

Status Lanes::Post(std::span<const Op> ops, SteadyTime deadline) {
  if (ops.empty() || ops.size() > kMaxGroupOps) {
    return Status::InvalidArgument("nccl: a group of " + std::to_string(ops.size()) +
                                   " operations");
  }
  std::lock_guard lock(mu_);
  if (aborted_ || cancelled_) return Status::Aborted("nccl: link failed");
  bool named[kMaxLanes] = {};
  for (const Op& op : ops) {
    if (op.lane >= lanes_.size()) return Status::InvalidArgument("nccl: no such lane");
    Lane& lane = *lanes_[op.lane];
    if (!named[op.lane]) KV_RETURN_IF_ERROR(SettleLocked(lane, deadline));
    named[op.lane] = true;
    if (!lane.comm.ready()) return Status::Unavailable("nccl: communicator failed");
  }
  gpu::DeviceGuard guard(device_);
  for (const Op& op : ops) {
    if (op.wait == nullptr) continue;
    KV_RETURN_IF_ERROR(
        gpu::CudaStatus(cudaStreamWaitEvent(lanes_[op.lane]->stream.get(), op.wait->get(), 0),
                        "cudaStreamWaitEvent"));
  }
  // The peer is rank 1 for the sender (rank 0) and rank 0 for the receiver.
  ncclResult_t r = ncclGroupStart();
  for (const Op& op : ops) {
    if (r != ncclSuccess) break;
    Lane& lane = *lanes_[op.lane];
    r = op.send ? ncclSend(op.data, op.bytes, ncclUint8, 1, lane.comm.get(), lane.stream.get())
                : ncclRecv(op.data, op.bytes, ncclUint8, 0, lane.comm.get(), lane.stream.get());
  }
  // Ends the group even after a failed call: NCCL then drops the whole group.
  const ncclResult_t ended = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = ended;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (!named[i]) continue;
    if (r != ncclSuccess && r != ncclInProgress) {
      lanes_[i]->comm.MarkFailed();
      continue;
    }
    lanes_[i]->in_flight = true;
  }
  if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, "ncclGroupEnd (send/recv)");
  for (const Op& op : ops) {
    if (op.then != nullptr) lanes_[op.lane]->then.push_back(op.then);
  }
  return Status::Ok();
}

Status Lanes::Settle(size_t lane, SteadyTime deadline) {
  std::lock_guard lock(mu_);
  if (aborted_) return Status::Aborted("nccl: link failed");
  return SettleLocked(*lanes_[lane], deadline);
}

Status Lanes::SettleLocked(Lane& lane, SteadyTime deadline) {
  if (!lane.in_flight) return Status::Ok();
  lane.in_flight = false;
  Status enqueued = lane.comm.WaitEnqueued(deadline, cancelled_);
  for (const gpu::CudaEvent* event : lane.then) {
    if (enqueued.ok()) enqueued = event->Record(lane.stream.get());
  }
  lane.then.clear();  // keeps its capacity: no allocation per launch
  return enqueued;
}

void Lanes::Abort() {
  std::lock_guard lock(mu_);
  aborted_ = true;
  std::vector<std::thread> aborts;
  for (auto& lane : lanes_) aborts.emplace_back([&comm = lane->comm] { comm.Abort(); });
  for (std::thread& t : aborts) t.join();
}

}  // namespace kv::transport::nccl
