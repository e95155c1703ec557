#include "transport/nccl/nccl_comm.h"

#include <cstring>
#include <thread>

#include "gpu/cuda_util.h"

namespace kv::transport::nccl {

Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return Status::Ok();
  std::string message = std::string(what) + ": " + ncclGetErrorString(result);
  if (result == ncclRemoteError || result == ncclSystemError) {
    return Status::Unavailable(std::move(message));
  }
  return Status::IoError(std::move(message));
}

Result<std::string> NewUniqueId() {
  ncclUniqueId id;
  KV_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(id.internal, sizeof(id.internal));
}

Status LoadNcclKernels(int device) {
  ncclUniqueId id;
  KV_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  gpu::DeviceGuard guard(device);
  ncclComm_t comm = nullptr;
  KV_RETURN_IF_ERROR(NcclStatus(ncclCommInitRank(&comm, 1, id, 0), "ncclCommInitRank (1 rank)"));
  return NcclStatus(ncclCommDestroy(comm), "ncclCommDestroy");
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr) return;
  if (failed_) {
    ncclCommAbort(comm_);
  } else {
    ncclCommDestroy(comm_);
  }
}

Status NcclComm::Init(std::string_view unique_id, int rank, int device, SteadyTime deadline,
                      const std::atomic<bool>& cancelled, bool shared_by_splits) {
  if (unique_id.size() != sizeof(ncclUniqueId)) {
    return Status::InvalidArgument("NCCL unique id has " + std::to_string(unique_id.size()) +
                                   " bytes, expected " + std::to_string(sizeof(ncclUniqueId)));
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.splitShare = shared_by_splits ? 1 : 0;
  gpu::DeviceGuard guard(device);
  ncclResult_t result = ncclCommInitRankConfig(&comm_, 2, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    failed_ = comm_ != nullptr;
    return NcclStatus(result, "ncclCommInitRankConfig");
  }
  return WaitEnqueued(deadline, cancelled);
}

Status NcclComm::SplitBlocking(NcclComm& parent, int rank, int device, SteadyTime deadline,
                               const std::atomic<bool>& cancelled) {
  if (!parent.ready()) return Status::Unavailable("nccl: split of a failed communicator");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  gpu::DeviceGuard guard(device);
  // The parent is non-blocking, so is the split: it runs on a thread of NCCL's and reports
  // through the parent's state; the child appears in comm_ once it is done.
  ncclResult_t result = ncclCommSplit(parent.get(), /*color=*/0, /*key=*/rank, &comm_, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    parent.MarkFailed();
    return NcclStatus(result, "ncclCommSplit");
  }
  Status split = parent.WaitEnqueued(deadline, cancelled);
  if (!split.ok()) {
    parent.Abort();  // joins the split's thread first, which may still write comm_
    failed_ = comm_ != nullptr;
    return split;
  }
  if (comm_ == nullptr) return Status::IoError("ncclCommSplit made no communicator");
  ncclResult_t state = ncclSuccess;
  ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
  if (query != ncclSuccess) state = query;
  if (state != ncclSuccess) failed_ = true;
  return NcclStatus(state, "ncclCommSplit (child)");
}

Status NcclComm::WaitEnqueued(SteadyTime deadline, const std::atomic<bool>& cancelled) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) state = query;
    if (state == ncclSuccess) return Status::Ok();
    if (state != ncclInProgress) {
      failed_ = true;
      return NcclStatus(state, "NCCL communicator");
    }
    if (cancelled.load()) {
      failed_ = true;
      return Status::Aborted("NCCL wait cancelled: the link failed");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      failed_ = true;
      return Status::Timeout("NCCL communicator did not progress before the deadline");
    }
    std::this_thread::yield();
  }
}

void NcclComm::Abort() {
  if (comm_ == nullptr) return;
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

}  // namespace kv::transport::nccl
