// A capability of the GPU backends (cuda_ipc, nccl, staged) beyond Transport: posting a batch
// whose copies wait for a CUDA event, so that kvd starts a layer's transfer when the engine's
// per-layer event (shared with ImportEvent, ipc_event.h) fires, with no host synchronisation in
// the engine and none on kvd's posting path.
//
// Callers discover it at run time: dynamic_cast<DeviceOrdered*>(transport). The batch waits at
// least for the event's most recent record at the time of the call (CUDA's cudaStreamWaitEvent
// semantics); the event may be recorded again once the call returns, and must stay valid until
// the batch's completion ran: a backend may watch it from the host instead of waiting on the
// device (a device-side wait on another process's event can make that process's records run
// once per ~15 ms: benchmarks/pd_gpu.md), and then a record made after the call delays the
// batch until that one fired too.
//
// An event whose recording process dies before its stream reached the record never fires: a
// stream waiting on it stayed blocked (18 s and counting, on the H200s; benchmarks/pd_gpu.md,
// seventh session). So cuda_ipc, staged and nccl (with its default host_gate) poll the event
// from the host and enqueue nothing of the batch before it fired: such a batch fails at its
// deadline having written nothing, and no stream of kvd's waits on it.
// Thread-safe like Transport::post().
#pragma once

#include "transport/transport.h"

namespace kv::transport {

class DeviceOrdered {
 public:
  virtual ~DeviceOrdered() = default;
  // Transport::post() whose copies start only after `cuda_event` (a cudaEvent_t) completes.
  // nullptr means no wait. Same validation, errors and completion contract as post().
  virtual Status post_after(const Batch& batch, void* cuda_event, Completion done) = 0;
};

}  // namespace kv::transport
