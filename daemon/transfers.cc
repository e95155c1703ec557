// The source (prefill) side of the Scheduler's request state machines (scheduler.h); the
// destination side is in destination.cc.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "daemon/peer_auth.h"
#include "daemon/scheduler.h"
#include "layout/plan.h"
#include "layout/rank_pairs.h"
#include "protocol/wire_layout.h"

namespace kv::daemon {

namespace {

// A region of the Want: the peer's import of it (Peers' cache), else the one just made.
Result<std::shared_ptr<transport::RemoteMemory>> ImportRemote(Peer& peer,
                                                              const std::string& descriptor,
                                                              const Scheduler::Imports& fresh) {
  if (auto cached = Peers::Imported(peer, descriptor)) return cached;
  auto made = fresh.find(descriptor);
  if (made == fresh.end()) {
    return Status::Internal("region descriptor was not imported before the Want");  // HandleWant
  }
  Peers::Remember(peer, descriptor, made->second);
  return made->second;
}

}  // namespace

Status Scheduler::SaveLayer(Engine& engine, const proto::SaveLayer& save) {
  KV_RETURN_IF_ERROR(CheckRequestId(save.request_id()));
  if (engine.regions.empty()) return Status::InvalidArgument("register_kv_caches first");
  const int layers = static_cast<int>(engine.regions.front()->layout.spec().layers);
  if (save.layer() < 0 || save.layer() >= layers) {
    return Status::OutOfRange("layer " + std::to_string(save.layer()) + " out of range [0, " +
                              std::to_string(layers) + ")");
  }
  // A rank's blocks are checked once, at its first save; a later save names the same ones or
  // none (engine protocol 7).
  const auto& ids = save.block_ids();
  auto held = sources_.find(save.request_id());
  const SourceRank* named = nullptr;
  if (held != sources_.end() && held->second.instance == engine.instance) {
    auto r = held->second.ranks.find(engine.tp_rank);
    if (r != held->second.ranks.end()) named = &r->second;
  }
  if (named != nullptr) {
    if (!ids.empty() &&
        !std::equal(ids.begin(), ids.end(), named->blocks.begin(), named->blocks.end())) {
      return Status::InvalidArgument("request " + save.request_id() +
                                     ": save_layer named other blocks than before");
    }
  } else {
    if (ids.empty()) {
      return Status::InvalidArgument(
          "request " + save.request_id() + " layer " + std::to_string(save.layer()) +
          ": a save without block ids continues a request, and this rank saved none of it (it "
          "finished, failed, or never started here)");
    }
    KV_RETURN_IF_ERROR(CheckBlocks(IdsOf(ids), LayoutsOf(engine), 0));
    // Only a new request takes room: a full table still serves the ones it holds.
    if (held == sources_.end()) KV_RETURN_IF_ERROR(CheckSourceRoom(save.request_id()));
  }
  auto [it, created] = sources_.try_emplace(save.request_id());
  SourceRequest& request = it->second;
  if (created) {
    request.id = save.request_id();
    request.deadline = Clock::now() + options_.lease;
    Status s = NewToken(&request.token);
    if (!s.ok()) {
      sources_.erase(it);
      return s;
    }
  }
  // A request the destination asked for first has no owner yet: the first saving engine's
  // instance takes it.
  if (request.instance.empty()) {
    request.instance = engine.instance;
    request.tp_size = engine.tp_size;
    request.layers = layers;
  } else if (request.instance != engine.instance) {
    return Status::AlreadyExists("request " + request.id + " belongs to instance " +
                                 request.instance);
  }
  auto [rank_it, new_rank] = request.ranks.try_emplace(engine.tp_rank);
  SourceRank& rank = rank_it->second;
  if (new_rank) {
    rank.engine_id = engine.id;
    rank.blocks.assign(ids.begin(), ids.end());
    rank.saved.assign(layers, false);
    rank.recorded.assign(layers, false);
  }
  rank.saved[save.layer()] = true;
  if (!save.written()) rank.recorded[save.layer()] = true;
  Trace("save", request.id, save.layer());
  PumpSource(request);
  return Status::Ok();
}

void Scheduler::FailSave(uint64_t engine_id, const std::string& request_id, const Status& why,
                         const std::string& call) {
  Engine* engine = registry_.Find(engine_id);
  if (engine == nullptr) return;
  const Status failure = why.WithContext(call + " of " + request_id);
  bool told = false;
  auto it = sources_.find(request_id);
  if (it != sources_.end() && it->second.instance == engine->instance) {
    for (const auto& [r, rank] : it->second.ranks) told = told || rank.engine_id == engine_id;
    for (uint64_t id : it->second.token_engines) told = told || id == engine_id;
    FinishSource(request_id, failure, /*tell_peer=*/true);
  }
  if (!told) {
    SendToEngine(engine_id, RequestDoneMessage(request_id, /*sent=*/true, failure, 0, 0));
  }
}

Result<proto::TransferParams> Scheduler::RequestFinished(Engine& engine,
                                                         const proto::RequestFinished& m) {
  KV_RETURN_IF_ERROR(CheckRequestId(m.request_id()));
  auto it = sources_.find(m.request_id());
  if (it == sources_.end() || it->second.instance != engine.instance ||
      !it->second.ranks.count(engine.tp_rank)) {
    return Status::NotFound("request " + m.request_id() + " has no saved layer on this rank");
  }
  // The engine's own token (the vLLM connector's scheduler mints it), fixed by the first
  // rank and checked for the others; else kvd's. Wants held for it are checked then.
  const bool newly_fixed = !it->second.token_fixed;
  if (!m.transfer_token().empty()) {
    KV_RETURN_IF_ERROR(FixEngineToken(it->second, m.transfer_token()));
  }
  it->second.token_fixed = true;
  SourceRank& rank = it->second.ranks[engine.tp_rank];
  rank.finished = true;
  proto::TransferParams params;
  params.set_peer_name(options_.name);
  params.set_peer_address(listen_address_);
  params.set_request_id(m.request_id());
  params.set_transfer_token(it->second.token);
  for (int64_t b : rank.blocks) params.add_remote_block_ids(b);
  if (newly_fixed && held_wants_.count(m.request_id()) > 0) {
    ReleaseHeldWants(m.request_id());  // may end the request
    it = sources_.find(m.request_id());
    if (it == sources_.end()) return params;
  }
  if (it->second.releasable()) {
    FinishSource(m.request_id(), Status::Ok(), /*tell_peer=*/false);
  } else {
    PumpSource(it->second);
  }
  return params;
}

Status Scheduler::OnWant(Peer& peer, const proto::WantRequest& want, const Imports& fresh) {
  KV_RETURN_IF_ERROR(CheckRequestId(want.request_id()));
  if (want.tokens() <= 0 || want.tokens() > kMaxTokens) {
    return Status::InvalidArgument("tokens " + std::to_string(want.tokens()) +
                                   " out of range (0, " + std::to_string(kMaxTokens) + "]");
  }
  // The decode TP size: every rank in one Want (0: an older kvd), or only the ranks behind the
  // asking kvd where the decode instance's ranks sit behind several.
  const int destination_tp =
      want.tp_size() > 0 ? static_cast<int>(std::min<uint32_t>(want.tp_size(), kMaxTpSize + 1))
                         : want.ranks_size();
  if (want.ranks_size() < 1 || want.ranks_size() > destination_tp || destination_tp > kMaxTpSize) {
    return Status::InvalidArgument("destination names " + std::to_string(want.ranks_size()) +
                                   " ranks of " + std::to_string(destination_tp));
  }
  std::vector<DestinationRank> destination;
  // Each decode rank at most once: SendLayers pairs ranks by their layouts' TP ranks.
  std::vector<bool> named(destination_tp, false);
  for (const auto& wire : want.ranks()) {
    if (wire.tp_rank() < 0 || wire.tp_rank() >= destination_tp || named[wire.tp_rank()]) {
      return Status::InvalidArgument("destination rank " + std::to_string(wire.tp_rank()) +
                                     " is out of range [0, " + std::to_string(destination_tp) +
                                     ") or named twice");
    }
    named[wire.tp_rank()] = true;
    if (wire.regions_size() < 1 || wire.regions_size() > kMaxRegionsPerEngine ||
        wire.descriptors_size() != wire.regions_size()) {
      return Status::InvalidArgument("destination rank " + std::to_string(wire.tp_rank()) +
                                     " has " + std::to_string(wire.regions_size()) +
                                     " regions and " + std::to_string(wire.descriptors_size()) +
                                     " descriptors");
    }
    DestinationRank rank;
    rank.tp_rank = wire.tp_rank();
    std::vector<const KvRegion*> layouts;
    for (int i = 0; i < wire.regions_size(); ++i) {
      KV_ASSIGN_OR_RETURN(KvRegion layout, FromWire(wire.regions(i)));
      rank.layouts.push_back(layout);
      KV_ASSIGN_OR_RETURN(auto remote, ImportRemote(peer, wire.descriptors(i), fresh));
      if (remote->length() < layout.span_bytes()) {
        return Status::OutOfRange("destination region of " + std::to_string(remote->length()) +
                                  " bytes cannot hold its layout's " +
                                  std::to_string(layout.span_bytes()) + " bytes");
      }
      rank.remotes.push_back(std::move(remote));
    }
    for (const auto& l : rank.layouts) layouts.push_back(&l);
    KV_RETURN_IF_ERROR(CheckBlocks(IdsOf(wire.block_ids()), layouts, want.tokens()));
    KV_RETURN_IF_ERROR(CheckDistinctBlocks(IdsOf(wire.block_ids())));
    rank.blocks.assign(wire.block_ids().begin(), wire.block_ids().end());
    destination.push_back(std::move(rank));
  }
  if (want.notice_token().size() > 64) {
    return Status::InvalidArgument("notice token of " + std::to_string(want.notice_token().size()) +
                                   " bytes");
  }
  // Capabilities, not ids (SECURITY.md): where tokens are required (daemon.h), only a Want that
  // presents the request's token may bind it to a destination; a token presented must match.
  // Compared in constant time; a refusal names no token. A token presented before the
  // request's is fixed (the decode's Want overtook the prefill engines' RequestFinished) is held
  // until it is, or until the Want's lease ends (held_wants.cc).
  auto existing = sources_.find(want.request_id());
  if (want.transfer_token().empty() &&
      options_.require_transfer_token.value_or(!options_.auth_secret.empty())) {
    return Status::InvalidArgument("request " + want.request_id() +
                                   ": the Want carries no transfer token, and this kvd requires "
                                   "one (--transfer-token required)");
  }
  if (!want.transfer_token().empty()) {
    if (existing == sources_.end() || !existing->second.token_fixed) return HoldWant(peer, want);
    if (!auth::Equal(existing->second.token, want.transfer_token())) {
      return Status::InvalidArgument("request " + want.request_id() +
                                     ": the transfer token does not match the one its prefill "
                                     "engines finished it with");
    }
  }
  if (existing == sources_.end()) KV_RETURN_IF_ERROR(CheckSourceRoom(want.request_id()));
  if (peer.requests >= options_.max_requests_per_peer) {
    return Status::ResourceExhausted("peer " + peer.name + " has " + std::to_string(peer.requests) +
                                     " requests in flight here, the limit");
  }
  auto [it, created] = sources_.try_emplace(want.request_id());
  SourceRequest& request = it->second;
  if (created) {
    Status s = NewToken(&request.token);
    if (!s.ok()) {
      sources_.erase(it);
      return s;
    }
  }
  // The destination's lease bounds how long this side holds the blocks, within our own limit.
  auto lease = options_.lease;
  if (want.lease_ms() > 0) lease = std::min(lease, std::chrono::milliseconds(want.lease_ms()));
  const auto mode = want.mode() == proto::MODE_PULL ? proto::MODE_PULL : proto::MODE_PUSH;
  if (created) {
    request.id = want.request_id();
    request.deadline = Clock::now() + lease;
  } else if (!request.destinations.empty()) {
    // Another kvd's share of the decode ranks (TP across hosts): the same request, the rest of
    // its ranks. Anything else is a second destination for ranks already served.
    if (request.destination_tp != destination_tp || request.mode != mode ||
        request.tokens != want.tokens()) {
      return Status::InvalidArgument("request " + request.id +
                                     ": destinations disagree on the decode TP size, mode or "
                                     "tokens");
    }
    for (const auto& d : request.destinations) {
      for (const auto& r : d.ranks) {
        if (named[r.tp_rank] || d.peer_id == peer.id) {
          return Status::AlreadyExists("request " + request.id + " already has a destination");
        }
      }
    }
  }
  Trace("want", want.request_id(), -1);
  request.state = SourceRequest::State::kStreaming;
  ++peer.requests;  // until FinishSource
  request.mode = mode;
  request.tokens = want.tokens();
  request.destination_tp = destination_tp;
  SourceDestination& to = request.destinations.emplace_back();
  to.peer_id = peer.id;
  to.ranks = std::move(destination);
  to.notice_token = want.notice_token();
  PumpSource(request);
  return Status::Ok();
}

void Scheduler::PumpSource(SourceRequest& request) {
  if (request.state != SourceRequest::State::kStreaming) return;
  if (static_cast<int>(request.ranks.size()) < request.tp_size || request.layers == 0) return;
  auto ready = [&](int l) {
    for (const auto& [r, rank] : request.ranks) {
      if (!rank.saved[l] || (request.mode == proto::MODE_PULL && !rank.finished)) return false;
    }
    return true;
  };
  // Pull moves the whole request once every layer is saved, as one range: SendLayers plans it
  // whole where that joins runs across layers (a blocks-first cache's one run per block range),
  // else layer by layer.
  if (request.mode == proto::MODE_PULL) {
    for (int l = 0; l < request.layers; ++l) {
      if (!ready(l)) return;
    }
  }
  bool all_sent = true;
  // By index: a destination wanted later (another kvd's ranks) is appended, never moved.
  for (size_t d = 0; d < request.destinations.size(); ++d) {
    SourceDestination& to = request.destinations[d];
    if (to.sent.empty()) to.sent.assign(request.layers, false);
    if (request.mode == proto::MODE_PULL) {
      if (to.sent.front()) continue;
      Status s = SendLayers(request, to, 0, request.layers);
      if (!s.ok()) {
        FinishSource(request.id, s.WithContext("request " + request.id), /*tell_peer=*/true);
        return;
      }
      to.sent.assign(request.layers, true);
      continue;
    }
    for (int l = 0; l < request.layers; ++l) {
      if (to.sent[l]) continue;
      if (!ready(l)) {
        all_sent = false;
        continue;
      }
      Status s = SendLayers(request, to, l, l + 1);
      if (!s.ok()) {
        FinishSource(request.id,
                     s.WithContext("request " + request.id + " layer " + std::to_string(l)),
                     /*tell_peer=*/true);
        return;
      }
      to.sent[l] = true;
      // An idle link copies this layer while the rest of the saved ones are planned.
      send_queue_.PostIfIdle();
    }
  }
  if (all_sent && request.wanted_ranks() == request.destination_tp) {
    request.state = SourceRequest::State::kAwaitingConfirm;
  }
}

Status Scheduler::SendLayers(SourceRequest& request, SourceDestination& to, int begin, int end) {
  Peer* peer = peers_.Find(to.peer_id);
  if (peer == nullptr || !peer->ready) return Status::Unavailable("destination peer is gone");
  uint64_t range_bytes = 0, range_runs = 0;
  for (const auto& [r, rank] : request.ranks) {
    Engine* engine = registry_.Find(rank.engine_id);
    if (engine == nullptr) return Status::Aborted("prefill rank " + std::to_string(r) + " left");
    for (size_t d = 0; d < to.ranks.size(); ++d) {
      const DestinationRank& dst = to.ranks[d];
      if (dst.layouts.size() != engine->regions.size()) {
        return Status::Incompatible("prefill rank has " + std::to_string(engine->regions.size()) +
                                    " regions, decode rank " + std::to_string(dst.tp_rank) +
                                    " has " + std::to_string(dst.layouts.size()));
      }
      for (size_t i = 0; i < dst.layouts.size(); ++i) {
        const std::shared_ptr<Region>& src = engine->regions[i];
        // Which source rank feeds which destination rank (layout/rank_pairs.h): every head slot
        // of the destination from exactly one rank that holds it (with MLA or replicated heads,
        // one copy of several); a pair that moves anything moves every head the two share.
        KV_ASSIGN_OR_RETURN(std::optional<RankPair> pair, PairOf(src->layout, dst.layouts[i]));
        if (!pair) continue;
        TransferSpec spec;
        spec.src_blocks = rank.blocks;
        spec.dst_blocks = dst.blocks;
        spec.tokens = request.tokens;
        spec.layer_begin = begin;
        spec.layer_end = end;
        auto& cached = to.layer_plans[{r, d, i}];
        if (cached.source != src) {
          KV_ASSIGN_OR_RETURN(cached.plan,
                              LayerPlan::Create(src->layout, dst.layouts[i], spec, plan_entries_));
          cached.source = src;
        }
        const LayerPlan& layer_plan = cached.plan;
        // A range (a pull) is planned whole only where that joins runs across layers (a
        // blocks-first request: one run per block). Elsewhere it goes layer by layer through
        // the cached plan: a compressed layer (groups or blocks: a layout or TP conversion that
        // cuts pages into rows) planned whole would be a run per row, a million for an
        // LBNHC -> BLHNC request; and a layers-first request's runs, the same either way, cost
        // ~4x more planned whole (kvbench plan pull_plan/*).
        const bool by_layer = end - begin == 1 || !layer_plan.layers_adjoin();
        auto append = [&](Plan* plan) {
          return by_layer ? layer_plan.AppendLayers(begin, end, plan)
                          : PlanTransfer(src->layout, dst.layouts[i], spec, plan);
        };
        // GPU sources wait for the engine's event of the range's last layer (a pull range: the
        // engine records its layers in order on one stream), unless no save of the range
        // recorded it: the engine's stream had run everything when it saved.
        const bool wait = std::any_of(rank.recorded.begin() + begin, rank.recorded.begin() + end,
                                      [](bool r) { return r; });
        KV_ASSIGN_OR_RETURN(
            SendQueue::Queued queued,
            send_queue_.Send(engine->id, src, dst.remotes[i], end - 1, wait, request.id,
                             request.generation, request.deadline, append));
        if (queued.runs == 0) continue;
        range_bytes += queued.bytes;
        range_runs += queued.runs;
        ++request.batches_in_flight;
      }
    }
  }
  request.bytes += range_bytes;
  request.runs += range_runs;
  counters_.runs_sent += range_runs;
  // One notice for the range, after every batch of it: the transport delivers it only once the
  // data posted before it has landed.
  proto::LayerNotice notice;
  notice.set_source(options_.name);
  notice.set_request_id(request.id);
  notice.set_layer(begin);
  if (end - begin > 1) notice.set_layer_end(end);
  notice.set_notice_token(to.notice_token);
  notice.set_bytes(range_bytes);
  notice.set_runs(range_runs);
  send_queue_.Notice(peer->transport_peer, request.id, end - 1, notice.SerializeAsString());
  return Status::Ok();
}

void Scheduler::OnBatchDone(const std::string& request_id, uint64_t generation,
                            const Status& status, uint64_t bytes) {
  if (status.ok()) counters_.bytes_sent += bytes;
  auto it = sources_.find(request_id);
  // Gone, or a later request under the same id (NextRequestGeneration): not this batch's.
  if (it == sources_.end() || it->second.generation != generation) return;
  --it->second.batches_in_flight;
  if (!status.ok()) FinishSource(request_id, status, /*tell_peer=*/true);
}

void Scheduler::OnConfirm(Peer& peer, const std::string& request_id) {
  auto it = sources_.find(request_id);
  if (it == sources_.end()) return;
  SourceDestination* to = it->second.destination_of(peer.id);
  if (to == nullptr) return;
  to->confirmed = true;
  if (it->second.releasable()) FinishSource(request_id, Status::Ok(), /*tell_peer=*/false);
}

void Scheduler::FinishSource(std::string request_id, const Status& status, bool tell_peer,
                             uint64_t told) {
  auto it = sources_.find(request_id);
  if (it == sources_.end()) return;
  SourceRequest request = std::move(it->second);
  sources_.erase(it);
  for (const SourceDestination& to : request.destinations) {
    if (Peer* peer = peers_.Find(to.peer_id); peer != nullptr) --peer->requests;
    if (tell_peer && !status.ok() && to.peer_id != told) {
      proto::PeerMessage fail;
      fail.mutable_fail()->set_request_id(request_id);
      ToWire(status, fail.mutable_fail()->mutable_error());
      peers_.Send(to.peer_id, std::move(fail));
    }
  }
  if (!status.ok()) {
    spdlog::warn("kvd {}: request {} failed: {}", options_.name, request_id, status.ToString());
  }
  (status.ok() ? counters_.transfers_done : counters_.transfers_failed)++;
  hooks_.source_ended(request, status);
  auto done = RequestDoneMessage(request_id, /*sent=*/true, status, request.bytes, request.runs);
  for (const auto& [r, rank] : request.ranks) SendToEngine(rank.engine_id, done);
  for (uint64_t id : request.token_engines) {
    const bool saved = std::any_of(request.ranks.begin(), request.ranks.end(),
                                   [id](const auto& rank) { return rank.second.engine_id == id; });
    if (!saved) SendToEngine(id, done);
  }
  if (!status.ok()) DropHeldWants(request_id, status);  // Wants held for its token
}

}  // namespace kv::daemon
