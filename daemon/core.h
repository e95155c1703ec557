// Daemon::Core: the composition behind a Daemon, and the dispatch of its sessions. Private to
// daemon/. Its objects, each with its threading contract in its header: the engines and their
// regions (Registry, registry.h), the peer kvds (Peers, peers.h), the request state machines
// (Scheduler, scheduler.h), the outgoing copies (SendQueue, send_queue.h), the offload pool
// (OffloadService, offload_service.h), the event gate (event_gate.h) and the blocking setup
// steps (SetupWorker, setup_worker.h). The Core's own code: daemon.cc (lifecycle, listeners,
// status), engine_session.cc (the engine protocol), peer_session.cc (the peer protocol,
// heartbeats), gpu_regions.cc (posts behind the event gate), metrics_hooks.cc.
//
// Threading: everything here is touched only on the io thread, except what is marked otherwise.
// Transport completions, notifications and setup steps' results hop onto the io thread with
// asio::post.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "daemon/connection.h"
#include "daemon/daemon.h"
#include "daemon/event_gate.h"
#include "daemon/membership/peer_resolver.h"
#include "daemon/metrics/http_server.h"
#include "daemon/metrics/metrics.h"
#include "daemon/offload_service.h"
#include "daemon/peers.h"
#include "daemon/registry.h"
#include "daemon/scheduler.h"
#include "daemon/send_queue.h"
#include "daemon/setup_worker.h"
#include "daemon/transfer_support.h"

namespace kv::daemon {

// "HOST:PORT" with a numeric host (daemon.cc); `what` names the text in errors.
Result<boost::asio::ip::tcp::endpoint> ParseHostPort(const std::string& text,
                                                     const std::string& what);

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
  // Any thread: BuildStatus on the io thread, waited for up to `wait`; nullopt past it, or once
  // stopped.
  std::optional<proto::DaemonStatus> StatusFromIo(std::chrono::milliseconds wait);
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
  void OnPeerMessage(uint64_t peer_id, const std::string& body);
  void OnPeerClosed(uint64_t peer_id, const Status& why);
  // Checks the hello, then has the setup worker connect the transport (connect_endpoint);
  // PeerConnected makes the peer ready.
  Status HandlePeerHello(Peer& peer, const proto::PeerHello& hello);
  void PeerConnected(uint64_t peer_id, std::string name, int ranks,
                     Result<transport::PeerId> connected);
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
  // A Want naming regions of the peer not imported yet has the setup worker import them first
  // (held messages as for a hello), then hands it to the scheduler; refusals go back to the
  // peer as Fail.
  void HandleWant(Peer& peer, const proto::WantRequest& want);
  void RefuseWant(uint64_t peer_id, const proto::WantRequest& want, const Status& why);

  // ---- metrics_hooks.cc ----
  Status StartMetrics();        // with options_.metrics_listen: /metrics on its own thread
  std::string RenderMetrics();  // the metrics thread: a snapshot from the io thread, bounded
  void CountRequest(const SourceRequest& request, const Status& status);
  void CountRequest(const DestRequest& request, const Status& status);
  void CountLayer(const SendGroup::Part& part, const Status& status);

  // ---- daemon.cc: the objects' hooks ----
  SendQueue::Hooks SendQueueHooks();
  Scheduler::Hooks SchedulerHooks();

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
  // Made in Start, once the transport is: they live until the Core goes (a completion the
  // transport still reports as it shuts down counts into the send queue).
  std::unique_ptr<SendQueue> send_queue_;
  std::unique_ptr<Scheduler> scheduler_;
  // Outlives every engine session; destroyed before the transport (its copies hold regions).
  std::unique_ptr<OffloadService> offload_;
  // Batches and offload stores waiting for an engine's event (event_gate.h); the send queue's
  // notices go through it too. Destroyed first in Shutdown: what it holds names the transport,
  // the pool and regions.
  std::unique_ptr<EventGate> event_gate_;
  // Blocking setup steps off the io thread (setup_worker.h). Shut down right after the io
  // thread: what it still holds was made by the transport.
  std::unique_ptr<SetupWorker> setup_;

  uint64_t peers_refused_ = 0;
  uint64_t auth_failures_ = 0;
  uint64_t registrations_refused_ = 0;  // over max_registered_bytes (engine_session.cc)
  // EMFILE / ENFILE on accept: the acceptor waits this long before trying again.
  boost::asio::steady_timer accept_backoff_{io_};
  bool accept_starved_ = false;  // in an EMFILE episode: logged once
  metrics::Metrics metrics_;
  // Daemon names in start_load (options_.etcd_url); its callbacks post to io_.
  std::unique_ptr<membership::PeerResolver> resolver_;
  // Declared last, so destroyed first: its thread renders from the members above.
  std::unique_ptr<metrics::HttpServer> metrics_server_;
};

}  // namespace kv::daemon
