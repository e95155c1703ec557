// OffloadService: kvd's CPU offload pool (daemon/offload/) as the daemon holds it.
//
// One per kvd, created at start when `--offload-bytes` is given, and alive until shutdown: it
// belongs to the daemon, not to an engine, so an engine that restarts and registers again finds
// the blocks it stored before.
//
// Sizing. The memory is allocated (touched, and pinned with a GPU present) once, at start, so a
// machine that cannot give it fails kvd's start rather than an engine's first store, and no
// allocation ever runs on the io thread. The slot shape is not known then: the first offload
// request (store, lookup or load) fixes it from the region it names — layers, KV heads, tokens
// per block and content bytes, in that region's physical order. Requests from regions of
// another shape are rejected with kIncompatible naming both shapes; if that first shape does
// not fit one slot into the memory, the request fails and the next one tries again.
//
// The engine-protocol handlers (OffloadStore, OffloadLookup, OffloadLoad) are Daemon::Core
// methods in offload_service.cc; copies run on the pool's copy threads and their completions
// hop to the io thread, so no pool work blocks it.
//
// Threading: PoolFor() and Snapshot() on the io thread. The pool itself is thread-safe.
// Destruction waits for every accepted copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/offload/offload_pool.h"
#include "protocol/kvd.pb.h"
#include "layout/kv_region.h"
#include "base/status.h"

namespace kv::daemon {

struct OffloadOptions {
  uint64_t capacity_bytes = 0;
  offload::DeviceCopy device_copy = offload::DeviceCopy::kAuto;
  offload::HostBufferOptions memory;
};

class OffloadService {
 public:
  // Allocates the pool's memory. kInvalidArgument for 0 bytes; allocation errors as
  // HostBuffer::Allocate reports them.
  static Result<std::unique_ptr<OffloadService>> Create(const OffloadOptions& options);
  ~OffloadService();
  OffloadService(const OffloadService&) = delete;
  OffloadService& operator=(const OffloadService&) = delete;

  // The pool, created on first use with `region`'s block shape (see above).
  Result<offload::OffloadPool*> PoolFor(const KvRegion& region);

  proto::OffloadStatus Snapshot() const;

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

 private:
  OffloadService(const OffloadOptions& options, offload::HostBuffer memory);

  const OffloadOptions options_;
  offload::HostBuffer memory_;  // empty once the pool took it
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
