// The destination (decode) side of the Scheduler's request state machines (scheduler.h): a load
// asked of the prefill kvd, its layers landing, its end; the source side is in transfers.cc.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>

#include "daemon/peer_auth.h"
#include "daemon/scheduler.h"
#include "protocol/wire_layout.h"

namespace kv::daemon {

namespace {

// Engines of `instance` connected to this kvd with their caches registered: the decode ranks a
// request of that instance waits for here.
int RanksHere(const std::map<uint64_t, Engine>& engines, const std::string& instance) {
  int n = 0;
  for (const auto& [id, engine] : engines) {
    if (engine.hello && engine.instance == instance && !engine.regions.empty()) ++n;
  }
  return n;
}

}  // namespace

Status Scheduler::StartLoad(Engine& engine, const proto::StartLoad& load) {
  KV_RETURN_IF_ERROR(CheckRequestId(load.request_id()));
  if (engine.regions.empty()) return Status::InvalidArgument("register_kv_caches first");
  if (load.tokens() <= 0 || load.tokens() > kMaxTokens) {
    return Status::InvalidArgument("tokens " + std::to_string(load.tokens()) +
                                   " out of range (0, " + std::to_string(kMaxTokens) + "]");
  }
  if (load.peer_address().empty() || load.peer_address().size() > kMaxRequestIdBytes) {
    return Status::InvalidArgument("start_load needs the source kvd's address");
  }
  KV_RETURN_IF_ERROR(CheckBlocks(IdsOf(load.block_ids()), LayoutsOf(engine), load.tokens()));
  KV_RETURN_IF_ERROR(
      CheckDistinctBlocks({load.block_ids().data(), static_cast<size_t>(load.block_ids().size())}));
  const auto mode = load.mode() == proto::MODE_PULL ? proto::MODE_PULL : proto::MODE_PUSH;
  auto [it, created] = loads_.try_emplace(load.request_id());
  DestRequest& request = it->second;
  if (created) {
    request.id = load.request_id();
    request.instance = engine.instance;
    request.tp_size = engine.tp_size;
    request.layers = static_cast<int>(engine.regions.front()->layout.spec().layers);
    request.peer_address = load.peer_address();
    request.mode = mode;
    request.tokens = load.tokens();
    request.ready.assign(request.layers, false);
    request.deadline = Clock::now() + options_.lease;
    request.transfer_token = load.transfer_token().substr(0, 64);
  } else if (request.instance != engine.instance || request.peer_address != load.peer_address() ||
             request.tokens != load.tokens() || request.mode != mode) {
    return Status::InvalidArgument("request " + request.id +
                                   ": ranks disagree on the source, tokens or mode");
  }
  if (request.ranks.count(engine.tp_rank)) {
    return Status::AlreadyExists("request " + request.id + " already loading on rank " +
                                 std::to_string(engine.tp_rank));
  }
  if (request.state != DestRequest::State::kGathering) {
    return Status::AlreadyExists("request " + request.id + " was asked for without rank " +
                                 std::to_string(engine.tp_rank) +
                                 " (it connected to this kvd after the other ranks' start_load)");
  }
  request.ranks[engine.tp_rank] =
      LoadRank{engine.id, std::vector<int64_t>(load.block_ids().begin(), load.block_ids().end()),
               engine.regions};
  // Every rank of the instance this kvd serves: all tp_size of them, or this kvd's share where
  // the decode ranks sit behind several kvds (TP across hosts), each asking for its own.
  if (static_cast<int>(request.ranks.size()) >=
      std::min(request.tp_size, RanksHere(registry_.engines(), request.instance))) {
    gathered_.push_back(request.id);
  }
  return Status::Ok();
}

void Scheduler::RequestGathered() {
  std::vector<std::string> ids;
  ids.swap(gathered_);
  for (const std::string& id : ids) {
    auto it = loads_.find(id);
    if (it == loads_.end() || it->second.state != DestRequest::State::kGathering) continue;
    RequestLoad(it->second);
  }
}

void Scheduler::RequestLoad(DestRequest& request) {
  const std::optional<std::string> address = PeerAddressOf(request);
  if (!address) return;  // its name is being looked up, or the request failed
  auto peer_id = hooks_.peer_for(*address);
  if (!peer_id.ok()) {
    FinishDest(request.id, peer_id.status(), false);
    return;
  }
  request.peer_id = *peer_id;
  if (Status s = NewToken(&request.notice_token); !s.ok()) {
    FinishDest(request.id, s, false);
    return;
  }
  request.state = DestRequest::State::kRequested;
  Trace("request", request.id, -1);
  proto::PeerMessage message;
  proto::WantRequest* want = message.mutable_want();
  want->set_request_id(request.id);
  want->set_mode(request.mode);
  want->set_tokens(request.tokens);
  want->set_lease_ms(static_cast<uint32_t>(options_.lease.count()));
  want->set_transfer_token(request.transfer_token);
  want->set_notice_token(request.notice_token);
  want->set_tp_size(static_cast<uint32_t>(request.tp_size));
  for (const auto& [r, rank] : request.ranks) {
    proto::DestinationRank* wire = want->add_ranks();
    wire->set_tp_rank(r);
    for (const auto& region : rank.regions) {
      ToWire(region->layout.spec(), wire->add_regions());
      wire->add_descriptors(region->registration->packed_descriptor());
    }
    for (int64_t b : rank.blocks) wire->add_block_ids(b);
  }
  // Issue 19: granted now where the peer is ready, else as its queued Want leaves
  // (Core::PeerConnected).
  const Peer* peer = peers_.Find(request.peer_id);
  const bool ready = peer != nullptr && peer->ready;  // else Send queues it for the connection
  if (ready && !GrantWantWrites(request.peer_id, message)) return;
  peers_.Send(request.peer_id, std::move(message));
  // "request" to here is this kvd's own work on the Want (building it, the write grant, the
  // socket write); from here to the source's want_in, the network and the source's queue.
  if (ready) Trace("wanted", request.id, -1);
}

bool Scheduler::GrantWantWrites(uint64_t peer_id, const proto::PeerMessage& message) {
  if (!message.has_want() || !hooks_.grant_writes) return true;
  auto load = loads_.find(message.want().request_id());
  if (load == loads_.end() || load->second.write_grant != 0) return true;
  auto grant = hooks_.grant_writes(peer_id, load->second);
  if (!grant.ok()) {
    FinishDest(std::string(load->first), grant.status(), false);
    return false;
  }
  load->second.write_grant = *grant;
  return true;
}

std::optional<std::string> Scheduler::PeerAddressOf(DestRequest& request) {
  if (!membership::IsDaemonName(request.peer_address)) return request.peer_address;
  if (!request.resolved_address.empty()) return request.resolved_address;
  const std::string& name = request.peer_address;
  if (!resolver_) {
    FinishDest(request.id,
               Status::InvalidArgument("peer '" + name +
                                       "' is a daemon name (no ':'), and this kvd has no --etcd "
                                       "to resolve it: give HOST:PORT"),
               false);
    return std::nullopt;
  }
  if (auto cached = resolver_->Cached(name)) return *cached;
  if (request.resolving != 0) return std::nullopt;  // asked already
  const uint64_t ticket = request.resolving = next_ticket_++;
  resolver_->Resolve(name, [this, id = request.id, ticket](Result<std::string> address) {
    // The resolver's thread: back to the io thread, where the request may have ended since
    // (its lease, its engine gone), or a new one of the same id begun.
    boost::asio::post(io_, [this, id, ticket, address = std::move(address)] {
      auto it = loads_.find(id);
      if (it == loads_.end() || it->second.resolving != ticket) return;
      DestRequest& request = it->second;
      request.resolving = 0;
      if (!address.ok()) {
        FinishDest(id, address.status().WithContext("peer " + request.peer_address), false);
        return;
      }
      request.resolved_address = *address;
      RequestLoad(request);
    });
  });
  return std::nullopt;
}

void Scheduler::OnNotification(const std::string& message) {
  proto::LayerNotice notice;
  if (!notice.ParseFromString(message)) {
    spdlog::warn("kvd {}: dropped a malformed transport notification", options_.name);
    return;
  }
  auto it = loads_.find(notice.request_id());
  if (it == loads_.end()) return;  // failed or finished already: late news
  DestRequest& request = it->second;
  Peer* peer = peers_.Find(request.peer_id);
  const int begin = notice.layer();
  const int end = notice.layer_end() == 0 ? begin + 1 : notice.layer_end();
  // A source sends each layer once: a range that is empty, out of bounds or covers a layer in
  // place already is not its.
  if (peer == nullptr || peer->name != notice.source() || begin < 0 || end <= begin ||
      end > request.layers ||
      std::any_of(request.ready.begin() + begin, request.ready.begin() + end,
                  [](bool ready) { return ready; })) {
    return;
  }
  // Only the request's own source knows the token (it rode our WantRequest over the
  // authenticated control connection): a notice forged by another peer is ignored.
  if (!auth::Equal(request.notice_token, notice.notice_token())) {
    spdlog::warn("kvd {}: ignored a layer notice for {} without its token", options_.name,
                 request.id);
    return;
  }
  std::fill(request.ready.begin() + begin, request.ready.begin() + end, true);
  Trace("notice", request.id, end - 1);
  request.bytes += notice.bytes();
  request.runs += notice.runs();
  counters_.bytes_received += notice.bytes();
  proto::DaemonMessage ready;
  ready.mutable_layer_ready()->set_request_id(request.id);
  ready.mutable_layer_ready()->set_layer(begin);
  if (end - begin > 1) ready.mutable_layer_ready()->set_layer_end(end);
  for (const auto& [r, rank] : request.ranks) SendToEngine(rank.engine_id, ready);
  if (std::all_of(request.ready.begin(), request.ready.end(), [](bool b) { return b; })) {
    proto::PeerMessage confirm;
    confirm.mutable_confirm()->set_request_id(request.id);
    peers_.Send(request.peer_id, std::move(confirm));
    FinishDest(request.id, Status::Ok(), false);
  }
}

void Scheduler::FinishDest(std::string request_id, const Status& status, bool tell_peer) {
  auto it = loads_.find(request_id);
  if (it == loads_.end()) return;
  DestRequest request = std::move(it->second);
  loads_.erase(it);
  if (request.write_grant != 0 && hooks_.revoke_writes) {
    hooks_.revoke_writes(request.write_grant);  // write_grants.h
  }
  const bool requested = request.state == DestRequest::State::kRequested;
  if (tell_peer && !status.ok() && requested) {
    proto::PeerMessage fail;
    fail.mutable_fail()->set_request_id(request_id);
    ToWire(status, fail.mutable_fail()->mutable_error());
    peers_.Send(request.peer_id, std::move(fail));
  }
  if (!status.ok()) {
    spdlog::warn("kvd {}: load of {} failed: {}", options_.name, request_id, status.ToString());
    // The source may still have writes in flight into these regions: keep them mapped.
    if (requested) {
      Retired retired{{}, Clock::now() + options_.lease};
      for (const auto& [r, rank] : request.ranks) {
        retired.regions.insert(retired.regions.end(), rank.regions.begin(), rank.regions.end());
      }
      retired_.push_back(std::move(retired));
    }
  }
  (status.ok() ? counters_.transfers_done : counters_.transfers_failed)++;
  hooks_.dest_ended(request, status);
  auto done = RequestDoneMessage(request_id, /*sent=*/false, status, request.bytes, request.runs);
  for (const auto& [r, rank] : request.ranks) SendToEngine(rank.engine_id, done);
}

}  // namespace kv::daemon
