// kv::connector: the engine side of kvd, shaped after the worker half of vLLM's KVConnectorBase_V1.
// Public: installed as <kv/connector.h>, exported by libkvconnector.so (CMake: kvd::connector).
//
// One Connector per engine process and TP rank. It talks to its node's kvd over the unix socket
// (Open) or to a kvd core running inside this process (OpenEmbedded: same protocol, over a
// socketpair).
//
//   prefill rank:  RegisterKvCaches → [SetTransferToken] → per layer: (write K/V) → SaveLayer
//                  → RequestFinished
//   decode rank:   RegisterKvCaches → StartLoad (or StartLoads) → per layer: WaitLayer → (attend)
//   both:          GetFinished / GetFailedBlocks once per step
//   CPU offload:   OffloadStore → (op.Wait) ... OffloadLookup → OffloadLoad → op.WaitLayer / Wait
//
// Errors are values (kv::Status, <kv/status.h>); nothing throws. Every blocking call ends by the
// connector's timeout at the latest. Thread-safety: every method of a Connector may be called
// from any thread. Ownership: a Connector owns its connection to kvd and the host memory
// RegisterKvCaches allocated; it never owns memory the engine passed in.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/block_key.h"
#include "kv/export.h"
#include "kv/layout_spec.h"
#include "kv/status.h"

namespace kv::daemon {
class Daemon;  // opaque here: an embedded kvd core (StartEmbeddedDaemon)
}

namespace kv::connector {

// The library's version, "MAJOR.MINOR.PATCH" (the C API's kv_version()).
KV_EXPORT const char* Version();

// The longest request id, engine instance name, peer name or peer address, in bytes. Longer ones
// are refused with kInvalidArgument, never cut.
inline constexpr size_t kMaxIdBytes = 256;

enum class Mode { kPush, kPull };

// What the decode side needs to load a request: returned by RequestFinished on the prefill side
// and handed over by the scheduler (as vLLM's kv_transfer_params).
struct TransferParams {
  std::string peer_name{};  // the source kvd
  // Its TCP address, HOST:PORT; or its daemon name (kvd --name, no ':'), which the decode side's
  // kvd resolves through etcd when run with --etcd (a restarted source is found again).
  std::string peer_address{};
  std::string request_id{};
  std::vector<int64_t> remote_block_ids{};  // prefill rank 0's blocks (informational)
  int64_t tokens = 0;  // prompt tokens to move; the decode side knows its prompt length
  Mode mode = Mode::kPush;
  // The capability the source kvd issued for this request (raw bytes; empty from a kvd that
  // issues none). The decode side presents it; treat it as a secret.
  std::string transfer_token{};
};

// The sizes of a transfer token an engine chooses (Connector::SetTransferToken,
// Connector::RequestFinished), in bytes.
inline constexpr size_t kMinTransferTokenBytes = 16;
inline constexpr size_t kMaxTransferTokenBytes = 32;

// One request's blocks of Connector::SaveLayers.
struct SaveSpec {
  std::string request{};
  std::span<const int64_t> block_ids{};  // read during the call only
};

// The most loads one Connector::StartLoads may carry (kvd's bound).
inline constexpr size_t kMaxLoadsPerCall = 1024;

// The most requests one Connector::RequestsFinished may carry.
inline constexpr size_t kMaxFinishesPerCall = 1024;

// One request of Connector::RequestsFinished.
struct FinishSpec {
  std::string request{};
  std::string transfer_token{};  // the engine's (as RequestFinished's), or empty: kvd's own
};

// One load of Connector::StartLoads.
struct LoadSpec {
  std::string request{};
  TransferParams params;
  std::span<const int64_t> block_ids{};  // local blocks; read during the call only
};

struct ConnectorOptions {
  std::string instance = "engine";  // engines of one TP group share it
  int tp_rank = 0;
  int tp_size = 1;
  std::chrono::milliseconds timeout{30000};  // bound of every blocking call
  // Whose blocks in kvd's offload pool this engine stores and sees: empty means `instance`. Give
  // one name to every engine (and scheduler) that should share offloaded prefixes.
  std::string offload_namespace{};
  // The connection's reader thread spins on kvd's socket, and a call that waits for kvd (a reply,
  // WaitLayer) spins instead of sleeping: each hand-off from kvd to the engine then costs
  // microseconds, not a thread's wake-up (40-250 us on a VM). Costs a core for the reader
  // always, and the waiting thread's core while it waits. Pair with `kvd --busy-poll`.
  bool busy_poll = false;
};

// Where a KV cache's bytes live, and who allocated them.
//   host, base == nullptr:  kvd's connector allocates shared memory for it (returned in KvCache);
//   host, base != nullptr:  the cache lies inside memory from AllocateHostMemory (kvd maps that
//                           memory; ordinary malloc'ed memory it cannot reach: kInvalidArgument);
//   CUDA device N, base:    the engine's device memory: cudaMalloc, or one CUDA VMM allocation
//                           created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its
//                           requestedHandleTypes (cudaMallocAsync pool memory is refused).
struct KvCacheDesc {
  LayoutSpec layout;  // layout.region_bytes 0 = the strides' span
  MemoryLocation location = MemoryLocation::Host();
  void* base = nullptr;
};

// One registered KV cache: `base` points at `bytes` bytes laid out as `layout` (normalised: every
// stride filled in), valid while the Connector lives.
struct KvCache {
  void* base = nullptr;
  uint64_t bytes = 0;
  LayoutSpec layout;
  MemoryLocation location;
};

struct Finished {
  std::vector<std::string> sent;      // source side: blocks released, free to reuse
  std::vector<std::string> received;  // destination side: every layer in place
};

// Shared host memory kvd can map (a sealed memfd), page-aligned and zeroed: the memory an engine
// builds its host KV cache views on before registering them (KvCacheDesc with a host base).
// Thread-safe. Freed by FreeHostMemory; a cache registered inside it stays mapped by kvd until
// its Connector closes, but the engine must not use its own pointers after freeing.
KV_EXPORT Result<void*> AllocateHostMemory(uint64_t bytes);
// kNotFound for a pointer AllocateHostMemory did not return (or returned and was freed).
KV_EXPORT Status FreeHostMemory(void* base);

// ---- CPU offload (kvd --offload-bytes) ----------------------------------------------------------
//
// kvd's host pool keyed by the engine's block hash (offload::BlockKey: 8 to 32 bytes, e.g. vLLM's
// prefix block hash). The pool belongs to kvd: blocks stored by an engine that restarts are
// found by the engine that registers next with the same block shape. Stores and loads are
// asynchronous; their handles say when the bytes landed. Offload ops are never reported by
// GetFinished(); a load that fails reports its blocks through GetFailedBlocks() as well.
// Request ids starting "offload:" are reserved for them.

class ConnectorCore;  // the implementation, internal to the library

// An asynchronous store or load. Move-only; must not outlive its Connector. Dropping it before
// completion forgets the op: the copy still runs, its outcome is no longer reported.
class KV_EXPORT OffloadOp {
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
  friend class ConnectorCore;
  OffloadOp(ConnectorCore* owner, std::string id, int last_layer)
      : owner_(owner), id_(std::move(id)), last_layer_(last_layer) {}
  void Forget();

  ConnectorCore* owner_ = nullptr;
  std::string id_{};
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

// An embedded kvd core (kvd's flags of the same names); see StartEmbeddedDaemon.
struct EmbeddedDaemonOptions {
  std::string name = "kvd";
  std::string listen = "127.0.0.1:0";  // peers' TCP address; port 0 picks a free one
  std::string transport = "auto";      // "auto", "ucx" or "local"
  uint64_t offload_bytes = 0;          // CPU offload pool; 0: none
  // Peers prove this secret file (0600, 32+ bytes; kvd --auth-secret-file) before anything else.
  // Empty: peers on loopback only, unless insecure_peers (kvd --insecure). See SECURITY.md.
  std::string auth_secret_file{};
  bool insecure_peers = false;
};

// Starts a kvd core inside this process, for OpenEmbedded. It stops when the last shared_ptr to
// it (the caller's and every connector's) is gone.
KV_EXPORT Result<std::shared_ptr<daemon::Daemon>> StartEmbeddedDaemon(
    const EmbeddedDaemonOptions& options);
// The TCP address peers reach an embedded daemon on ("127.0.0.1:41234").
KV_EXPORT std::string EmbeddedDaemonAddress(const daemon::Daemon& daemon);

class KV_EXPORT Connector {
 public:
  static Result<std::unique_ptr<Connector>> Open(const std::string& socket_path,
                                                 ConnectorOptions options);
  static Result<std::unique_ptr<Connector>> OpenEmbedded(std::shared_ptr<daemon::Daemon> daemon,
                                                         ConnectorOptions options);
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // Once, before anything else: registers every cache (see KvCacheDesc for where its bytes may
  // live). Host and GPU caches do not mix in one connector; every GPU cache lives on one device
  // and has the same layer count. kvd opens GPU caches through CUDA IPC (a VMM allocation:
  // through its fd, passed over kvd's socket) once and keeps them open until the engine leaves,
  // and shares one interprocess CUDA event per layer with kvd, so kvd's copies of a saved layer
  // wait for the engine's writes (no host sync in the engine).
  // Errors: kAlreadyExists (registered before), kInvalidArgument (a layout, a base outside
  // AllocateHostMemory's memory, a pointer that is not device memory of its device, mixed
  // kinds), kOutOfRange (the layout reaches past the memory), kUnsupported (GPU caches in a build
  // without CUDA, in embedded mode, or with a kvd whose transport cannot reach GPU memory).
  Result<std::vector<KvCache>> RegisterKvCaches(std::span<const KvCacheDesc> caches);

  // Prefill: `layer` of `request` is written in `block_ids`; kvd may send it now. For GPU caches
  // it first records the layer's event on `cuda_stream` (a cudaStream_t of the caches' device;
  // nullptr = the legacy default stream), after the work that writes the layer; kvd's copy starts
  // once that record fired. In pull mode kvd moves every layer at once after the last layer's
  // event, so record the layers in order on one stream. Host caches ignore the stream.
  // One-way: it returns once kvd has the message. What it can check here (request id, layer,
  // block ids against the registered caches, an earlier failure of the request) it returns at
  // once; a save kvd refuses later fails the request, and RequestFinished returns that error.
  // Every save of a request names the same blocks (other ones fail it); only the first, and any
  // that differs from the last, carries them to kvd, so a request's later layers cost no ids.
  Status SaveLayer(const std::string& request, int layer, std::span<const int64_t> block_ids,
                   void* cuda_stream = nullptr);
  // SaveLayer of one layer for every request of a step in one call (an engine's forward pass
  // saves a layer of all its running requests at once): the event is recorded once, then the
  // saves go out in one write (kvd takes them in one wake-up). Returns, per save in order, what
  // SaveLayer would have (a failed write: its error for every save that was to go out);
  // one refused does not stop the others. The call's own error: no saves, a layer out of
  // range, or a failed event record.
  Result<std::vector<Status>> SaveLayers(int layer, std::span<const SaveSpec> saves,
                                         void* cuda_stream = nullptr);
  // Prefill: fixes `request`'s transfer token (kMinTransferTokenBytes to kMaxTransferTokenBytes
  // from a CSPRNG) before the request finishes, for a router or engine that knows the request
  // when its prefill starts and hands the token to the decode side then: a decode kvd's Want that
  // presents it is served at once, so layers stream while the prefill still runs, with tokens
  // required. Call it on every rank before (or after) the request's first SaveLayer and before
  // RequestFinished; the first rank fixes it, every other call must pass the same token, and
  // RequestFinished may then pass it again or none (it returns the fixed one). A separate call,
  // not an argument of SaveLayer: it serves SaveLayer and SaveLayers alike and may come before
  // the first layer is written. One-way, as SaveLayer: it returns once kvd has the message; it
  // checks the token's size and the request id here (kInvalidArgument) and returns an earlier
  // failure of the request. A token kvd refuses later (another one than the fixed token, a
  // request of another instance) fails the request: every rank and destination hear it, and
  // RequestFinished returns that error.
  Status SetTransferToken(const std::string& request, const std::string& transfer_token);
  // Prefill: the request is done on this rank; returns what the decode side loads it with, its
  // transfer_token being kvd's random capability for the request (or the one SetTransferToken
  // fixed).
  Result<TransferParams> RequestFinished(const std::string& request);
  // RequestFinished with a transfer token the engine chose itself (kMinTransferTokenBytes to
  // kMaxTransferTokenBytes from a CSPRNG): for engines whose scheduler hands the transfer params
  // to the decode side before the ranks finish the request in kvd (vLLM: the scheduler's
  // request_finished). Every rank of the instance must pass the same token, else the request
  // fails; a decode kvd's Want that presents it before then waits for it (within its lease).
  // kInvalidArgument for a token of another size; kIncompatible from a kvd too old to take it.
  Result<TransferParams> RequestFinished(const std::string& request,
                                         const std::string& transfer_token);

  // RequestFinished for every request of `finishes` (a step's, or a wave's) in one round trip to
  // kvd, where calling it per request costs a round trip each: a pull's decode side starts only
  // once the prefill finished, so those round trips add up on its clock. Returns, per request in
  // order, what RequestFinished would have returned (kInvalidArgument for a bad id or token,
  // the request's own errors); one failing does not stop the others. The call's own error means
  // nothing was sent: an empty batch or more than kMaxFinishesPerCall.
  Result<std::vector<Result<TransferParams>>> RequestsFinished(
      std::span<const FinishSpec> finishes);

  // Decode: load `request` into `local_block_ids` (params.tokens tokens).
  Status StartLoad(const std::string& request, const TransferParams& params,
                   std::span<const int64_t> local_block_ids);
  // StartLoad for every load of `loads` (a scheduler step's) in one round trip to kvd. Returns,
  // per load in order, what StartLoad would have returned; one refused does not stop the others.
  // The call's own error means no load started: an empty batch, more than kMaxLoadsPerCall, or
  // StartLoad's errors of the call itself (kTimeout, kUnavailable).
  Result<std::vector<Status>> StartLoads(std::span<const LoadSpec> loads);
  // Blocks until `layer` of `request` is in place (for GPU caches: kvd's copy completed on the
  // device): OK, the request's error, or kTimeout.
  Status WaitLayer(const std::string& request, int layer);

  // Requests finished since the last call.
  Finished GetFinished();
  // Local blocks of loads that failed since the last call: their content is undefined.
  std::vector<int64_t> GetFailedBlocks();

  // kvd's status (engines, peers, transfers, offload pool) as one JSON object.
  Result<std::string> DaemonStatusJson();

  // CPU offload. `region` is the index of a cache RegisterKvCaches returned; keys[i] is the hash
  // of the block in block_ids[i]. Errors: kUnsupported (kvd has no pool), kInvalidArgument (a key
  // outside 8..32 bytes, counts that differ, over 16384 keys), kOutOfRange (block id, region),
  // kIncompatible (the pool holds blocks of another shape: the message names both).
  //
  // Store: copies the blocks of keys the pool lacks; the blocks must not change until the op
  // completes. kResourceExhausted when even eviction cannot make room (nothing is stored then);
  // evictions are reported in the result, never silent. GPU caches: the store first records the
  // last layer's event on `cuda_stream`, as SaveLayer does. Host caches ignore the stream.
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
  // caches: no work may still read or write the target blocks; once WaitLayer / Wait returned,
  // work the engine enqueues sees the bytes.
  Result<OffloadLoaded> OffloadLoad(std::span<const offload::BlockKey> keys,
                                    std::span<const int64_t> block_ids, bool per_layer = false,
                                    uint32_t region = 0,
                                    std::vector<MissingKey>* missing = nullptr);

  // The implementation, for kvd's own tools and tests (its header is not installed).
  ConnectorCore& core() { return *core_; }

 private:
  explicit Connector(std::unique_ptr<ConnectorCore> core);
  std::unique_ptr<ConnectorCore> core_;
};

}  // namespace kv::connector
