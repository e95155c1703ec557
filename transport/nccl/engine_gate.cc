#include "transport/nccl/engine_gate.h"

#include <thread>

namespace kv::transport::nccl {

using gpu::CudaStatus;

namespace {

// A failed query fails one batch and the link goes on: the error must not stay this thread's
// last error, where the next kernel launch's check (kernels' LaunchStatus) would take it as its
// own. A sticky error stays whatever this does.
Status Failed(cudaError_t state, const char* what) {
  cudaGetLastError();
  return CudaStatus(state, what);
}

}  // namespace

Result<EngineGate> EngineGate::Create(int device, bool host_gate) {
  EngineGate gate(device, host_gate);
  if (!host_gate) {
    KV_ASSIGN_OR_RETURN(gate.relay_, gpu::CudaStream::Create(device));
  }
  return gate;
}

Result<EngineGate::Wait> EngineGate::Capture(void* event) {
  Wait wait;
  if (event == nullptr) return wait;
  auto* raw = static_cast<cudaEvent_t>(event);
  gpu::DeviceGuard guard(device_);
  const cudaError_t state = cudaEventQuery(raw);
  if (state == cudaSuccess) return wait;
  if (state != cudaErrorNotReady) return Failed(state, "cudaEventQuery");
  if (host_gate_) {
    wait.host = raw;
    return wait;
  }
  KV_ASSIGN_OR_RETURN(wait.device, gpu::CudaEvent::Create(device_));
  std::lock_guard lock(*mu_);
  KV_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(relay_.get(), raw, 0), "cudaStreamWaitEvent"));
  KV_RETURN_IF_ERROR(wait.device.Record(relay_.get()));
  return wait;
}

Status Poll(cudaEvent_t event, SteadyTime deadline, const std::atomic<bool>& cancelled) {
  // An engine far behind costs no core: after the spins, one query per kPoll.
  constexpr int kSpins = 64;
  constexpr auto kPoll = std::chrono::microseconds(20);
  for (int polls = 0;; ++polls) {
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaSuccess) return Status::Ok();
    if (state != cudaErrorNotReady) return Failed(state, "the engine's event");
    if (cancelled.load()) return Status::Aborted("nccl: the link failed");
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout("nccl: the engine's event did not fire before the batch's deadline");
    }
    if (polls < kSpins) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPoll);
    }
  }
}

}  // namespace kv::transport::nccl
