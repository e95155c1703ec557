// How a put waits for the engine's event (DeviceOrdered::post_after), for nccl_link.h.
//
// An event that already fired is not waited on. One that has not is, without host_gate (kvd's
// default is host_gate, nccl_transport.h), captured at post time through a relay stream: the relay
// waits on it on the device and records an event of ours that the batch's sends wait on (the caller
// may destroy its event once the post returns). Through kvd that device wait is slow: while kvd's
// context waits on the device for an event of the engine's process that is not yet recorded, the
// engine's records on that GPU ran about one per 15 ms on two H200s (benchmarks/pd_gpu.md, "nccl
// through kvd"). With host_gate the event is handed to the sender thread, which polls it on the
// host (Poll) before it enqueues anything of the batch, so nothing of kvd waits on the engine on
// the device; the caller's event must then stay valid until the batch completes, as DeviceOrdered
// (device_ordered.h) asks of callers.
//
// Thread-safety: Capture may be called from any thread; Poll is a free function.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "base/status.h"
#include "gpu/cuda_util.h"
#include "transport/nccl/nccl_comm.h"

namespace kv::transport::nccl {

class EngineGate {
 public:
  static Result<EngineGate> Create(int device, bool host_gate);

  // What a batch posted after `event` waits on: nothing (no event, or it fired already), `host`
  // (host_gate: the caller's event, to Poll), or `device` (recorded behind it on the relay).
  struct Wait {
    gpu::CudaEvent device;
    cudaEvent_t host = nullptr;
  };
  // Makes up to four CUDA calls, none of which waits for the device.
  Result<Wait> Capture(void* event);

 private:
  EngineGate(int device, bool host_gate) : device_(device), host_gate_(host_gate) {}

  int device_ = 0;
  bool host_gate_ = false;
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();  // guards relay_'s order
  gpu::CudaStream relay_;                                            // only without host_gate
};

// Until `event` fired: kOk; kTimeout at `deadline`; kAborted once `cancelled`; the CUDA error
// when the event's work failed. Spins briefly, then polls every few tens of microseconds.
Status Poll(cudaEvent_t event, SteadyTime deadline, const std::atomic<bool>& cancelled);

}  // namespace kv::transport::nccl
