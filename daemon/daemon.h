// Daemon: kvd's core — control plane, region registry and transfer scheduler — as a library, so
// the same code serves the `kvd` executable and the connector's embedded mode.
//
// A Daemon owns one io_context thread for all control work and one Transport (with its own
// progress thread) for data. It listens on a unix socket for local engines (mode 0600, peer uid
// checked with SO_PEERCRED) and on TCP for peer daemons; engines can also be attached directly
// with AttachEngine() (embedded mode: a socketpair, the same protocol and code paths).
//
// Thread-safety: every public method may be called from any thread. Destroying the Daemon stops
// it (as Shutdown with a zero drain).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "protocol/kvd.pb.h"
#include "transport/transport.h"

namespace kv::daemon {

struct DaemonOptions {
  std::string name = "kvd";
  // "HOST:PORT" for peer daemons; port 0 picks a free one (see Daemon::listen_address()).
  // Empty: no TCP listener (this daemon only dials out).
  std::string listen = "127.0.0.1:0";
  std::string socket_path;  // empty: no unix listener (embedded use)
  // The data transport. Null: created from `transport_name` ("auto" = first available).
  std::unique_ptr<transport::Transport> transport;
  std::string transport_name = "auto";
  // Settings of that transport (`kvd --transport-opt KEY=VALUE`; transport.h, CheckSettings), after
  // those kvd derives itself: "device" for a backend with device_copies, UCX_NET_DEVICES for one
  // with ucx_config. Not used with `transport`.
  std::vector<std::pair<std::string, std::string>> transport_settings;
  // The io thread polls without sleeping (`kvd --busy-poll`): lower latency per message, one
  // core always busy.
  bool busy_poll = false;
  // CUDA ordinal of kvd's own GPU work: the GPU transports' copy stream ("device" setting of
  // cuda_ipc and nccl). Engines' GPU regions are opened on their own devices, found by UUID.
  int device = 0;
  uint32_t max_frame_bytes = 4u << 20;
  std::chrono::milliseconds lease{30000};  // how long a source holds a request's blocks
  std::chrono::milliseconds heartbeat_interval{1000};
  int missed_heartbeats = 5;  // then the peer is declared dead
  std::chrono::milliseconds handshake_timeout{5000};
  std::chrono::milliseconds partial_frame_timeout{5000};
  // CPU offload pool (daemon/offload_service.h): 0 for none. Allocated at Start.
  uint64_t offload_bytes = 0;
  std::string offload_copy = "auto";  // GPU pages: "auto", "kernel" or "copy-engine"

  // ---- Peer security (SECURITY.md) ----
  // The peers' shared secret, its bytes (32 to 4096; `kvd --auth-secret-file`): every peer
  // connection starts with a mutual HMAC challenge-response over it (daemon/peer_auth.h), and
  // nothing else is sent or accepted before the other side proved it. Empty: kvd accepts and
  // dials peers on loopback addresses only, unless insecure_peers.
  std::string auth_secret;
  bool insecure_peers = false;  // no secret, and peers from anywhere: a trusted network only
  // The ucx backend's UCX_NET_DEVICES: the network interfaces UCX may listen and send on. UCX's
  // tcp interface otherwise listens on every interface, whatever `listen` says. Empty: UCX's own
  // choice (its environment, else every device). `kvd` sets "lo" in loopback-only mode.
  std::string ucx_net_devices;
  // Whether a peer's WantRequest must carry the request's transfer token (TransferParams, from
  // the prefill engine's RequestFinished). A token that is present must always match. Required,
  // a decode kvd can only load a request its engine got the params of (vLLM's flow); optional,
  // a decode may also ask before the prefill finished (layer streaming, kvbench pd), and the
  // first authenticated peer to ask binds the request. Unset: required with an auth_secret
  // (peers on other hosts), optional without (loopback only). Either way a Want that presents a
  // token before any prefill rank finished the request (an engine-chosen token, the vLLM
  // connector's) waits for it within its lease (held_wants.cc).
  std::optional<bool> require_transfer_token;
  // Peer connections open at once; of them, not yet authenticated (the handshake timeout bounds
  // how long each may stay so); from one source address. A connection above a limit is closed
  // as it is accepted.
  int max_peer_connections = 256;
  int max_unauthenticated_peers = 32;
  int max_peer_connections_per_address = 32;
  // Requests held as a source at once (saved by engines or wanted by peers, until released), and
  // of them, bound to one destination peer: a peer's Want flood holds no more than that.
  int max_source_requests = 65536;
  int max_requests_per_peer = 16384;
  // Bytes the engines of one instance (all its TP ranks together) may have registered at once,
  // host and GPU regions alike: a registration past it is refused, naming the limit
  // (--max-registered-bytes; 1 TiB).
  uint64_t max_registered_bytes = uint64_t{1} << 40;
  // "HOST:PORT": serve Prometheus metrics at http://HOST:PORT/metrics (daemon/metrics/).
  std::string metrics_listen;
  // "http://HOST:PORT" of etcd: a start_load whose peer is a daemon name (no ':') instead of
  // HOST:PORT finds that kvd's address among etcd's members (daemon/membership/peer_resolver.h).
  // Empty: such loads fail. Registering this kvd there is membership.h's, not the Daemon's.
  std::string etcd_url;
};

class Daemon {
 public:
  // Binds the listeners, creates the transport and starts the io thread. Errors name what
  // failed (an address in use, a socket path that exists and is live, an unknown transport).
  static Result<std::shared_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  const std::string& name() const;
  std::string listen_address() const;  // "127.0.0.1:41234"; empty without a TCP listener
  std::string transport_name() const;

  // Embedded mode: serves an engine on `fd` (one end of a connected unix socketpair), as if it
  // had connected to the socket. Takes ownership of fd.
  Status AttachEngine(int fd);

  proto::DaemonStatus Snapshot() const;

  // Stops accepting, lets transfers in flight finish until `drain` passes, then closes every
  // connection and joins the io thread. Idempotent.
  void Shutdown(std::chrono::milliseconds drain = std::chrono::milliseconds(0));

  class Core;

 private:
  explicit Daemon(std::unique_ptr<Core> core);
  std::unique_ptr<Core> core_;
};

}  // namespace kv::daemon
