// Daemon::Core: the state behind a Daemon. Private to daemon/; split over daemon.cc (lifecycle,
// listeners, status), engine_session.cc (the engine protocol), peer_session.cc (the peer
// protocol, heartbeats) and transfers.cc (the request state machines). Its engines and their
// regions are a Registry (registry.h), its peer kvds Peers (peers.h); the blocking setup steps
// (registrations, transport connects, imports) run on a SetupWorker (setup_worker.h).
//
// Threading: everything here is touched only on the io thread, except what is marked otherwise.
// Transport completions, notifications and setup steps' results hop onto the io thread with
// asio::post.
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
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "base/shared_memory.h"
#include "daemon/connection.h"
#include "daemon/daemon.h"
#include "daemon/event_gate.h"
#include "daemon/membership/peer_resolver.h"
#include "daemon/metrics/http_server.h"
#include "daemon/metrics/metrics.h"
#include "daemon/offload_service.h"
#include "daemon/peers.h"
#include "daemon/registry.h"
#include "daemon/setup_worker.h"
#include "gpu/ipc_memory.h"
#include "gpu/layer_events.h"
#include "layout/kv_region.h"
#include "layout/plan.h"

namespace kv::daemon {

using Clock = std::chrono::steady_clock;

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
  // engine chose it there (the vLLM connector's scheduler mints it; every rank must agree). A
  // Want presenting a token before then is held (held_wants.cc).
  bool token_fixed = false;
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

// Batches SendLayers planned during one pass of the io loop, merged where they share the
// source region, the destination region and the engine event they wait on, if any
// (send_queue.cc): the saves an engine sends back to back, one per request of a batched forward
// pass, become one post, not one per request and layer (each post costs the transport several
// CUDA calls, and the nccl backend a round of its protocol). Layers that wait on no event
// (written before they were saved) all share one group.
struct SendGroup {
  uint64_t engine_id = 0;
  std::shared_ptr<Region> source;
  std::shared_ptr<transport::RemoteMemory> remote;
  // The engine event a GPU source's copies wait on: its layer, or -1 for none.
  int event_layer = -1;
  Plan plan;  // every part's runs, planned straight into it
  struct Part {
    std::string request_id;
    int layer = 0;  // the last layer of the part's range
    uint64_t bytes = 0;
    Clock::time_point queued = Clock::now();  // for kvd_layer_seconds (metrics_hooks.cc)
    uint64_t generation = 0;                  // of the SourceRequest it belongs to
  };
  std::vector<Part> parts;
  Clock::time_point deadline = Clock::time_point::max();
};

// A LayerNotice waiting for the posts queued before it.
struct QueuedNotice {
  transport::PeerId peer = 0;
  std::string request_id;
  int layer = 0;
  std::string message;
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
  // address it resolved to (PeerAddressOf, peer_session.cc).
  uint64_t resolving = 0;
  std::string resolved_address;
  uint64_t peer_id = 0;
  proto::TransferMode mode = proto::MODE_PUSH;
  int64_t tokens = 0;
  std::map<int, LoadRank> ranks;  // by decode TP rank
  std::vector<bool> ready;        // per layer
  std::string transfer_token;     // from the engine's StartLoad, into the WantRequest
  std::string notice_token;       // ours, random: a LayerNotice must echo it
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

class Daemon::Core {
 public:
  explicit Core(DaemonOptions options);
  ~Core();

  Status Start();
  void Shutdown(std::chrono::milliseconds drain);
  Status AttachEngine(int fd);
  proto::DaemonStatus Snapshot();  // any thread: runs on the io thread and waits

  const std::string& name() const { return options_.name; }
  std::string listen_address() const { return listen_address_; }
  std::string transport_name() const;

  // ---- daemon.cc ----
  void AcceptEngines();
  void WarnWithoutMps() const;
  void AcceptPeers();
  void Sweep();
  proto::DaemonStatus BuildStatus() const;
  ConnectionLimits EngineLimits() const;
  ConnectionLimits PeerLimits() const;

  // ---- engine_session.cc ----
  void ServeEngine(int fd, bool check_credentials);
  void OnEngineMessage(uint64_t engine_id, const std::string& body);
  void OnEngineClosed(uint64_t engine_id, const Status& why);
  void ReplyToEngine(Engine& engine, uint64_t seq, const Status& status,
                     proto::Reply* payload = nullptr);
  void SendToEngine(uint64_t engine_id, const proto::DaemonMessage& message);
  Status HandleHello(Engine& engine, const proto::EngineHello& hello);
  // Host and GPU memory alike: validates the message and the fd beside it, then has the setup
  // worker open the memory (and a GPU engine's layer events, with its first region) and
  // register it with the transport (OpenRegion); RegisterDone replies to `seq` with the region
  // id. An error here is the reply (nothing was started).
  Status StartRegister(Engine& engine, uint64_t seq, const proto::RegisterRegion& reg);
  // The setup worker's thread: uses options_ and transport_ only.
  Result<OpenedRegion> OpenRegion(const proto::RegisterRegion& reg, const KvRegion& layout,
                                  UniqueFd fd, int first_device);
  void RegisterDone(uint64_t engine_id, uint64_t seq, Result<OpenedRegion> opened);
  // Queues `body` if a setup step of its sender is in flight (true), closing `conn` past
  // kMaxHeldBytes.
  bool Hold(HeldMessages& held, Connection& conn, const std::string& body);
  // After a setup step: handles the held messages in order, until one starts another step.
  void ReleaseEngine(uint64_t engine_id);
  void ReleasePeer(uint64_t peer_id);
  // Every load as StartLoad would take it, one result each. Takes the engine's id, not the
  // engine: a load's failure may close the engine (its send backlog overflows) mid-batch.
  Result<proto::LoadResults> StartLoads(uint64_t engine_id, const proto::StartLoads& batch);
  Engine* FindEngine(uint64_t id) { return registry_.Find(id); }

  // ---- gpu_regions.cc ----
  // Posts `batch` out of `engine`'s regions; for a GPU engine and an `event_layer` >= 0 the
  // batch first waits in the event gate for its event of that layer (the last layer moved).
  Status PostFromEngine(const Engine& engine, int event_layer, const transport::Batch& batch,
                        transport::Completion done);

  // ---- peer_session.cc ----
  // remote_ip: of an accepted connection (the per-address limit), empty for one we dialed.
  void ServePeer(int fd, std::string dialed_address, std::string remote_ip = {});
  Result<uint64_t> PeerFor(const std::string& address);
  // The address a load's source is dialed at: its peer_address, or that daemon name's address
  // from resolver_ (cached, else looked up off this thread: then nullopt, and RequestLoad runs
  // again once it resolved). nullopt after failing the request (a name it cannot resolve).
  std::optional<std::string> PeerAddressOf(DestRequest& request);
  void OnPeerMessage(uint64_t peer_id, const std::string& body);
  void OnPeerClosed(uint64_t peer_id, const Status& why);
  // Checks the hello, then has the setup worker connect the transport (connect_endpoint);
  // PeerConnected makes the peer ready.
  Status HandlePeerHello(Peer& peer, const proto::PeerHello& hello);
  void PeerConnected(uint64_t peer_id, std::string name, int ranks,
                     Result<transport::PeerId> connected);
  void SendToPeer(uint64_t peer_id, proto::PeerMessage message);
  proto::PeerHello BuildHello() const;
  // The peer's transport end and our hello: only once the peer is authenticated.
  void SendHello(Peer& peer);
  // Authentication messages before `peer.authenticated` (peer_session.cc); errors close.
  Status OnAuthMessage(Peer& peer, const proto::PeerMessage& m);
  // Sends PeerRefused with `why` (so the other side can tell its operator) and closes.
  void RefusePeer(Peer& peer, const Status& why);
  // Whether a new connection from `ip` fits the limits; counts the refusal if not.
  Status AdmitPeerConnection(const boost::asio::ip::address& ip);
  Peer* FindPeer(uint64_t id) { return peers_.Find(id); }

  // ---- transfers.cc ----
  Status NewToken(std::string* out);  // a random 128-bit capability
  // A new source request fits max_source_requests (a Want flood holds no more than that).
  Status CheckSourceRoom(const std::string& request_id) const;
  Status SaveLayer(Engine& engine, const proto::SaveLayer& save);
  // A one-way save kvd refused: fails the request if it is the engine's instance's (every rank
  // and the destination hear it), and tells the engine with RequestDone(sent) in any case.
  void FailSave(uint64_t engine_id, const std::string& request_id, const Status& why);
  Result<proto::TransferParams> RequestFinished(Engine& engine, const proto::RequestFinished& m);
  Status StartLoad(Engine& engine, const proto::StartLoad& load);
  // A Want naming regions of the peer not imported yet has the setup worker import them first
  // (held messages as for a hello); refusals go back to the peer as Fail.
  void HandleWant(Peer& peer, const proto::WantRequest& want);
  void RefuseWant(uint64_t peer_id, const proto::WantRequest& want, const Status& why);
  // Every region of the Want imported (the peer's cache, else `fresh`): never blocks.
  using Imports = std::map<std::string, std::shared_ptr<transport::RemoteMemory>>;
  Status OnWant(Peer& peer, const proto::WantRequest& want, const Imports& fresh = {});
  Result<std::shared_ptr<transport::RemoteMemory>> ImportRemote(Peer& peer,
                                                                const std::string& descriptor,
                                                                const Imports& fresh);
  void OnConfirm(Peer& peer, const std::string& request_id);

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
  void OnPeerFail(Peer& peer, const proto::Fail& fail);
  void OnNotification(const std::string& message);
  void PumpSource(SourceRequest& request);
  // Plans and posts layers [begin, end) for every (source rank, destination rank) pair sharing
  // a head, then announces each layer to the destination.
  Status SendLayers(SourceRequest& request, SourceDestination& destination, int begin, int end);
  void OnBatchDone(const std::string& request_id, uint64_t generation, const Status& status,
                   uint64_t bytes);

  // ---- send_queue.cc ----
  // Queues runs of `request_id` in the group it shares everything with: `append` plans them
  // into the group's plan (PlanTransfer and LayerPlan::AppendLayer leave it unchanged on
  // error). Returns the runs and bytes appended; nothing is queued when there are none. The
  // first queued item schedules FlushSends on the io loop, and FlushSendsIfDue may flush
  // earlier.
  struct Queued {
    uint64_t runs = 0;
    uint64_t bytes = 0;
  };
  Result<Queued> QueueSend(const Engine& engine, const std::shared_ptr<Region>& source,
                           const std::shared_ptr<transport::RemoteMemory>& remote, int layer,
                           bool wait_for_engine, const std::string& request_id,
                           Clock::time_point deadline, const std::function<Status(Plan*)>& append);
  void QueueNotice(transport::PeerId peer, const std::string& request_id, int layer,
                   std::string message);
  // Posts every queued group, then hands the transport every queued notice of a request still
  // alive: a request whose post failed has ended with that error, and its notices are dropped;
  // so are those of a request one of whose batches has completed with an error the io thread
  // has not handled yet (failed_sends_). A batch still moving when its notice is handed over is
  // the transport's to watch (cuda_ipc: transport/note_gate.h).
  void FlushSends();
  // Called after each message from an engine or a peer (never inside a handler, which may be
  // iterating over requests FlushSends can end). The scheduled flush runs only after every
  // handler queued before it: when an engine's save storm and a peer's wants arrive together,
  // the GPU idled ~2 ms per wave while the io loop worked through them with copies already
  // planned (kvbench pd --memory cuda, random ids, H200 pair). So queued copies also go out at
  // once when less than kLowWaterBytes of this kvd's posts are still moving: the link is about
  // to idle (random ids over cuda_ipc 0.61-0.67 -> 0.74 of the link with a 1 ms bound as well).
  // Flushing on a timer makes more, smaller posts: every 100 us, 23 per request instead of 5 and
  // 0.44 of the link; with the 1 ms bound, nccl (whose every batch costs a staged send and an
  // ack) fell from 0.65-0.70 to 0.56-0.58, so there is no timer.
  void FlushSendsIfDue();
  void ScheduleFlush();
  static constexpr uint64_t kLowWaterBytes = uint64_t{64} << 20;
  // Keeps a posted group's run vector for a later group (the transport copied the runs), within
  // kMaxSpareRunBytes: a wave of long requests fills megabytes of runs per group, and fresh
  // vectors that size cost page faults on every fill and an munmap on every free.
  void RecycleRuns(std::vector<Run> runs);
  void RequestLoad(DestRequest& request);
  // request_id by value: callers pass the id held by the request these functions erase.
  // tell_peer: a failure is sent to every destination but `told` (the peer that reported it).
  void FinishSource(std::string request_id, const Status& status, bool tell_peer,
                    uint64_t told = 0);
  void FinishDest(std::string request_id, const Status& status, bool tell_peer);
  void FailRequestsOfEngine(uint64_t engine_id, const Status& why);
  void FailRequestsOfPeer(uint64_t peer_id, const Status& why);
  void ExpireRequests(Clock::time_point now);

  // ---- offload_service.cc ----
  // The engine's region `region_id`, if this kvd has a pool; kUnsupported without one.
  Result<std::shared_ptr<Region>> OffloadRegion(Engine& engine, uint32_t region_id);
  Result<proto::OffloadResult> OffloadStore(Engine& engine, const proto::OffloadStore& m);
  Result<proto::OffloadResult> OffloadLookup(Engine& engine, const proto::OffloadLookup& m);
  Result<proto::OffloadResult> OffloadLoad(Engine& engine, const proto::OffloadLoad& m);
  // On the io thread once a store or load completed: its last events go to the engine, if
  // it is still connected.
  void OffloadCompleted(uint64_t engine_id, const std::vector<proto::DaemonMessage>& events);

  // ---- metrics_hooks.cc ----
  Status StartMetrics();        // with options_.metrics_listen: /metrics on its own thread
  std::string RenderMetrics();  // the metrics thread: a snapshot from the io thread, bounded
  void CountRequest(const SourceRequest& request, const Status& status);
  void CountRequest(const DestRequest& request, const Status& status);
  void CountLayer(const SendGroup::Part& part, const Status& status);

  DaemonOptions options_;
  boost::asio::io_context io_;
  std::unique_ptr<transport::Transport> transport_;
  std::optional<boost::asio::local::stream_protocol::acceptor> engine_acceptor_;
  std::optional<boost::asio::ip::tcp::acceptor> peer_acceptor_;
  boost::asio::steady_timer sweep_timer_;
  std::thread io_thread_;
  std::string listen_address_;
  Clock::time_point started_;
  std::atomic<bool> stopped_{false};
  bool draining_ = false;

  uint64_t next_id_ = 1;
  Registry registry_;
  Peers peers_;
  std::map<std::string, SourceRequest> sources_;
  std::map<std::string, DestRequest> loads_;
  std::multimap<std::string, HeldWant> held_wants_;  // by request id
  size_t held_want_bytes_ = 0;
  std::vector<Retired> retired_;
  std::vector<SendGroup> send_groups_;
  std::vector<std::vector<Run>> spare_runs_;  // empty, with capacity (RecycleRuns)
  size_t spare_run_bytes_ = 0;
  std::vector<QueuedNotice> send_notices_;
  bool flush_scheduled_ = false;
  // Of posts: bytes posted (io thread) and bytes whose completion the transport reported (its
  // thread: the io loop may be busy with a storm of saves when the link runs dry, and
  // FlushSendsIfDue must see that then). In flight: the difference.
  uint64_t bytes_posted_ = 0;
  std::atomic<uint64_t> bytes_landed_{0};
  // Requests a batch of which completed with an error, from the transport's thread until the io
  // thread has ended them (send_queue.cc), by id and generation (FailedSendKey).
  std::mutex failed_sends_mu_;
  std::unordered_set<std::string> failed_sends_;
  // Outlives every engine session; destroyed before the transport (its copies hold regions).
  std::unique_ptr<OffloadService> offload_;
  // Batches and offload stores waiting for an engine's event (event_gate.h); the send queue's
  // notices go through it too. Destroyed first in Shutdown: what it holds names the transport,
  // the pool and regions.
  std::unique_ptr<EventGate> event_gate_;
  // Blocking setup steps off the io thread (setup_worker.h). Shut down right after the io
  // thread: what it still holds was made by the transport.
  std::unique_ptr<SetupWorker> setup_;

  uint64_t transfers_done_ = 0;
  uint64_t transfers_failed_ = 0;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
  uint64_t runs_sent_ = 0;
  uint64_t batches_posted_ = 0;
  uint64_t peers_refused_ = 0;
  uint64_t auth_failures_ = 0;
  // EMFILE / ENFILE on accept: the acceptor waits this long before trying again.
  boost::asio::steady_timer accept_backoff_{io_};
  bool accept_starved_ = false;  // in an EMFILE episode: logged once
  metrics::Metrics metrics_;
  // Daemon names in start_load (options_.etcd_url); its callbacks post to io_.
  std::unique_ptr<membership::PeerResolver> resolver_;
  // Declared last, so destroyed first: its thread renders from the members above.
  std::unique_ptr<metrics::HttpServer> metrics_server_;
};

// Limits of the engine protocol, shared by validation in several files.
inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr int kMaxTpSize = 1024;
inline constexpr int kMaxRegionsPerEngine = 64;

// The per-layer timeline at debug level: "trace <us> <event> <request> <layer> <bytes>" on the
// steady clock, which every process on the host shares, so two kvds' lines merge into one
// timeline (tools/pd_timeline.py reads them).
void Trace(std::string_view event, const std::string& request, int layer, uint64_t bytes = 0);

// Limits of one transfer request (transfers.cc, destination.cc).
inline constexpr int64_t kMaxTokens = int64_t{1} << 24;
inline constexpr int kMaxBlocksPerRequest = 1 << 20;
// Block ids from an engine or a peer, checked against every region they will index, and enough of
// them for `tokens` (0: no token count to check). transfer_support.cc.
Status CheckBlocks(std::span<const int64_t> ids, const std::vector<const KvRegion*>& regions,
                   int64_t tokens);
// The layouts of an engine's registered regions, for CheckBlocks.
std::vector<const KvRegion*> LayoutsOf(const Engine& engine);
// Protobuf's repeated ids as a span.
inline std::span<const int64_t> IdsOf(const google::protobuf::RepeatedField<int64_t>& ids) {
  return {ids.data(), static_cast<size_t>(ids.size())};
}
// Destination block ids named twice (transfer_support.cc): refused, each would take two sources.
Status CheckDistinctBlocks(std::span<const int64_t> ids);

// An engine's or a peer's request id (transfers and offload ops): 1 to kMaxRequestIdBytes bytes.
Status CheckRequestId(const std::string& id);
// The RequestDone an engine hears when a transfer (sent: its source side) or an offload op ends.
proto::DaemonMessage RequestDoneMessage(const std::string& id, bool sent, const Status& status,
                                        uint64_t bytes, uint64_t runs);

}  // namespace kv::daemon
