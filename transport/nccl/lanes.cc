#include "transport/nccl/lanes.h"

#include <thread>

namespace kv::transport::nccl {

namespace {

// Polls until `stream` ran dry: the connecting operation is tiny, so this is quick unless the
// peer never posts its side.
Status WaitForStream(cudaStream_t stream, SteadyTime deadline, const std::atomic<bool>& cancelled) {
  while (true) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return Status::Ok();
    if (state != cudaErrorNotReady) return gpu::CudaStatus(state, "cudaStreamQuery");
    if (cancelled.load()) return Status::Aborted("nccl: link failed");
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout("nccl: the lane's connecting operation did not finish in time");
    }
    std::this_thread::yield();
  }
}

}  // namespace

Lanes::Lanes(int device, const std::atomic<bool>& cancelled)
    : device_(device), cancelled_(cancelled) {}

Status Lanes::Join(std::string_view unique_id, int rank, bool blocking_launch,
                   SteadyTime deadline) {
  if (lanes_.size() >= static_cast<size_t>(kMaxLanes)) {
    return Status::InvalidArgument("more than " + std::to_string(kMaxLanes) +
                                   " NCCL lanes on one link");
  }
  KV_ASSIGN_OR_RETURN(gpu::CudaStream stream, gpu::CudaStream::Create(device_));
  std::vector<gpu::CudaEvent> launched;
  if (blocking_launch) {
    for (size_t i = 0; i < kLaunchesAhead; ++i) {
      KV_ASSIGN_OR_RETURN(launched.emplace_back(), gpu::CudaEvent::Create(device_));
    }
  }
  std::lock_guard lock(mu_);
  if (aborted_) return Status::Aborted("nccl: link failed");
  Lane& lane = *lanes_.emplace_back(std::make_unique<Lane>());
  lane.stream = std::move(stream);
  lane.launched = std::move(launched);
  KV_RETURN_IF_ERROR(
      lane.comm.Init(unique_id, rank, device_, deadline, cancelled_, blocking_launch));
  if (!blocking_launch) return Status::Ok();
  KV_RETURN_IF_ERROR(Connect(lane, rank, deadline));
  KV_RETURN_IF_ERROR(lane.blocking.SplitBlocking(lane.comm, rank, device_, deadline, cancelled_));
  lane.blocking_launch = true;
  return Status::Ok();
}

// NCCL connects a peer's channels on the first operation with it, whatever its size, and a
// communicator split with splitShare uses those connections: one byte from rank 0 to rank 1 on
// the non-blocking communicator, waited for with a deadline, leaves the blocking one nothing to
// connect.
Status Lanes::Connect(Lane& lane, int rank, SteadyTime deadline) {
  if (scratch_.data() == nullptr) {
    KV_ASSIGN_OR_RETURN(scratch_, gpu::DeviceBuffer::Allocate(device_, 16));
  }
  gpu::DeviceGuard guard(device_);
  const ncclResult_t r =
      rank == 0 ? ncclSend(scratch_.data(), 1, ncclUint8, 1, lane.comm.get(), lane.stream.get())
                : ncclRecv(scratch_.data(), 1, ncclUint8, 0, lane.comm.get(), lane.stream.get());
  if (r != ncclSuccess && r != ncclInProgress) {
    lane.comm.MarkFailed();
    return NcclStatus(r, "ncclSend/ncclRecv (connecting a lane)");
  }
  KV_RETURN_IF_ERROR(lane.comm.WaitEnqueued(deadline, cancelled_));
  Status ran = WaitForStream(lane.stream.get(), deadline, cancelled_);
  if (!ran.ok()) lane.comm.MarkFailed();
  return ran;
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
    if (!named[op.lane]) {
      KV_RETURN_IF_ERROR(SettleLocked(lane, deadline));
      if (lane.blocking_launch) KV_RETURN_IF_ERROR(WaitForRoom(lane, deadline));
    }
    named[op.lane] = true;
    if (!lane.launcher().ready()) return Status::Unavailable("nccl: communicator failed");
  }
  gpu::DeviceGuard guard(device_);
  for (const Op& op : ops) {
    if (op.wait == nullptr) continue;
    KV_RETURN_IF_ERROR(
        gpu::CudaStatus(cudaStreamWaitEvent(lanes_[op.lane]->stream.get(), op.wait->get(), 0),
                        "cudaStreamWaitEvent"));
  }
  // The peer is rank 1 for the sender (rank 0) and rank 0 for the receiver. A group never mixes
  // the two launch modes, which NCCL refuses: the lanes of one direction launch alike (its
  // sender decides for all of them).
  ncclResult_t r = ncclGroupStart();
  for (const Op& op : ops) {
    if (r != ncclSuccess) break;
    Lane& lane = *lanes_[op.lane];
    ncclComm_t comm = lane.launcher().get();
    r = op.send ? ncclSend(op.data, op.bytes, ncclUint8, 1, comm, lane.stream.get())
                : ncclRecv(op.data, op.bytes, ncclUint8, 0, comm, lane.stream.get());
  }
  // Ends the group even after a failed call: NCCL then drops the whole group.
  const ncclResult_t ended = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = ended;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (!named[i]) continue;
    if (r != ncclSuccess && r != ncclInProgress) {
      lanes_[i]->launcher().MarkFailed();
      continue;
    }
    lanes_[i]->in_flight = true;
  }
  if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, "ncclGroupEnd (send/recv)");
  for (const Op& op : ops) {
    if (op.then != nullptr) lanes_[op.lane]->then.push_back(op.then);
  }
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = *lanes_[i];
    if (!named[i] || !lane.blocking_launch) continue;
    // Enqueued already: record now what Settle would have.
    KV_RETURN_IF_ERROR(SettleLocked(lane, deadline));
    gpu::CudaEvent& mark = lane.launched[lane.next_launched];
    KV_RETURN_IF_ERROR(mark.Record(lane.stream.get()));
    lane.next_launched = (lane.next_launched + 1) % lane.launched.size();
  }
  return Status::Ok();
}

Status Lanes::WaitForRoom(Lane& lane, SteadyTime deadline) {
  // The event about to be recorded again marks the launch kLaunchesAhead back.
  const gpu::CudaEvent& oldest = lane.launched[lane.next_launched];
  SteadyTime nap_from{};  // from the first look that finds no room
  while (true) {
    KV_ASSIGN_OR_RETURN(bool done, oldest.Query());
    if (done) return Status::Ok();
    if (cancelled_.load()) return Status::Aborted("nccl: link failed");
    const auto now = std::chrono::steady_clock::now();
    if (nap_from == SteadyTime{}) nap_from = now + kRoomSpin;
    if (now >= deadline) {
      lane.launcher().MarkFailed();
      return Status::Timeout("nccl: " + std::to_string(kLaunchesAhead) +
                             " launches of a lane unfinished past the deadline");
    }
    if (now < nap_from) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kRoomNap);
    }
  }
}

Status Lanes::Settle(size_t lane, SteadyTime deadline) {
  std::lock_guard lock(mu_);
  if (aborted_) return Status::Aborted("nccl: link failed");
  return SettleLocked(*lanes_[lane], deadline);
}

Status Lanes::SettleLocked(Lane& lane, SteadyTime deadline) {
  if (!lane.in_flight) return Status::Ok();
  lane.in_flight = false;
  Status enqueued = lane.launcher().WaitEnqueued(deadline, cancelled_);
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
  for (auto& lane : lanes_) {
    aborts.emplace_back([&lane = *lane] {
      lane.blocking.Abort();  // shares the abort flag with `comm`: its kernels stop too
      lane.comm.Abort();
    });
  }
  for (std::thread& t : aborts) t.join();
}

}  // namespace kv::transport::nccl
