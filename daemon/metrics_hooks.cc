// Daemon::Core's side of the Prometheus metrics (daemon/metrics/): the counting hooks the request
// state machines call as requests end and layers land (io thread), and the /metrics endpoint,
// which renders on the metrics server's own thread.
#include <spdlog/spdlog.h>

#include "daemon/core.h"

#ifndef KVD_VERSION
#define KVD_VERSION "unknown"
#endif

namespace kv::daemon {

namespace {

// How long a scrape waits for the io thread's snapshot. A busy io loop answers within
// microseconds; one stuck for a second is worth seeing as missing gauges (and a counter), not as
// a scrape that hangs until Prometheus gives up.
constexpr auto kSnapshotWait = std::chrono::seconds(1);

}  // namespace

Status Daemon::Core::StartMetrics() {
  metrics::HttpServer::Route route;
  route.path = "/metrics";
  route.content_type = "text/plain; version=0.0.4; charset=utf-8";
  route.render = [this] { return RenderMetrics(); };
  auto server = metrics::HttpServer::Start(options_.metrics_listen, std::move(route));
  if (!server.ok()) return server.status();
  metrics_server_ = std::move(*server);
  spdlog::info("kvd {}: metrics on http://{}/metrics", options_.name, metrics_server_->address());
  return Status::Ok();
}

std::string Daemon::Core::RenderMetrics() {
  const std::optional<proto::DaemonStatus> status = StatusFromIo(kSnapshotWait);
  if (!status) metrics_.SnapshotTimeout();
  return metrics_.Render(status ? &*status : nullptr, KVD_VERSION);
}

void Daemon::Core::CountRequest(const SourceRequest& request, const Status& status) {
  // A request that never learnt its destination (kCollecting) has no peer to count it under;
  // one whose decode ranks sat behind several kvds counts under the first that asked.
  const Peer* peer =
      request.destinations.empty() ? nullptr : FindPeer(request.destinations.front().peer_id);
  const std::string name = request.destinations.empty() ? "" : peer ? peer->name : "gone";
  metrics_.RequestDone(metrics::Role::kSource, name, transport_name(), status.ok(), request.bytes,
                       Clock::now() - request.started);
}

void Daemon::Core::CountRequest(const DestRequest& request, const Status& status) {
  const Peer* peer = FindPeer(request.peer_id);
  // Before its hello a peer has no name yet: its address stands in.
  const std::string name = peer && !peer->name.empty() ? peer->name : request.peer_address;
  metrics_.RequestDone(metrics::Role::kDestination, name, transport_name(), status.ok(),
                       request.bytes, Clock::now() - request.started);
}

void Daemon::Core::CountLayer(const SendGroup::Part& part, const Status& status) {
  if (status.ok()) metrics_.LayerLanded(Clock::now() - part.queued);
}

}  // namespace kv::daemon
