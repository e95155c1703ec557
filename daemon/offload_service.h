// OffloadService: kvd's CPU offload pool (daemon/offload/) as the daemon holds it.
//
// One per kvd, created at start and alive until shutdown; it has a pool when `--offload-bytes` is
// given. The pool belongs to the daemon, not to an engine, so an engine that restarts and
// registers again finds the blocks it stored before. The service answers the engine protocol's
// offload messages (Store, Lookup, Load); without a pool, with kUnsupported.
//
// Sizing. The memory is allocated (touched, and pinned with a GPU present) once, at start, so a
// machine that cannot give it fails kvd's start rather than an engine's first store, and no
// allocation ever runs on the io thread. The slot shape is not known then: the first offload
// request (store, lookup or load) fixes it from the region it names — layers, KV heads, tokens
// per block and content bytes, in that region's physical order. Requests from regions of
// another shape are rejected with kIncompatible naming both shapes; if that first shape does
// not fit one slot into the memory, the request fails and the next one tries again.
//
// Copies run on the pool's copy threads and their completions hop to the io thread, so no pool
// work blocks it; a GPU store's copy first waits in the event gate for the engine's event.
//
// Threading: io thread only (the engines it reads are the io thread's). The pool itself is
// thread-safe. Destruction waits for every accepted copy; completions it leaves posted to the io
// loop are for a loop that no longer runs.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "daemon/event_gate.h"
#include "daemon/offload/offload_pool.h"
#include "daemon/registry.h"
#include "layout/kv_region.h"
#include "protocol/kvd.pb.h"

namespace kv::daemon {

struct OffloadOptions {
  uint64_t capacity_bytes = 0;
  offload::DeviceCopy device_copy = offload::DeviceCopy::kAuto;
  offload::HostBufferOptions memory;
};

class OffloadService {
 public:
  // capacity_bytes > 0: allocates the pool's memory (errors as HostBuffer::Allocate reports
  // them). 0: no pool; every offload message is refused with kUnsupported once its own checks
  // passed. `kvd_name` names this kvd in that refusal. `io` takes the copies' completions,
  // `registry` is where their engines are found again, `gate` holds GPU stores until the
  // engine's event fired; all three outlive the service.
  static Result<std::unique_ptr<OffloadService>> Create(const OffloadOptions& options,
                                                        std::string kvd_name,
                                                        boost::asio::io_context& io,
                                                        Registry& registry, EventGate* gate);
  ~OffloadService();
  OffloadService(const OffloadService&) = delete;
  OffloadService& operator=(const OffloadService&) = delete;

  bool enabled() const { return options_.capacity_bytes > 0; }

  // The engine protocol's offload messages. The reply is the result; the copies' events
  // (LayerReady, RequestDone) reach the engine later, if it is still connected.
  Result<proto::OffloadResult> Store(Engine& engine, const proto::OffloadStore& m);
  Result<proto::OffloadResult> Lookup(Engine& engine, const proto::OffloadLookup& m);
  Result<proto::OffloadResult> Load(Engine& engine, const proto::OffloadLoad& m);

  proto::OffloadStatus Snapshot() const;

 private:
  struct Copy;

  OffloadService(const OffloadOptions& options, std::optional<offload::HostBuffer> memory,
                 std::string kvd_name, boost::asio::io_context& io, Registry& registry,
                 EventGate* gate);

  // The pool, created on first use with `region`'s block shape (see above).
  Result<offload::OffloadPool*> PoolFor(const KvRegion& region);
  // The engine's region `region_id`; kUnsupported without a pool.
  Result<std::shared_ptr<Region>> RegionOf(const Engine& engine, uint32_t region_id) const;
  // What a store and a load check before their copy (offload_service.cc).
  template <typename Message>
  Result<Copy> Prepare(Engine& engine, const Message& m);
  // On the io thread once a store or load completed: its last events go to the engine, if
  // it is still connected.
  void Completed(uint64_t engine_id, const std::vector<proto::DaemonMessage>& events);
  void SendToEngine(uint64_t engine_id, const proto::DaemonMessage& message);

  // Security issue 19: the pool answered any engine's lookups and loads, so tenant B loaded
  // tenant A's block by its hash. Keys are namespaced per engine instance: the pool holds
  // SHA-256(instance, key), so one instance can neither look up nor load another's keys (an
  // engine that restarts under its instance name still finds its own). `record` (stores)
  // remembers each pool key's instance and key, to report evictions back in the engine's terms.
  std::vector<offload::BlockKey> Namespaced(const std::string& instance,
                                            const std::vector<offload::BlockKey>& keys,
                                            bool record);
  // Of a store's evicted pool keys, the engine keys of `instance` (others' stay unnamed).
  std::vector<offload::BlockKey> EvictedOf(const std::string& instance,
                                           const std::vector<offload::BlockKey>& evicted);

  const OffloadOptions options_;
  const std::string kvd_name_;
  boost::asio::io_context& io_;
  Registry& registry_;
  EventGate* const gate_;
  std::optional<offload::HostBuffer> memory_;  // none without a pool; empty once the pool took it
  std::string shape_;
  std::unique_ptr<offload::OffloadPool> pool_;
  // Pool key bytes -> (instance, engine key), for keys stored and not yet evicted (io thread).
  std::unordered_map<std::string, std::pair<std::string, offload::BlockKey>> origins_;
};

// Limits of the offload messages.
inline constexpr int kMaxOffloadKeys = 16384;  // keeps a store's reply (evicted keys) small
// Per engine: bounds the copy queue one engine can build up.
inline constexpr int kMaxOffloadOpsInFlight = 1024;

}  // namespace kv::daemon
