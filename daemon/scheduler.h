// Scheduler: kvd's request state machines, both sides of a transfer. The source side
// (transfers.cc) holds what the prefill engines saved and streams it to the destination kvds
// that want it; the destination side (destination.cc) gathers the decode ranks' loads, asks the
// source kvd and reports each layer as it lands. Failures fan out from scheduler.cc.
//
// Request states, source side (the kvd of the prefill engines):
//   kCollecting       engines save layers; the destination is not known yet
//   kStreaming        a destination known (WantRequest); each layer goes out once every
//                     prefill rank saved it (push) or once every rank finished the request
//                     (pull). Decode ranks behind several kvds (TP across hosts) make one
//                     destination per kvd, each wanting its share of the ranks
//   kAwaitingConfirm  every decode rank wanted, every layer posted to each destination and
//                     announced; blocks held until every destination confirms and every rank
//                     finished the request, or it fails, or the lease ends — then the engines
//                     hear RequestDone(sent)
// Destination side (the kvd of the decode engines):
//   kGathering        decode ranks call start_load; waits for every rank of the instance that
//                     this kvd serves (all tp_size of them, unless some are behind another kvd)
//   kRequested        WantRequest sent; LayerNotices arrive, each forwarded as LayerReady
//   (complete)        every layer in place: Confirm to the source, RequestDone(received)
// Failure anywhere ends the request on both sides with RequestDone carrying the error.
//
// Threading: io thread only (the engines and peers it reads are the io thread's). A daemon
// name's lookup completes on the resolver's thread and hops to the io thread (io_context).
// Errors: a handler's Status is the reply to the engine or the peer; a request that fails later
// ends with RequestDone (and Fail to its peers) carrying the error.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "daemon/daemon.h"
#include "daemon/membership/peer_resolver.h"
#include "daemon/peers.h"
#include "daemon/registry.h"
#include "daemon/send_queue.h"
#include "daemon/transfer_support.h"
#include "layout/kv_region.h"
#include "layout/plan.h"
#include "protocol/kvd.pb.h"

namespace kv::daemon {

struct SourceRank {
  uint64_t engine_id = 0;
  std::vector<int64_t> blocks;
  std::vector<bool> saved;  // per layer
  // Per layer: a save did not say the layer was already written (SaveLayer.written), so a GPU
  // copy of it waits for the engine's event of the layer. Host engines never say so: they have
  // no events, and their layers keep a send group each.
  std::vector<bool> recorded;
  bool finished = false;
};

struct DestinationRank {
  int tp_rank = 0;
  std::vector<KvRegion> layouts;
  std::vector<std::shared_ptr<transport::RemoteMemory>> remotes;  // shared with batches
  std::vector<int64_t> blocks;
};

// Tells apart two requests that had the same id one after the other (a router retrying a failed
// transfer under its id; kvbench pd's "req-N" run after run): a batch of the failed one can still
// complete seconds later, when the transport gives up on a dead peer's endpoint, and must not end
// its successor (tests/cluster: the first wave after a link outage failed at its lease).
inline uint64_t NextRequestGeneration() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// Layer 0's plan per (prefill rank, index into the destination's ranks, region), shifted to each
// layer pushed: a request is planned once, not once per layer. `source` is the region it was
// planned from; a rank whose engine registered anew is planned again.
struct LayerPlanOf {
  std::shared_ptr<Region> source;
  LayerPlan plan;
};

// One destination kvd of a source request: the decode ranks it wants (every rank, or its share
// where the decode instance's ranks sit behind several kvds) and what it was sent.
struct SourceDestination {
  uint64_t peer_id = 0;
  std::vector<DestinationRank> ranks;
  std::string notice_token;  // the destination's, echoed in every LayerNotice
  std::vector<bool> sent;    // per layer
  bool confirmed = false;    // the destination has every layer
  std::map<std::tuple<int, size_t, size_t>, LayerPlanOf> layer_plans;
};

struct SourceRequest {
  enum class State { kCollecting, kStreaming, kAwaitingConfirm };
  std::string id;
  uint64_t generation = NextRequestGeneration();
  State state = State::kCollecting;
  std::string instance;
  int tp_size = 1;
  int layers = 0;
  std::map<int, SourceRank> ranks;  // by prefill TP rank
  // From kStreaming: the first WantRequest fixes mode, tokens and the decode TP size; the
  // destinations' ranks are disjoint, and once they cover all destination_tp ranks no more come.
  proto::TransferMode mode = proto::MODE_PUSH;
  int64_t tokens = 0;
  int destination_tp = 0;
  std::vector<SourceDestination> destinations;
  int batches_in_flight = 0;
  uint64_t bytes = 0;
  uint64_t runs = 0;
  Clock::time_point deadline;
  // The request's capability (peer_auth.h): issued to the engine by RequestFinished, presented
  // by the destination's WantRequest (transfers.cc, OnWant).
  std::string token;
  // Transfer tokens (issue 19): the token is fixed once a RequestFinished handed it out or an
  // engine chose it there or earlier, with SetTransferToken (the vLLM connector's scheduler or a
  // router mints it; every rank must agree). A Want presenting a token before then is held
  // (held_wants.cc); once it is fixed, a Want presenting it streams at once.
  bool token_fixed = false;
  // Engines that fixed or checked the token with SetTransferToken before saving anything: they
  // hear the request's end (RequestDone) and fail it when they leave, as its ranks' engines do.
  std::vector<uint64_t> token_engines;
  Clock::time_point started = Clock::now();  // for kvd_request_seconds (metrics_hooks.cc)

  // Decode ranks some destination wants.
  int wanted_ranks() const {
    int n = 0;
    for (const auto& d : destinations) n += static_cast<int>(d.ranks.size());
    return n;
  }
  SourceDestination* destination_of(uint64_t peer_id) {
    for (auto& d : destinations) {
      if (d.peer_id == peer_id) return &d;
    }
    return nullptr;
  }
  // Released only once every decode rank was wanted, every destination confirmed and every
  // prefill rank called request_finished: the engine must not hear "sent" for a request it has
  // not finished, however fast the push was.
  bool releasable() const {
    if (destinations.empty() || wanted_ranks() < destination_tp) return false;
    for (const auto& d : destinations) {
      if (!d.confirmed) return false;
    }
    for (const auto& [r, rank] : ranks) {
      if (!rank.finished) return false;
    }
    return true;
  }
};

struct LoadRank {
  uint64_t engine_id = 0;
  std::vector<int64_t> blocks;
  std::vector<std::shared_ptr<Region>> regions;
};

struct DestRequest {
  enum class State { kGathering, kRequested };
  std::string id;
  State state = State::kGathering;
  std::string instance;
  int tp_size = 1;
  int layers = 0;
  std::string peer_address;  // HOST:PORT, or a daemon name (peer_resolver.h)
  // A daemon name's address: non-zero while it is looked up (the lookup's ticket), then the
  // address it resolved to (PeerAddressOf).
  uint64_t resolving = 0;
  std::string resolved_address;
  uint64_t peer_id = 0;
  proto::TransferMode mode = proto::MODE_PUSH;
  int64_t tokens = 0;
  std::map<int, LoadRank> ranks;  // by decode TP rank
  std::vector<bool> ready;        // per layer
  std::string transfer_token;     // from the engine's StartLoad, into the WantRequest
  std::string notice_token;       // ours, random: a LayerNotice must echo it
  uint64_t write_grant = 0;       // the source's writes into our blocks (write_grants.h)
  uint64_t bytes = 0;
  uint64_t runs = 0;
  Clock::time_point deadline;
  Clock::time_point started = Clock::now();  // for kvd_request_seconds (metrics_hooks.cc)
};

// A WantRequest that presented a transfer token before its request's token was fixed (the
// decode's Want overtook the prefill engines' RequestFinished): checked once it is, refused at
// `deadline` (held_wants.cc).
struct HeldWant {
  uint64_t peer_id = 0;
  proto::WantRequest want;
  size_t bytes = 0;  // the Want's size, counted in held_want_bytes_
  Clock::time_point deadline;
};

// Decode-side memory a failed request may still receive writes into until its lease ends.
struct Retired {
  std::vector<std::shared_ptr<Region>> regions;
  Clock::time_point until;
};

class Scheduler {
 public:
  // What the scheduler asks of the daemon; every hook runs on the io thread.
  struct Hooks {
    // The peer kvd at HOST:PORT `address`, dialed if this kvd has no connection to it.
    std::function<Result<uint64_t>(const std::string& address)> peer_for;
    // A request ended (metrics).
    std::function<void(const SourceRequest& request, const Status& status)> source_ended;
    std::function<void(const DestRequest& request, const Status& status)> dest_ended;
    // Issue 19 (write_grants.h): grant a load's source (peer_id, ready) writes into the load's
    // blocks; revoke them. Unset: no grants.
    std::function<Result<uint64_t>(uint64_t peer_id, const DestRequest& request)> grant_writes;
    std::function<void(uint64_t grant)> revoke_writes;
    // A held Want released (its token fixed): handled as if it arrived now, imports first.
    std::function<void(uint64_t peer_id, proto::WantRequest want)> handle_want;
    // A Want refused: the peer hears why.
    std::function<void(uint64_t peer_id, const proto::WantRequest& want, const Status& why)>
        refuse_want;
  };
  struct Counters {
    uint64_t transfers_done = 0;
    uint64_t transfers_failed = 0;
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
    uint64_t runs_sent = 0;
  };
  // Every reference outlives the scheduler; `resolver` may be null (no --etcd), `io` takes its
  // lookups' results. `plan_entries`: what the transport's batches may hold (plans are made for
  // it: transport::PlanEntriesFor).
  Scheduler(const DaemonOptions& options, std::string listen_address, Registry& registry,
            Peers& peers, SendQueue& send_queue, PlanEntries plan_entries,
            membership::PeerResolver* resolver, boost::asio::io_context& io, Hooks hooks);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // ---- source side (transfers.cc) ----
  Status SaveLayer(Engine& engine, const proto::SaveLayer& save);
  // A one-way save (or SetTransferToken: `call` names it) kvd refused: fails the request if it
  // is the engine's instance's (every rank and the destination hear it), and tells the engine
  // with RequestDone(sent) in any case.
  void FailSave(uint64_t engine_id, const std::string& request_id, const Status& why,
                const std::string& call = "save_layer");
  // Fixes the request's transfer token before the request finishes (held_wants.cc): creates the
  // request if no save or Want named it yet; the first engine of the instance fixes the token,
  // the others' must equal it. Wants held for the token are checked at once (a match streams
  // layers as they are saved). Errors (a token of another size, another token than the fixed
  // one, a request of another instance, no room): nothing changed; the caller fails the request
  // (FailSave), as for a refused save.
  Status SetTransferToken(Engine& engine, const proto::SetTransferToken& m);
  Result<proto::TransferParams> RequestFinished(Engine& engine, const proto::RequestFinished& m);
  // Every region of the Want imported: the peer's cache, else `fresh` (Core::HandleWant imports
  // the others first, off the io thread). Never blocks.
  using Imports = std::map<std::string, std::shared_ptr<transport::RemoteMemory>>;
  Status OnWant(Peer& peer, const proto::WantRequest& want, const Imports& fresh = {});
  void OnConfirm(Peer& peer, const std::string& request_id);
  // Posted batches of a request landed (or failed: the request ends).
  void OnBatchDone(const std::string& request_id, uint64_t generation, const Status& status,
                   uint64_t bytes);
  // The live source request of that id's generation (SendQueue::Hooks::generation_of).
  std::optional<uint64_t> GenerationOf(const std::string& request_id) const;

  // ---- destination side (destination.cc) ----
  // Checks a rank's load and adds it to its request. A request whose every rank is in is not
  // asked of its source here but by RequestGathered(), which the caller runs once it answered
  // the engine: an engine's start_loads (on a vLLM worker's forward path) returns without
  // waiting for this kvd to build and send a Want per request.
  Status StartLoad(Engine& engine, const proto::StartLoad& load);
  // Sends the Want of every request StartLoad completed since the last call (those still
  // gathering; a request that failed meanwhile is skipped).
  void RequestGathered();
  // A transport notification: a LayerNotice from a request's source.
  void OnNotification(const std::string& message);

  // ---- both (scheduler.cc; FinishSource in transfers.cc, FinishDest in destination.cc) ----
  void OnPeerFail(Peer& peer, const proto::Fail& fail);
  // request_id by value: callers pass the id held by the request these functions erase.
  // tell_peer: a failure is sent to every destination but `told` (the peer that reported it).
  void FinishSource(std::string request_id, const Status& status, bool tell_peer,
                    uint64_t told = 0);
  void FinishDest(std::string request_id, const Status& status, bool tell_peer);
  // Issue 19 (write_grants.h): as a Want in `message` leaves for the ready peer `peer_id`, its
  // request's source may write the request's blocks, until the request ends. False: granting
  // failed and the request with it; do not send the message.
  bool GrantWantWrites(uint64_t peer_id, const proto::PeerMessage& message);
  void FailRequestsOfEngine(uint64_t engine_id, const Status& why);
  void FailRequestsOfPeer(uint64_t peer_id, const Status& why);
  // Ends requests past their lease and drops retired memory past its own.
  void ExpireRequests(Clock::time_point now);
  // At shutdown, once the io thread stopped: drops every request, nobody told.
  void Clear();

  size_t requests_in_flight() const { return sources_.size() + loads_.size(); }
  int batches_in_flight() const;
  const Counters& counters() const { return counters_; }
  size_t wants_held() const { return held_wants_.size(); }

 private:
  Status NewToken(std::string* out);  // a random 128-bit capability
  // A new source request fits max_source_requests (a Want flood holds no more than that).
  Status CheckSourceRoom(const std::string& request_id) const;
  void PumpSource(SourceRequest& request);
  // Plans and posts layers [begin, end) for every (source rank, destination rank) pair sharing
  // a head, then announces each layer to the destination.
  Status SendLayers(SourceRequest& request, SourceDestination& destination, int begin, int end);
  void RequestLoad(DestRequest& request);
  // A message to a connected engine, dropped if it left.
  void SendToEngine(uint64_t engine_id, const proto::DaemonMessage& message);
  // The address a load's source is dialed at: its peer_address, or that daemon name's address
  // from resolver_ (cached, else looked up off this thread: then nullopt, and RequestLoad runs
  // again once it resolved). nullopt after failing the request (a name it cannot resolve).
  std::optional<std::string> PeerAddressOf(DestRequest& request);

  // ---- held_wants.cc (transfer tokens) ----
  // Holds `want` until its request's token is fixed; refused when the holding limits are full.
  Status HoldWant(Peer& peer, const proto::WantRequest& want);
  // Fixes `request`'s token to an engine's choice (RequestFinished.transfer_token) or checks it
  // against the fixed one; on a mismatch the request fails (every rank and destination hear it).
  Status FixEngineToken(SourceRequest& request, const std::string& token);
  // Runs the held Wants of `request_id` again now that its token is fixed (each accepted or
  // refused there). May end the request.
  void ReleaseHeldWants(const std::string& request_id);
  // Refuses the held Wants of `request_id` with `why` (its request failed), or of a peer gone.
  void DropHeldWants(const std::string& request_id, const Status& why);
  void DropHeldWantsOfPeer(uint64_t peer_id);
  void ExpireHeldWants(Clock::time_point now);

  const DaemonOptions& options_;
  const std::string listen_address_;
  Registry& registry_;
  Peers& peers_;
  SendQueue& send_queue_;
  const PlanEntries plan_entries_;
  membership::PeerResolver* const resolver_;
  boost::asio::io_context& io_;
  const Hooks hooks_;

  std::map<std::string, SourceRequest> sources_;
  std::map<std::string, DestRequest> loads_;
  std::vector<std::string> gathered_;  // StartLoad completed them; RequestGathered asks for them
  std::multimap<std::string, HeldWant> held_wants_;  // by request id
  size_t held_want_bytes_ = 0;
  std::vector<Retired> retired_;
  uint64_t next_ticket_ = 1;  // of daemon-name lookups
  Counters counters_;
};

}  // namespace kv::daemon
