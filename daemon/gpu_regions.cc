// GPU engines in kvd: batches out of their regions ordered after their per-layer events
// (post_after: device_ordered.h). Their regions are registered as host ones are
// (engine_session.cc, HandleRegister).
#include "daemon/core.h"
#include "transport/cuda_ipc/device_ordered.h"

namespace kv::daemon {

Status Daemon::Core::PostFromEngine(const Engine& engine, int event_layer,
                                    const transport::Batch& batch, transport::Completion done) {
  if (engine.regions.empty() || engine.regions.front()->where.kind != MemoryKind::kCuda ||
      event_layer < 0) {
    return transport_->post(batch, std::move(done));
  }
  if (!engine.layer_events) {
    return Status::InvalidArgument("GPU caches need the engine's layer events before save_layer");
  }
  auto* ordered = dynamic_cast<transport::DeviceOrdered*>(transport_.get());
  if (ordered == nullptr) {
    return Status::Unsupported("transport " + std::string(transport_->name()) +
                               " cannot order copies after the engine's CUDA events");
  }
  // An event whose last record already completed needs no wait, and a device-side wait on
  // another process's event is not free (behind one, the nccl backend saw the engine's records
  // complete once per ~15 ms: benchmarks/pd_gpu.md). Asked here once for every backend.
  KV_ASSIGN_OR_RETURN(bool fired, engine.layer_events->Fired(event_layer));
  return ordered->post_after(batch, fired ? nullptr : engine.layer_events->event(event_layer),
                             std::move(done));
}

}  // namespace kv::daemon
