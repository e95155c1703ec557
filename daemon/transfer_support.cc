// Support of the request state machines (transfers.cc): the checks and capabilities issue 19
// added, the helpers shared with other files, and the failure fan-out.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "daemon/core.h"
#include "daemon/peer_auth.h"
#include "protocol/wire_layout.h"

namespace kv::daemon {

Status CheckBlocks(std::span<const int64_t> ids, const std::vector<const KvRegion*>& regions,
                   int64_t tokens) {
  if (ids.empty() || ids.size() > kMaxBlocksPerRequest) {
    return Status::InvalidArgument("a request names 1 to " + std::to_string(kMaxBlocksPerRequest) +
                                   " blocks, not " + std::to_string(ids.size()));
  }
  for (const KvRegion* region : regions) {
    const int64_t blocks = region->spec().blocks;
    for (int64_t id : ids) {
      if (id < 0 || id >= blocks) {
        return Status::OutOfRange("block id " + std::to_string(id) + " out of range [0, " +
                                  std::to_string(blocks) + ")");
      }
    }
    if (tokens > 0 && static_cast<int64_t>(ids.size()) * region->spec().block_size < tokens) {
      return Status::InvalidArgument(std::to_string(ids.size()) + " blocks of " +
                                     std::to_string(region->spec().block_size) +
                                     " tokens cannot hold " + std::to_string(tokens) + " tokens");
    }
  }
  return Status::Ok();
}

std::vector<const KvRegion*> LayoutsOf(const Engine& engine) {
  std::vector<const KvRegion*> out;
  for (const auto& r : engine.regions) out.push_back(&r->layout);
  return out;
}

// Destination block ids are written to: one named twice would take two source blocks' bytes
// (a peer's doing, or an engine's bug), so both are refused.
Status CheckDistinctBlocks(std::span<const int64_t> ids) {
  std::vector<int64_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    return Status::InvalidArgument("destination block id " + std::to_string(*dup) +
                                   " is named twice");
  }
  return Status::Ok();
}

Status Daemon::Core::NewToken(std::string* out) {
  KV_ASSIGN_OR_RETURN(*out, auth::RandomBytes(auth::kTransferTokenBytes));
  return Status::Ok();
}

Status Daemon::Core::CheckSourceRoom(const std::string& request_id) const {
  if (sources_.size() >= static_cast<size_t>(options_.max_source_requests)) {
    return Status::ResourceExhausted(
        "request " + request_id + ": " + std::to_string(sources_.size()) +
        " requests held as a source, limit " + std::to_string(options_.max_source_requests));
  }
  return Status::Ok();
}

void Trace(std::string_view event, const std::string& request, int layer, uint64_t bytes) {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
          .count();
  spdlog::debug("trace {} {} {} {} {}", us, event, request, layer, bytes);
}

Status CheckRequestId(const std::string& id) {
  if (id.empty() || id.size() > kMaxRequestIdBytes) {
    return Status::InvalidArgument("request id must have 1 to " +
                                   std::to_string(kMaxRequestIdBytes) + " bytes");
  }
  return Status::Ok();
}

proto::DaemonMessage RequestDoneMessage(const std::string& id, bool sent, const Status& status,
                                        uint64_t bytes, uint64_t runs) {
  proto::DaemonMessage m;
  auto* done = m.mutable_request_done();
  done->set_request_id(id);
  done->set_sent(sent);
  done->set_bytes(bytes);
  done->set_runs(runs);
  if (!status.ok()) ToWire(status, done->mutable_error());
  return m;
}

// ---- failure fan-out ----------------------------------------------------------------------------

void Daemon::Core::FailRequestsOfEngine(uint64_t engine_id, const Status& why) {
  std::vector<std::string> sources, loads;
  for (const auto& [id, r] : sources_) {
    for (const auto& [rank_no, rank] : r.ranks) {
      if (rank.engine_id == engine_id) sources.push_back(id);
    }
  }
  for (const auto& [id, r] : loads_) {
    for (const auto& [rank_no, rank] : r.ranks) {
      if (rank.engine_id == engine_id) loads.push_back(id);
    }
  }
  for (const auto& id : sources) FinishSource(id, why, /*tell_peer=*/true);
  for (const auto& id : loads) FinishDest(id, why, /*tell_peer=*/true);
}

void Daemon::Core::FailRequestsOfPeer(uint64_t peer_id, const Status& why) {
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
  DropHeldWantsOfPeer(peer_id);  // [token] held_wants.cc
}

void Daemon::Core::ExpireRequests(Clock::time_point now) {
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
  ExpireHeldWants(now);  // [token] held_wants.cc
  std::erase_if(retired_, [now](const Retired& r) { return r.until < now; });
}

}  // namespace kv::daemon
