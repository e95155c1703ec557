// Transfer tokens that engines choose, and the Wants that arrive before them (core.h; SECURITY.md,
// "Transfer tokens"). Scheduler methods (scheduler.h). The vLLM connector's scheduler mints a
// request's token when the request finishes and hands it to the decode side in kv_transfer_params;
// its workers pass the same token to kvd with RequestFinished a scheduler step later. A router or
// simulator that knows the request ahead mints it when the prefill starts, and the prefill ranks
// fix it before their first save (SetTransferToken), so that the decode's Want is served while the
// prefill still runs: per-layer streaming with tokens required. The decode's Want can overtake
// either: a Want that presents a token before its request's token is fixed is held here, then
// checked as any other once it is (OnWant), or refused when its lease ends first. Nothing moves
// towards a held Want's destination before its token matched.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "daemon/peer_auth.h"
#include "daemon/scheduler.h"

namespace kv::daemon {

namespace {

// The bytes all held Wants may take (each names its decode ranks' regions and block ids).
constexpr size_t kMaxHeldWantBytes = size_t{64} << 20;

}  // namespace

Status Scheduler::HoldWant(Peer& peer, const proto::WantRequest& want) {
  const size_t held = sources_.size() + held_wants_.size();
  if (held >= static_cast<size_t>(options_.max_source_requests)) {
    return Status::ResourceExhausted("request " + want.request_id() + ": " + std::to_string(held) +
                                     " requests held as a source or waiting for their transfer "
                                     "token, limit " +
                                     std::to_string(options_.max_source_requests));
  }
  if (peer.requests >= options_.max_requests_per_peer) {
    return Status::ResourceExhausted("peer " + peer.name + " has " + std::to_string(peer.requests) +
                                     " requests in flight or waiting for their transfer token "
                                     "here, the limit");
  }
  const size_t bytes = want.ByteSizeLong();
  if (held_want_bytes_ + bytes > kMaxHeldWantBytes) {
    return Status::ResourceExhausted("request " + want.request_id() +
                                     ": the Wants waiting for their transfer token hold " +
                                     std::to_string(held_want_bytes_) + " bytes, the limit");
  }
  auto lease = options_.lease;
  if (want.lease_ms() > 0) lease = std::min(lease, std::chrono::milliseconds(want.lease_ms()));
  held_wants_.emplace(want.request_id(), HeldWant{peer.id, want, bytes, Clock::now() + lease});
  held_want_bytes_ += bytes;
  ++peer.requests;  // until released, refused or expired
  Trace("hold", want.request_id(), -1);
  return Status::Ok();
}

Status Scheduler::FixEngineToken(SourceRequest& request, const std::string& token) {
  Status bad;
  if (token.size() < auth::kTransferTokenBytes || token.size() > auth::kMaxTransferTokenBytes) {
    bad = Status::InvalidArgument("request " + request.id + ": a transfer token of " +
                                  std::to_string(token.size()) + " bytes, not " +
                                  std::to_string(auth::kTransferTokenBytes) + " to " +
                                  std::to_string(auth::kMaxTransferTokenBytes));
  } else if (!request.token_fixed) {
    request.token = token;
    request.token_fixed = true;
    return Status::Ok();
  } else if (auth::Equal(request.token, token)) {
    return Status::Ok();
  } else {
    bad = Status::InvalidArgument("request " + request.id +
                                  ": its prefill ranks gave it different transfer tokens");
  }
  // The engines disagree on the capability: nothing of this request may move.
  FinishSource(request.id, bad, /*tell_peer=*/true);
  return bad;
}

Status Scheduler::SetTransferToken(Engine& engine, const proto::SetTransferToken& m) {
  const std::string& id = m.request_id();
  KV_RETURN_IF_ERROR(CheckRequestId(id));
  if (engine.regions.empty()) return Status::InvalidArgument("register_kv_caches first");
  const std::string& token = m.transfer_token();
  if (token.size() < auth::kTransferTokenBytes || token.size() > auth::kMaxTransferTokenBytes) {
    return Status::InvalidArgument("request " + id + ": a transfer token of " +
                                   std::to_string(token.size()) + " bytes, not " +
                                   std::to_string(auth::kTransferTokenBytes) + " to " +
                                   std::to_string(auth::kMaxTransferTokenBytes));
  }
  auto it = sources_.find(id);
  if (it != sources_.end() && !it->second.instance.empty() &&
      it->second.instance != engine.instance) {
    return Status::AlreadyExists("request " + id + " belongs to instance " + it->second.instance);
  }
  if (it != sources_.end() && it->second.token_fixed && !auth::Equal(it->second.token, token)) {
    return Status::InvalidArgument("request " + id +
                                   ": its prefill ranks gave it different transfer tokens");
  }
  if (it == sources_.end()) {
    KV_RETURN_IF_ERROR(CheckSourceRoom(id));
    it = sources_.try_emplace(id).first;
    it->second.id = id;
    it->second.deadline = Clock::now() + options_.lease;
  }
  SourceRequest& request = it->second;
  if (request.instance.empty()) {  // new, or a Want without a token created it (optional)
    request.instance = engine.instance;
    request.tp_size = engine.tp_size;
    request.layers = static_cast<int>(engine.regions.front()->layout.spec().layers);
  }
  if (std::find(request.token_engines.begin(), request.token_engines.end(), engine.id) ==
      request.token_engines.end()) {
    request.token_engines.push_back(engine.id);
  }
  Trace("token", id, -1);
  if (request.token_fixed) return Status::Ok();  // the same token again (another rank)
  request.token = token;
  request.token_fixed = true;
  if (held_wants_.count(id) > 0) ReleaseHeldWants(id);  // may end the request
  return Status::Ok();
}

namespace {

std::vector<HeldWant> Take(std::multimap<std::string, HeldWant>& held, const std::string& id,
                           size_t* bytes) {
  auto [begin, end] = held.equal_range(id);
  std::vector<HeldWant> out;
  for (auto it = begin; it != end; ++it) {
    *bytes -= it->second.bytes;
    out.push_back(std::move(it->second));
  }
  held.erase(begin, end);
  return out;
}

}  // namespace

void Scheduler::ReleaseHeldWants(const std::string& request_id) {
  for (HeldWant& h : Take(held_wants_, request_id, &held_want_bytes_)) {
    Peer* peer = peers_.Find(h.peer_id);
    if (peer == nullptr) continue;
    --peer->requests;
    hooks_.handle_want(h.peer_id, std::move(h.want));
  }
}

void Scheduler::DropHeldWants(const std::string& request_id, const Status& why) {
  for (HeldWant& h : Take(held_wants_, request_id, &held_want_bytes_)) {
    if (Peer* peer = peers_.Find(h.peer_id)) --peer->requests;
    hooks_.refuse_want(h.peer_id, h.want, why);
  }
}

void Scheduler::DropHeldWantsOfPeer(uint64_t peer_id) {
  Peer* peer = peers_.Find(peer_id);
  std::erase_if(held_wants_, [&](const auto& entry) {
    if (entry.second.peer_id != peer_id) return false;
    held_want_bytes_ -= entry.second.bytes;
    if (peer != nullptr) --peer->requests;
    return true;
  });
}

void Scheduler::ExpireHeldWants(Clock::time_point now) {
  std::vector<HeldWant> expired;
  std::erase_if(held_wants_, [&](auto& entry) {
    if (entry.second.deadline >= now) return false;
    held_want_bytes_ -= entry.second.bytes;
    expired.push_back(std::move(entry.second));
    return true;
  });
  for (const HeldWant& h : expired) {
    if (Peer* peer = peers_.Find(h.peer_id)) --peer->requests;
    hooks_.refuse_want(
        h.peer_id, h.want,
        Status::Timeout("request " + h.want.request_id() +
                        ": no prefill engine finished it with a transfer token within the "
                        "Want's lease"));
  }
}

}  // namespace kv::daemon
