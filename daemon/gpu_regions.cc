// GPU engines in kvd: batches out of their regions held until their per-layer events fired
// (daemon/event_gate.h). Their regions are registered as host ones are (engine_session.cc,
// StartRegister).
#include <spdlog/spdlog.h>

#include "daemon/core.h"

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
  // Posted at once when the event fired already; else held in the gate until it has, seen from
  // the host. The probe keeps the engine's events open while the batch waits, even if the engine
  // leaves meanwhile; the batches of one engine's layer share an answer per pass (the key).
  return event_gate_->Post(
      batch, [events = engine.layer_events, event_layer] { return events->Fired(event_layer); },
      std::move(done), EventKey{engine.layer_events.get(), event_layer});
}

}  // namespace kv::daemon
