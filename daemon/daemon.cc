#include "daemon/daemon.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <fstream>
#include <future>

#include "base/thread_name.h"
#include "daemon/core.h"
#include "daemon/peer_auth.h"
#include "daemon/write_grants.h"

namespace kv::daemon {

namespace asio = boost::asio;
using asio::ip::tcp;
using local = asio::local::stream_protocol;

Result<tcp::endpoint> ParseHostPort(const std::string& text, const std::string& what) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) {
    return Status::InvalidArgument(what + " '" + text + "' is not HOST:PORT");
  }
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(text.substr(0, colon), ec);
  if (ec) return Status::InvalidArgument(what + " '" + text + "': " + ec.message());
  int port = -1;
  try {
    port = std::stoi(text.substr(colon + 1));
  } catch (...) {
  }
  if (port < 0 || port > 65535) {
    return Status::InvalidArgument(what + " '" + text + "': port is not in [0, 65535]");
  }
  return tcp::endpoint(ip, static_cast<uint16_t>(port));
}

namespace {

uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// A socket file left by a dead kvd is removed; one a live kvd answers on is an error.
Status ClaimSocketPath(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::InvalidArgument("socket path '" + path + "' is longer than " +
                                   std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Status::Ok();
  if (!S_ISSOCK(st.st_mode)) {
    return Status::AlreadyExists("'" + path + "' exists and is not a socket");
  }
  asio::io_context probe_io;
  local::socket probe(probe_io);
  boost::system::error_code ec;
  probe.connect(local::endpoint(path), ec);
  if (!ec) return Status::AlreadyExists("a kvd already serves '" + path + "'");
  unlink(path.c_str());
  return Status::Ok();
}

}  // namespace

Daemon::Core::Core(DaemonOptions options)
    : options_(std::move(options)), sweep_timer_(io_), started_(Clock::now()) {}

Daemon::Core::~Core() {
  Shutdown(std::chrono::milliseconds(0));
}

std::string Daemon::Core::transport_name() const {
  return std::string(transport_->name());
}

ConnectionLimits Daemon::Core::EngineLimits() const {
  ConnectionLimits limits;
  limits.max_frame_bytes = options_.max_frame_bytes;
  // One per RegisterRegion of a memfd or a VMM allocation, claimed as the message is handled.
  limits.max_queued_fds = 1;
  limits.partial_frame_timeout = options_.partial_frame_timeout;
  return limits;
}

ConnectionLimits Daemon::Core::PeerLimits() const {
  ConnectionLimits limits;
  limits.max_frame_bytes = options_.max_frame_bytes;
  limits.partial_frame_timeout = options_.partial_frame_timeout;
  return limits;
}

Status Daemon::Core::Start() {
  if (!options_.auth_secret.empty()) KV_RETURN_IF_ERROR(auth::CheckSecret(options_.auth_secret));
  if (options_.max_peer_connections < 1 || options_.max_unauthenticated_peers < 1 ||
      options_.max_peer_connections_per_address < 1 || options_.max_source_requests < 1 ||
      options_.max_requests_per_peer < 1 || options_.max_registered_bytes < 1) {
    return Status::InvalidArgument("peer connection and request limits must be at least 1");
  }
  if (options_.transport) {
    transport_ = std::move(options_.transport);
  } else {
    KV_ASSIGN_OR_RETURN(transport::BackendInfo backend,
                        transport::DescribeTransport(options_.transport_name));
    transport::TransportOptions settings;
    // Backends whose copies run on a GPU take kvd's device; those that take UCX's configuration
    // its network devices. The others take neither.
    const bool on_gpu = backend.capabilities.device_copies;
    if (on_gpu) settings.settings.emplace_back("device", std::to_string(options_.device));
    if (backend.capabilities.ucx_config && !options_.ucx_net_devices.empty()) {
      settings.settings.emplace_back("UCX_NET_DEVICES", options_.ucx_net_devices);
    }
    settings.settings.insert(settings.settings.end(), options_.transport_settings.begin(),
                             options_.transport_settings.end());
    // A backend's own TCP side channel (nccl's unique ids) admits peers as the peer port does.
    settings.auth = {options_.auth_secret, options_.insecure_peers, options_.name};
    // The backend's own steps beside kvd's in the trace (tools/pd_timeline.py), by its batch
    // number: at debug level only, so the data path pays nothing otherwise.
    if (spdlog::should_log(spdlog::level::debug)) {
      settings.trace = [](std::string_view event, uint64_t id) {
        Trace(event, "batch-" + std::to_string(id), -1);
      };
    }
    KV_RETURN_IF_ERROR(transport::CheckSettings(backend.name, settings));
    KV_ASSIGN_OR_RETURN(transport_, transport::CreateTransport(backend.name, settings));
    if (on_gpu) WarnWithoutMps();
  }
  event_gate_ = std::make_unique<EventGate>(transport_.get());
  // Two threads: one stalled step (a peer that does not answer the transport's connect) leaves
  // the other to the rest; each engine and peer has at most one step in flight.
  setup_ = std::make_unique<SetupWorker>(io_, 2, kMaxSetupJobs);
  if (!options_.etcd_url.empty()) {
    membership::ResolverOptions resolver;
    resolver.etcd_url = options_.etcd_url;
    KV_ASSIGN_OR_RETURN(resolver_, membership::PeerResolver::Start(std::move(resolver)));
  }
  OffloadOptions offload;
  offload.capacity_bytes = options_.offload_bytes;
  if (options_.offload_bytes > 0) {
    KV_ASSIGN_OR_RETURN(offload.device_copy, offload::ParseDeviceCopy(options_.offload_copy));
  }
  // Before the io thread starts: touching (and pinning) the memory may take seconds.
  KV_ASSIGN_OR_RETURN(
      offload_, OffloadService::Create(offload, options_.name, io_, registry_, event_gate_.get()));
  transport_->set_notification_handler([this](std::string_view message) {
    asio::post(io_, [this, m = std::string(message)] { scheduler_->OnNotification(m); });
  });

  boost::system::error_code ec;
  if (!options_.listen.empty()) {
    KV_ASSIGN_OR_RETURN(tcp::endpoint endpoint, ParseHostPort(options_.listen, "address"));
    peer_acceptor_.emplace(io_);
    peer_acceptor_->open(endpoint.protocol(), ec);
    if (!ec) peer_acceptor_->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) peer_acceptor_->bind(endpoint, ec);
    if (!ec) peer_acceptor_->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status::IoError("listen on " + options_.listen + ": " + ec.message());
    auto bound = peer_acceptor_->local_endpoint();
    listen_address_ = bound.address().to_string() + ":" + std::to_string(bound.port());
  }
  if (!options_.socket_path.empty()) {
    KV_RETURN_IF_ERROR(ClaimSocketPath(options_.socket_path));
    engine_acceptor_.emplace(io_);
    engine_acceptor_->open(local(), ec);
    // Created 0600 from the start (umask), not chmod-ed after a window where others could connect.
    mode_t old_mask = umask(0177);
    if (!ec) engine_acceptor_->bind(local::endpoint(options_.socket_path), ec);
    umask(old_mask);
    if (!ec) engine_acceptor_->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status::IoError("listen on " + options_.socket_path + ": " + ec.message());
  }
  send_queue_ = std::make_unique<SendQueue>(io_, event_gate_.get(), SendQueueHooks());
  scheduler_ = std::make_unique<Scheduler>(options_, listen_address_, registry_, peers_,
                                           *send_queue_, transport::PlanEntriesFor(*transport_),
                                           resolver_.get(), io_, SchedulerHooks());
  if (peer_acceptor_) AcceptPeers();
  if (engine_acceptor_) AcceptEngines();
  Sweep();
  if (!options_.metrics_listen.empty()) KV_RETURN_IF_ERROR(StartMetrics());
  io_thread_ = std::thread([this] {
    NameThisThread("kvd-io");
    if (!options_.busy_poll) {
      io_.run();
      return;
    }
    // Ready handlers run as they come, and the reactor is asked without blocking in between.
    while (!io_.stopped()) io_.poll();
  });
  spdlog::info("kvd {}: peers on {}, engines on {}, transport {}", options_.name,
               listen_address_.empty() ? "-" : listen_address_,
               options_.socket_path.empty() ? "-" : options_.socket_path, transport_->name());
  if (!options_.auth_secret.empty()) {
    spdlog::info("kvd {}: peers must prove the shared secret (HMAC-SHA256 challenge-response)",
                 options_.name);
  } else if (options_.insecure_peers) {
    spdlog::warn(
        "kvd {}: INSECURE: no peer secret and --insecure: any host that reaches {} can read and "
        "write the engines' KV caches through this kvd. Use --auth-secret-file outside a test.",
        options_.name, listen_address_.empty() ? "the peer port" : listen_address_);
  } else {
    spdlog::info(
        "kvd {}: no --auth-secret-file: peers are accepted and dialed on loopback addresses "
        "only",
        options_.name);
  }
  return Status::Ok();
}

// Where engines compute on kvd's GPU, copy kernels in kvd's own context run only in its time
// slices unless MPS shares the GPU (ipc_memory.h): said once, at start, where an operator looks.
void Daemon::Core::WarnWithoutMps() const {
  auto shared = kv::gpu::SharedThroughMps(options_.device);
  if (!shared.ok()) {
    spdlog::info("kvd {}: could not tell whether GPU {} is shared through CUDA MPS: {}",
                 options_.name, options_.device, shared.status().ToString());
    return;
  }
  if (*shared) return;
  spdlog::warn(
      "kvd {}: GPU {} is not shared through CUDA MPS: while an engine computes on it, kvd's "
      "copies run only in kvd's time slices (another process's single CTA halved them in "
      "benchmarks/pd_gpu.md); start `nvidia-cuda-mps-control -d` before kvd and the engines",
      options_.name, options_.device);
}

void Daemon::Core::AcceptEngines() {
  engine_acceptor_->async_accept([this](const boost::system::error_code& ec, local::socket s) {
    if (ec == asio::error::operation_aborted || !engine_acceptor_->is_open()) return;
    if (!ec) ServeEngine(s.release(), /*check_credentials=*/true);
    AcceptEngines();
  });
}

void Daemon::Core::AcceptPeers() {
  peer_acceptor_->async_accept([this](const boost::system::error_code& ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !peer_acceptor_->is_open()) return;
    if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec.value() == ENOBUFS ||
        ec.value() == ENOMEM) {
      // Out of fds: accepting again at once would spin on the same error while the backlog
      // waits. Back off; the sweep closes silent connections meanwhile.
      if (!accept_starved_) {  // once per episode, not ten lines a second
        spdlog::warn(
            "kvd {}: accept: {}; pausing peer accepts 100 ms at a time until "
            "descriptors are free",
            options_.name, ec.message());
      }
      accept_starved_ = true;
      ++peers_refused_;
      accept_backoff_.expires_after(std::chrono::milliseconds(100));
      accept_backoff_.async_wait([this](const boost::system::error_code& wait_ec) {
        if (!wait_ec && peer_acceptor_->is_open()) AcceptPeers();
      });
      return;
    }
    if (!ec && accept_starved_) {
      accept_starved_ = false;
      spdlog::info("kvd {}: accepting peers again", options_.name);
    }
    if (!ec) {
      boost::system::error_code peer_ec;
      const tcp::endpoint remote = s.remote_endpoint(peer_ec);
      Status admitted = peer_ec ? Status::IoError("remote_endpoint: " + peer_ec.message())
                                : AdmitPeerConnection(remote.address());
      if (!admitted.ok()) {
        spdlog::warn("kvd {}: refused a peer connection: {}", options_.name, admitted.ToString());
        boost::system::error_code ignored;
        s.close(ignored);
      } else {
        s.set_option(tcp::no_delay(true));
        ServePeer(s.release(), "", remote.address().to_string());
      }
    }
    AcceptPeers();
  });
}

Status Daemon::Core::AdmitPeerConnection(const asio::ip::address& ip) {
  auto refuse = [this](Status why) {
    ++peers_refused_;
    return why;
  };
  const bool loopback = ip.is_loopback() ||
                        (ip.is_v6() && ip.to_v6().is_v4_mapped() &&
                         asio::ip::make_address_v4(asio::ip::v4_mapped, ip.to_v6()).is_loopback());
  if (options_.auth_secret.empty() && !options_.insecure_peers && !loopback) {
    return refuse(Status::Unavailable(
        "from " + ip.to_string() +
        ": without --auth-secret-file only loopback peers are accepted (--insecure opens it)"));
  }
  const std::string address = ip.to_string();
  int total = 0, unauthenticated = 0, same_address = 0;
  for (const auto& [id, peer] : peers_.all()) {
    if (!peer.conn) continue;
    ++total;
    // Of those others opened: this kvd's own dials still authenticating must not lock peers out.
    if (!peer.authenticated && !peer.dialed) ++unauthenticated;
    if (!peer.remote_ip.empty() && peer.remote_ip == address) ++same_address;
  }
  if (total >= options_.max_peer_connections) {
    return refuse(Status::ResourceExhausted(
        "from " + address + ": " + std::to_string(total) + " peer connections open, limit " +
        std::to_string(options_.max_peer_connections) + " (--max-peer-connections)"));
  }
  if (unauthenticated >= options_.max_unauthenticated_peers) {
    return refuse(Status::ResourceExhausted(
        "from " + address + ": " + std::to_string(unauthenticated) +
        " connections still authenticating, limit " +
        std::to_string(options_.max_unauthenticated_peers) + " (--max-unauthenticated-peers)"));
  }
  if (same_address >= options_.max_peer_connections_per_address) {
    return refuse(Status::ResourceExhausted(
        "from " + address + ": " + std::to_string(same_address) + " connections, limit " +
        std::to_string(options_.max_peer_connections_per_address) +
        " per address (--max-peer-connections-per-address)"));
  }
  return Status::Ok();
}

// Deadlines and heartbeats, a few times per heartbeat interval: idle kvd wakes rarely.
void Daemon::Core::Sweep() {
  const auto now = Clock::now();
  scheduler_->ExpireRequests(now);
  const auto silence = options_.heartbeat_interval * options_.missed_heartbeats;
  std::vector<uint64_t> dead;
  for (auto& [id, peer] : peers_.all()) {
    if (now - peer.last_heard > (peer.ready ? silence : options_.handshake_timeout)) {
      dead.push_back(id);
    } else if (peer.ready) {
      proto::PeerMessage beat;
      beat.mutable_heartbeat();
      (void)peer.conn->Send(beat);
    }
  }
  for (uint64_t id : dead) {
    Peer* peer = FindPeer(id);
    if (peer == nullptr) continue;
    if (peer->ready) metrics_.HeartbeatTimeout();
    if (!peer->conn) {
      boost::system::error_code ignored;
      peer->connecting->close(ignored);  // the dial's handler reports the failure
      continue;
    }
    peer->conn->Close(Status::Unavailable(
        "peer " + (peer->name.empty() ? peer->conn->label() : peer->name) + " silent for " +
        std::to_string(
            std::chrono::duration_cast<std::chrono::milliseconds>(now - peer->last_heard).count()) +
        " ms"));
  }
  sweep_timer_.expires_after(options_.heartbeat_interval / 2);
  sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Sweep();
  });
}

bool Daemon::Core::Hold(HeldMessages& held, Connection& conn, const std::string& body) {
  if (!held.busy) return false;
  if (held.bytes + body.size() > kMaxHeldBytes) {
    conn.Close(Status::ResourceExhausted(conn.label() + ": " + std::to_string(held.bytes) +
                                         " bytes of messages wait behind its setup step"));
    return true;
  }
  held.bytes += body.size();
  held.messages.push_back(body);
  return true;
}

Status Daemon::Core::AttachEngine(int fd) {
  if (stopped_) {
    close(fd);
    return Status::Unavailable("kvd " + options_.name + " is shut down");
  }
  asio::post(io_, [this, fd] { ServeEngine(fd, /*check_credentials=*/false); });
  return Status::Ok();
}

proto::DaemonStatus Daemon::Core::Snapshot() {
  if (stopped_ || !io_thread_.joinable()) return BuildStatus();
  if (auto status = StatusFromIo(std::chrono::seconds(5))) return *std::move(status);
  proto::DaemonStatus stale;
  stale.set_name(options_.name);
  return stale;
}

std::optional<proto::DaemonStatus> Daemon::Core::StatusFromIo(std::chrono::milliseconds wait) {
  if (stopped_) return std::nullopt;
  // Shared with the posted handler, which may outlive this wait if the io thread is slow.
  auto promise = std::make_shared<std::promise<proto::DaemonStatus>>();
  auto future = promise->get_future();
  asio::post(io_, [this, promise] { promise->set_value(BuildStatus()); });
  if (future.wait_for(wait) != std::future_status::ready) return std::nullopt;
  return future.get();
}

proto::DaemonStatus Daemon::Core::BuildStatus() const {
  proto::DaemonStatus s;
  s.set_name(options_.name);
  s.set_uptime_seconds(std::chrono::duration<double>(Clock::now() - started_).count());
  s.set_resident_bytes(ResidentBytes());
  s.set_transport(transport_ ? std::string(transport_->name()) : "");
  s.set_listen_address(listen_address_);
  for (const auto& [id, peer] : peers_.all()) {
    auto* p = s.add_peers();
    p->set_name(peer.name);
    p->set_address(peer.dialed_address.empty() ? peer.conn->label() : peer.dialed_address);
    p->set_state(peer.ready ? "ready" : peer.conn ? "handshake" : "connecting");
  }
  const Registry::Totals totals = registry_.totals();
  s.set_engines(totals.engines);
  s.set_regions(totals.regions);
  s.set_region_bytes(totals.region_bytes);
  if (scheduler_) {
    const Scheduler::Counters& counters = scheduler_->counters();
    s.set_transfers_in_flight(static_cast<uint32_t>(scheduler_->requests_in_flight()));
    s.set_transfers_done(counters.transfers_done);
    s.set_transfers_failed(counters.transfers_failed);
    s.set_bytes_sent(counters.bytes_sent);
    s.set_bytes_received(counters.bytes_received);
    s.set_runs_sent(counters.runs_sent);
    s.set_batches_posted(send_queue_->batches_posted());
    s.set_wants_held(static_cast<uint32_t>(scheduler_->wants_held()));
  }
  s.set_peer_auth(!options_.auth_secret.empty() ? "secret"
                  : options_.insecure_peers     ? "insecure"
                                                : "loopback-only");
  const Peers::Counts counts = peers_.counts();
  s.set_peer_connections(counts.connections);
  s.set_unauthenticated_connections(counts.unauthenticated);
  s.set_peers_refused(peers_refused_);
  s.set_auth_failures(auth_failures_);
  s.set_max_registered_bytes(options_.max_registered_bytes);
  s.set_registrations_refused(registrations_refused_);
  std::map<std::string, proto::InstanceBytes> instances;
  for (const auto& [id, engine] : registry_.engines()) {
    if (!engine.hello) continue;
    proto::InstanceBytes& i = instances[engine.instance];
    i.set_instance(engine.instance);
    i.set_engines(i.engines() + 1);
    for (const auto& region : engine.regions)
      i.set_registered_bytes(i.registered_bytes() + region->bytes);
  }
  for (auto& [name, i] : instances) *s.add_instances() = std::move(i);
  if (offload_ && offload_->enabled()) *s.mutable_offload() = offload_->Snapshot();
  return s;
}

void Daemon::Core::Shutdown(std::chrono::milliseconds drain) {
  if (stopped_.exchange(true)) return;
  if (io_thread_.joinable()) {
    // Shared with the io thread's handlers: they may still hold it if the wait below gives up.
    auto closed = std::make_shared<std::promise<void>>();
    asio::post(io_, [this, drain, closed] {
      draining_ = true;
      boost::system::error_code ignored;
      if (engine_acceptor_) engine_acceptor_->close(ignored);
      if (peer_acceptor_) peer_acceptor_->close(ignored);
      if (!options_.socket_path.empty()) unlink(options_.socket_path.c_str());
      // Drain: transfers already posted may finish; nothing new is accepted.
      auto until = Clock::now() + drain;
      auto timer = std::make_shared<asio::steady_timer>(io_);
      auto step = std::make_shared<std::function<void()>>();
      *step = [this, until, timer, step, closed] {
        if (scheduler_->batches_in_flight() > 0 && Clock::now() < until) {
          timer->expires_after(std::chrono::milliseconds(20));
          timer->async_wait([step](const boost::system::error_code&) { (*step)(); });
          return;
        }
        sweep_timer_.cancel();
        std::vector<std::shared_ptr<Connection>> conns;
        for (const auto& [id, e] : registry_.engines()) conns.push_back(e.conn);
        for (auto& [id, p] : peers_.all()) {
          if (p.conn) conns.push_back(p.conn);
        }
        for (auto& c : conns) c->Close(Status::Unavailable("kvd " + options_.name + " stopping"));
        // Clearing *step destroys this very lambda and its captures: keep what is used after.
        auto done = closed;
        *step = nullptr;  // breaks the self-reference
        done->set_value();
      };
      (*step)();
    });
    // The drain is bounded and the closing after it quick; should the io thread not get to them
    // (its run loop ended, or handlers keep it busy), shutdown stops it rather than wait forever.
    const auto limit = drain + std::chrono::seconds(5);
    if (closed->get_future().wait_for(limit) != std::future_status::ready) {
      spdlog::error("kvd {}: the io thread did not close within {} ms; stopping it", options_.name,
                    limit.count());
    }
    io_.stop();
    io_thread_.join();
  }
  // Waits for the steps running; what they made goes before the transport.
  if (setup_) setup_->Shutdown();
  // Fails what still waits for an engine's event (nothing of it started), before the pool and
  // the transport it would have gone to.
  event_gate_.reset();
  // Waits for the pool's copies; their completions release engine regions, which must happen
  // before the transport goes.
  offload_.reset();
  if (scheduler_) scheduler_->Clear();
  registry_.Clear();
  peers_.Clear();
  transport_.reset();
}

SendQueue::Hooks Daemon::Core::SendQueueHooks() {
  SendQueue::Hooks hooks;
  hooks.post = [this](uint64_t engine_id, int event_layer, const transport::Batch& batch,
                      transport::Completion done) {
    const Engine* engine = FindEngine(engine_id);
    if (engine == nullptr) return Status::Aborted("the prefill engine left");
    return PostFromEngine(*engine, event_layer, batch, std::move(done));
  };
  hooks.generation_of = [this](const std::string& id) { return scheduler_->GenerationOf(id); };
  hooks.fail = [this](const std::string& id, const Status& why) {
    scheduler_->FinishSource(id, why, /*tell_peer=*/true);
  };
  hooks.done = [this](const std::vector<SendGroup::Part>& parts, const Status& s) {
    for (const SendGroup::Part& part : parts) CountLayer(part, s);
    for (const SendGroup::Part& part : parts) {
      scheduler_->OnBatchDone(part.request_id, part.generation, s, part.bytes);
    }
  };
  return hooks;
}

Scheduler::Hooks Daemon::Core::SchedulerHooks() {
  Scheduler::Hooks hooks;
  hooks.peer_for = [this](const std::string& address) { return PeerFor(address); };
  hooks.source_ended = [this](const SourceRequest& r, const Status& s) { CountRequest(r, s); };
  hooks.dest_ended = [this](const DestRequest& r, const Status& s) { CountRequest(r, s); };
  // Issue 19 (write_grants.h).
  hooks.grant_writes = [this](uint64_t peer_id, const DestRequest& r) -> Result<uint64_t> {
    const Peer* peer = FindPeer(peer_id);
    if (peer == nullptr || !peer->ready) return Status::Unavailable("peer not ready");
    return GrantLoadWrites(*transport_, peer->transport_peer, r.ranks);
  };
  hooks.revoke_writes = [this](uint64_t grant) { transport_->revoke_writes(grant); };
  hooks.handle_want = [this](uint64_t peer_id, proto::WantRequest want) {
    Peer* peer = FindPeer(peer_id);
    if (peer == nullptr) return;
    if (!peer->held.busy) return HandleWant(*peer, want);  // imports cached when it was held
    // A setup step of this peer is in flight (a Want's imports): after it, in order.
    proto::PeerMessage m;
    *m.mutable_want() = std::move(want);
    std::string body = m.SerializeAsString();
    peer->held.bytes += body.size();
    peer->held.messages.push_back(std::move(body));
  };
  hooks.refuse_want = [this](uint64_t peer_id, const proto::WantRequest& want, const Status& why) {
    RefuseWant(peer_id, want, why);
  };
  return hooks;
}

// ---- Daemon ---------------------------------------------------------------------------------

Result<std::shared_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  auto core = std::make_unique<Core>(std::move(options));
  KV_RETURN_IF_ERROR(core->Start());
  return std::shared_ptr<Daemon>(new Daemon(std::move(core)));
}

Daemon::Daemon(std::unique_ptr<Core> core) : core_(std::move(core)) {}
Daemon::~Daemon() {
  core_->Shutdown(std::chrono::milliseconds(0));
}
const std::string& Daemon::name() const {
  return core_->name();
}
std::string Daemon::listen_address() const {
  return core_->listen_address();
}
std::string Daemon::transport_name() const {
  return core_->transport_name();
}
Status Daemon::AttachEngine(int fd) {
  return core_->AttachEngine(fd);
}
proto::DaemonStatus Daemon::Snapshot() const {
  return core_->Snapshot();
}
void Daemon::Shutdown(std::chrono::milliseconds drain) {
  core_->Shutdown(drain);
}

}  // namespace kv::daemon
