// Connector: the engine side of kvd, shaped after the worker half of vLLM's KVConnectorBase_V1.
//
// One Connector per engine process and TP rank. It talks to its node's kvd over the unix socket
// (Open) or to a kvd core running inside this process (OpenEmbedded: same protocol, over a
// socketpair). Host KV caches are allocated by RegisterKvCaches in shared memory that kvd maps,
// so pages move without a copy through this process.
//
//   prefill rank:  RegisterKvCaches (host) or RegisterGpuKvCaches (cudaMalloc'ed)
//                  → per layer: (write K/V) → SaveLayer → RequestFinished
//   decode rank:   RegisterKvCaches → StartLoad (or StartLoads) → per layer: WaitLayer → (attend)
//   both:          GetFinished / GetFailedBlocks once per step
//   CPU offload:   OffloadStore → (op.Wait) ... OffloadLookup → OffloadLoad → op.WaitLayer / Wait
//
// Errors are values; every blocking call ends by the connector's timeout at the latest.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "daemon/offload/block_key.h"
#include "daemon/shared_memory.h"
#include "layout/kv_region.h"
#include "layout/status.h"
#include "transport/cuda_ipc/layer_events.h"

namespace kv::daemon {
class Daemon;
}

// Declared only, so that including this header does not pull protobuf into the engine's build;
// callers of DaemonStatus() / QueryDaemonStatus() include "daemon/proto/kvd.pb.h" themselves.
namespace kv::proto {
class DaemonStatus;
}

namespace kv::connector {

enum class Mode { kPush, kPull };

// What the decode side needs to load a request: returned by RequestFinished on the prefill side
// and handed over by the scheduler (as vLLM's kv_transfer_params).
struct TransferParams {
  std::string peer_name;     // the source kvd
  std::string peer_address;  // its TCP address, HOST:PORT
  std::string request_id;
  std::vector<int64_t> remote_block_ids;  // prefill rank 0's blocks (informational)
  int64_t tokens = 0;  // prompt tokens to move; the decode side knows its prompt length
  Mode mode = Mode::kPush;
  // The request's capability from the prefill kvd (security issue 19): pass it on unchanged.
  std::string transfer_token;
};

// The most loads one Connector::StartLoads may carry: kvd's bound, the engine protocol's
// MAX_LOADS_PER_CALL (daemon/proto/kvd.proto; connector.cc checks they agree).
inline constexpr size_t kMaxLoadsPerCall = 1024;

// One load of Connector::StartLoads.
struct LoadSpec {
  std::string request;
  TransferParams params;
  std::span<const int64_t> block_ids;  // local blocks; read during the call only
};

struct ConnectorOptions {
  std::string instance = "engine";  // engines of one TP group share it
  int tp_rank = 0;
  int tp_size = 1;
  std::chrono::milliseconds timeout{30000};  // bound of every blocking call
};

// One registered KV cache: `base` points at `bytes` bytes, valid while the Connector lives:
// shared host memory (RegisterKvCaches), or the engine's own device memory (RegisterGpuKvCaches).
struct KvCache {
  void* base = nullptr;
  uint64_t bytes = 0;
  KvRegion layout;
};

// A KV cache the engine allocated on a GPU itself: cudaMalloc (as vLLM does), or one CUDA VMM
// allocation (cuMemCreate + cuMemMap, e.g. PyTorch's expandable segments) created with
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its requestedHandleTypes; a cache must lie inside
// one such mapping. Stream-ordered pool memory (cudaMallocAsync) is refused.
struct GpuKvCache {
  void* base = nullptr;  // device pointer
  int device = 0;        // CUDA ordinal in this process
  LayoutSpec layout;     // region_bytes 0 = the strides' span
};

struct Finished {
  std::vector<std::string> sent;      // source side: blocks released, free to reuse
  std::vector<std::string> received;  // destination side: every layer in place
};

// ---- CPU offload (kvd --offload-bytes) ----------------------------------------------------------
//
// kvd's host pool keyed by the engine's block hash (offload::BlockKey: 8 to 32 bytes, e.g. vLLM's
// prefix block hash). The pool belongs to kvd: blocks stored by an engine that restarts are
// found by the engine that registers next with the same block shape. Stores and loads are
// asynchronous; their handles say when the bytes landed. Offload ops are never reported by
// GetFinished(); a load that fails reports its blocks through GetFailedBlocks() as well.
// Request ids starting "offload:" are reserved for them.

class Connector;

// An asynchronous store or load. Move-only; must not outlive its Connector. Dropping it before
// completion forgets the op: the copy still runs, its outcome is no longer reported.
class OffloadOp {
 public:
  OffloadOp() = default;
  OffloadOp(OffloadOp&& other) noexcept;
  OffloadOp& operator=(OffloadOp&& other) noexcept;
  OffloadOp(const OffloadOp&) = delete;
  OffloadOp& operator=(const OffloadOp&) = delete;
  ~OffloadOp();

  // Until the op's bytes landed (a store's in the pool, a load's in every layer of the engine's
  // blocks): OK, the copy's error, or kTimeout after the connector's timeout.
  Status Wait();
  // A load: until `layer` landed. Layer by layer with per_layer on a layer-first cache; all
  // layers at once otherwise. A store has one "layer", 0.
  Status WaitLayer(int layer);
  const std::string& id() const { return id_; }

 private:
  friend class Connector;
  OffloadOp(Connector* owner, std::string id, int last_layer)
      : owner_(owner), id_(std::move(id)), last_layer_(last_layer) {}
  void Forget();

  Connector* owner_ = nullptr;
  std::string id_;
  int last_layer_ = 0;
};

struct OffloadStored {
  OffloadOp op;
  size_t stored = 0;           // keys this store copies
  size_t already_present = 0;  // keys the pool held already (refreshed as recently used)
  std::vector<offload::BlockKey> evicted;  // keys dropped to make room
  uint64_t bytes = 0;
  size_t runs = 0;  // copies the plan needed
};

struct OffloadLoaded {
  OffloadOp op;
  uint64_t bytes = 0;
  size_t runs = 0;
  bool per_layer = false;  // layers land (and WaitLayer returns) one by one
};

enum class KeyState { kAbsent, kStoring, kReady };

struct MissingKey {
  size_t index = 0;  // into the load's keys
  KeyState state = KeyState::kAbsent;
};

class Connector {
 public:
  static Result<std::unique_ptr<Connector>> Open(const std::string& socket_path,
                                                 ConnectorOptions options);
  static Result<std::unique_ptr<Connector>> OpenEmbedded(std::shared_ptr<daemon::Daemon> daemon,
                                                         ConnectorOptions options);
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // Once, before anything else: allocates and registers one host region per layout.
  Result<std::vector<KvCache>> RegisterKvCaches(std::span<const LayoutSpec> layouts);

  // Once, instead of RegisterKvCaches (a connector registers host caches or GPU caches, not
  // both). kvd opens each cache through CUDA IPC (a VMM allocation: through its fd, passed over
  // kvd's socket) once and keeps it open until the engine leaves.
  // Also creates one interprocess CUDA event per layer and shares it with kvd, so kvd's copies of
  // a saved layer wait for the engine's writes (no host sync in the engine).
  // Returned KvCache.base is the engine's device pointer. Every cache must live on one device
  // and have the same layer count. kUnsupported in builds without CUDA, in embedded mode (CUDA
  // IPC cannot open memory of its own process), or when kvd's transport cannot reach GPU memory;
  // kInvalidArgument for a pointer that is not device memory of `device`.
  Result<std::vector<KvCache>> RegisterGpuKvCaches(std::span<const GpuKvCache> caches);

  // Prefill: `layer` of `request` is written in `block_ids`; kvd may send it now. For GPU caches
  // it first records the layer's event on `cuda_stream` (a cudaStream_t of the caches' device;
  // nullptr = the legacy default stream), after the work that writes the layer: kvd's copy waits
  // for that record (or, when the stream has already run everything it was
  // given, there is nothing to wait for: no record, and kvd copies at once). In pull mode kvd
  // moves every layer at once after the last layer's event, so record the layers in order on one
  // stream (as a forward pass does). Host caches ignore the stream.
  // One-way: it returns once kvd has the message, without waiting for kvd to act on it, so a
  // forward pass never waits on kvd. What it can check here (request id, layer, block ids against
  // the registered caches, an earlier failure of the request) it returns at once; a save kvd
  // refuses later (other blocks than before, a request of another instance) fails the request,
  // and RequestFinished returns that error.
  Status SaveLayer(const std::string& request, int layer, std::span<const int64_t> block_ids,
                   void* cuda_stream = nullptr);
  Result<TransferParams> RequestFinished(const std::string& request);

  // Decode: load `request` into `local_block_ids` (params.tokens tokens).
  Status StartLoad(const std::string& request, const TransferParams& params,
                   std::span<const int64_t> local_block_ids);
  // StartLoad for every load of `loads` (a scheduler step's) in one round trip to kvd: kvd
  // starts them in order and asks their sources for them at once. Returns, per load in order,
  // what StartLoad would have returned; one refused does not stop the others (request ids twice
  // in one batch: the second is refused). The call's own error means no load started: an empty
  // batch, more than kMaxLoadsPerCall, or StartLoad's errors of the call itself
  // (kTimeout, kUnavailable). Needs a kvd of protocol 3.
  Result<std::vector<Status>> StartLoads(std::span<const LoadSpec> loads);
  // Blocks until `layer` of `request` is in place (for GPU caches: kvd's copy completed on the
  // device, so work the engine enqueues afterwards sees the bytes): OK, the request's error, or
  // kTimeout.
  Status WaitLayer(const std::string& request, int layer);

  // Requests finished since the last call.
  Finished GetFinished();
  // Local blocks of loads that failed since the last call: their content is undefined.
  std::vector<int64_t> GetFailedBlocks();

  Result<proto::DaemonStatus> DaemonStatus();

  // CPU offload. `region` is the index of a cache RegisterKvCaches or RegisterGpuKvCaches
  // returned; keys[i] is the hash of the block in block_ids[i]. Errors: kUnsupported (kvd has no
  // pool), kInvalidArgument (a key outside 8..32 bytes, counts that differ, over 16384 keys),
  // kOutOfRange (block id, region), kIncompatible (the pool holds blocks of another shape: the
  // message names both).
  //
  // Store: copies the blocks of keys the pool lacks; the blocks must not change until the op
  // completes. kResourceExhausted when even eviction cannot make room (nothing is stored then);
  // evictions are reported in the result, never silent. GPU caches: the store first records the
  // last layer's event on `cuda_stream` (a cudaStream_t of the caches' device; nullptr = the
  // legacy default stream), after the work that wrote the blocks, and kvd's copy waits for that
  // record on the device, as SaveLayer's does. Host caches ignore the stream.
  Result<OffloadStored> OffloadStore(std::span<const offload::BlockKey> keys,
                                     std::span<const int64_t> block_ids, uint32_t region = 0,
                                     void* cuda_stream = nullptr);
  // How many leading keys are ready in the pool: the prefix the engine need not recompute.
  Result<size_t> OffloadLookup(std::span<const offload::BlockKey> keys, uint32_t region = 0);
  // Where each key stands; counts no hit or miss.
  Result<std::vector<KeyState>> OffloadProbe(std::span<const offload::BlockKey> keys,
                                             uint32_t region = 0);
  // Load: every key must be ready, else kNotFound naming each missing key, nothing written, and
  // `missing` (when given) lists them. per_layer: the engine will WaitLayer layer by layer. GPU
  // caches: kvd's copy does not wait for the engine's stream, so no work may still read or write
  // the target blocks; once WaitLayer / Wait returned, work the engine enqueues sees the bytes.
  Result<OffloadLoaded> OffloadLoad(std::span<const offload::BlockKey> keys,
                                    std::span<const int64_t> block_ids, bool per_layer = false,
                                    uint32_t region = 0,
                                    std::vector<MissingKey>* missing = nullptr);

  class Client;

 private:
  static Result<std::unique_ptr<Connector>> Connect(int fd, ConnectorOptions options,
                                                    std::shared_ptr<daemon::Daemon> embedded);
  Connector(std::unique_ptr<Client> client, std::shared_ptr<daemon::Daemon> embedded);
  friend class OffloadOp;
  Result<int> RegionLayers(uint32_t region) const;
  Status WaitOffload(const std::string& id, int layer);
  void ForgetOffload(const std::string& id);

  std::vector<int> region_layers_;  // layers of each registered cache; empty before registering
  int64_t region_blocks_ = 0;       // the fewest blocks of any registered cache
  std::atomic<uint64_t> next_offload_ = 1;
  std::mutex offload_mu_;  // taken before the client's lock, never after it
  // Ops a live handle names, and those of them GetFinished() took as done from the client
  // (the client then no longer knows them).
  std::set<std::string> live_offloads_, done_offloads_;

  std::shared_ptr<daemon::Daemon> embedded_;  // kept alive for the connector's lifetime
  std::vector<daemon::SharedMemory> memory_;  // this process's view of registered host regions
  // GPU caches: the per-layer events SaveLayer records. Set once by RegisterGpuKvCaches.
  std::unique_ptr<transport::gpu::LayerEvents> layer_events_;
  std::unique_ptr<Client> client_;  // destroyed first: no event arrives after it
};

// kvctl's view: asks the kvd at `socket_path` for its status without registering an engine.
Result<proto::DaemonStatus> QueryDaemonStatus(const std::string& socket_path,
                                              std::chrono::milliseconds timeout);

}  // namespace kv::connector
