// Scheduler (scheduler.h): what both sides of the request state machines share: tokens, the
// source-request bound, a peer's Fail, and the failure fan-out when an engine or a peer leaves or
// a lease ends.
#include "daemon/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "daemon/peer_auth.h"
#include "protocol/wire_layout.h"

namespace kv::daemon {

Scheduler::Scheduler(const DaemonOptions& options, std::string listen_address, Registry& registry,
                     Peers& peers, SendQueue& send_queue, PlanEntries plan_entries,
                     membership::PeerResolver* resolver, boost::asio::io_context& io, Hooks hooks)
    : options_(options),
      listen_address_(std::move(listen_address)),
      registry_(registry),
      peers_(peers),
      send_queue_(send_queue),
      plan_entries_(plan_entries),
      resolver_(resolver),
      io_(io),
      hooks_(std::move(hooks)) {}

Status Scheduler::NewToken(std::string* out) {
  KV_ASSIGN_OR_RETURN(*out, auth::RandomBytes(auth::kTransferTokenBytes));
  return Status::Ok();
}

Status Scheduler::CheckSourceRoom(const std::string& request_id) const {
  if (sources_.size() >= static_cast<size_t>(options_.max_source_requests)) {
    return Status::ResourceExhausted(
        "request " + request_id + ": " + std::to_string(sources_.size()) +
        " requests held as a source, limit " + std::to_string(options_.max_source_requests));
  }
  return Status::Ok();
}

std::optional<uint64_t> Scheduler::GenerationOf(const std::string& request_id) const {
  auto it = sources_.find(request_id);
  if (it == sources_.end()) return std::nullopt;
  return it->second.generation;
}

void Scheduler::SendToEngine(uint64_t engine_id, const proto::DaemonMessage& message) {
  if (Engine* engine = registry_.Find(engine_id)) (void)engine->conn->Send(message);
}

int Scheduler::batches_in_flight() const {
  int n = 0;
  for (const auto& [id, r] : sources_) n += r.batches_in_flight;
  return n;
}

void Scheduler::Clear() {
  sources_.clear();
  loads_.clear();
  gathered_.clear();
  held_wants_.clear();
  held_want_bytes_ = 0;
  retired_.clear();
}

void Scheduler::OnPeerFail(Peer& peer, const proto::Fail& fail) {
  const Status why = FromWire(fail.error()).WithContext("peer " + peer.name);
  const Status failure = why.ok() ? Status::Aborted("peer " + peer.name + " failed it") : why;
  auto s = sources_.find(fail.request_id());
  if (s != sources_.end() && s->second.destination_of(peer.id) != nullptr) {
    // Its other destinations (decode ranks behind other kvds) hear it from us.
    FinishSource(fail.request_id(), failure, /*tell_peer=*/true, /*told=*/peer.id);
  }
  auto d = loads_.find(fail.request_id());
  if (d != loads_.end() && d->second.peer_id == peer.id) {
    FinishDest(fail.request_id(), failure, false);
  }
}

// ---- failure fan-out ----------------------------------------------------------------------------

void Scheduler::FailRequestsOfEngine(uint64_t engine_id, const Status& why) {
  std::vector<std::string> sources, loads;
  for (const auto& [id, r] : sources_) {
    // Its ranks' engines, and those that fixed its token before saving (SetTransferToken).
    bool of_engine = std::find(r.token_engines.begin(), r.token_engines.end(), engine_id) !=
                     r.token_engines.end();
    for (const auto& [rank_no, rank] : r.ranks) {
      if (rank.engine_id == engine_id) of_engine = true;
    }
    if (of_engine) sources.push_back(id);
  }
  for (const auto& [id, r] : loads_) {
    for (const auto& [rank_no, rank] : r.ranks) {
      if (rank.engine_id == engine_id) loads.push_back(id);
    }
  }
  for (const auto& id : sources) FinishSource(id, why, /*tell_peer=*/true);
  for (const auto& id : loads) FinishDest(id, why, /*tell_peer=*/true);
}

void Scheduler::FailRequestsOfPeer(uint64_t peer_id, const Status& why) {
  std::vector<std::string> sources, loads;
  for (auto& [id, r] : sources_) {
    if (r.destination_of(peer_id) != nullptr) sources.push_back(id);
  }
  for (const auto& [id, r] : loads_) {
    if (r.state == DestRequest::State::kRequested && r.peer_id == peer_id) loads.push_back(id);
  }
  // A request's other destinations (decode ranks behind other kvds) hear it from us.
  for (const auto& id : sources) FinishSource(id, why, /*tell_peer=*/true, /*told=*/peer_id);
  for (const auto& id : loads) FinishDest(id, why, false);
  DropHeldWantsOfPeer(peer_id);
}

void Scheduler::ExpireRequests(Clock::time_point now) {
  std::vector<std::string> sources, loads;
  for (const auto& [id, r] : sources_) {
    if (r.deadline < now) sources.push_back(id);
  }
  for (const auto& [id, r] : loads_) {
    if (r.deadline < now) loads.push_back(id);
  }
  const std::string lease = std::to_string(options_.lease.count()) + " ms";
  for (const auto& id : sources) {
    FinishSource(
        id, Status::Timeout("request " + id + " not confirmed within its lease of " + lease), true);
  }
  for (const auto& id : loads) {
    FinishDest(id, Status::Timeout("request " + id + " not complete within " + lease), true);
  }
  ExpireHeldWants(now);
  std::erase_if(retired_, [now](const Retired& r) { return r.until < now; });
}

}  // namespace kv::daemon
