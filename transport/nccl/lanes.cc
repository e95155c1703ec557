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

Status Lanes::Send(size_t lane, const void* data, uint64_t bytes, const gpu::CudaEvent* then,
                   SteadyTime deadline) {
  return Post(lane, true, const_cast<void*>(data), bytes, then, deadline);
}

Status Lanes::Recv(size_t lane, void* data, uint64_t bytes, const gpu::CudaEvent* then,
                   SteadyTime deadline) {
  return Post(lane, false, data, bytes, then, deadline);
}

Status Lanes::Post(size_t index, bool send, void* data, uint64_t bytes, const gpu::CudaEvent* then,
                   SteadyTime deadline) {
  std::lock_guard lock(mu_);
  if (aborted_ || cancelled_) return Status::Aborted("nccl: link failed");
  Lane& lane = *lanes_[index];
  KV_RETURN_IF_ERROR(SettleLocked(lane, deadline));
  if (!lane.comm.ready()) return Status::Unavailable("nccl: communicator failed");
  gpu::DeviceGuard guard(device_);
  // The peer is rank 1 for the sender (rank 0) and rank 0 for the receiver.
  ncclResult_t r = send ? ncclSend(data, bytes, ncclUint8, 1, lane.comm.get(), lane.stream.get())
                        : ncclRecv(data, bytes, ncclUint8, 0, lane.comm.get(), lane.stream.get());
  if (r != ncclSuccess && r != ncclInProgress) {
    lane.comm.MarkFailed();
    return NcclStatus(r, send ? "ncclSend" : "ncclRecv");
  }
  lane.in_flight = true;
  lane.then = then;
  return Status::Ok();
}

Status Lanes::Settle(size_t lane, SteadyTime deadline) {
  std::lock_guard lock(mu_);
  if (aborted_) return Status::Aborted("nccl: link failed");
  return SettleLocked(*lanes_[lane], deadline);
}

Status Lanes::SettleAll(SteadyTime deadline) {
  std::lock_guard lock(mu_);
  if (aborted_) return Status::Aborted("nccl: link failed");
  for (auto& lane : lanes_) KV_RETURN_IF_ERROR(SettleLocked(*lane, deadline));
  return Status::Ok();
}

Status Lanes::SettleLocked(Lane& lane, SteadyTime deadline) {
  if (!lane.in_flight) return Status::Ok();
  lane.in_flight = false;
  KV_RETURN_IF_ERROR(lane.comm.WaitEnqueued(deadline, cancelled_));
  if (lane.then == nullptr) return Status::Ok();
  return lane.then->Record(lane.stream.get());
}

void Lanes::Abort() {
  std::lock_guard lock(mu_);
  aborted_ = true;
  std::vector<std::thread> aborts;
  for (auto& lane : lanes_) aborts.emplace_back([&comm = lane->comm] { comm.Abort(); });
  for (std::thread& t : aborts) t.join();
}

}  // namespace kv::transport::nccl
