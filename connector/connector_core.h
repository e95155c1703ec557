// ConnectorCore: the implementation behind kv::connector::Connector (<kv/connector.h>), and what
// kvd's own tools and tests reach through Connector::core(). Not installed.
//
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

#include "base/shared_memory.h"
#include "base/status.h"
#include "connector/named_blocks.h"
#include "gpu/layer_events.h"
#include "kv/connector.h"
#include "layout/kv_region.h"

namespace kv::daemon {
class Daemon;
}

// Declared only, so that including this header does not pull protobuf into the engine's build;
// callers of DaemonStatus() / QueryDaemonStatus() include "protocol/kvd.pb.h" themselves.
namespace kv::proto {
class DaemonStatus;
}

namespace kv::connector {

class ConnectorCore {
 public:
  static Result<std::unique_ptr<ConnectorCore>> Open(const std::string& socket_path,
                                                     ConnectorOptions options);
  static Result<std::unique_ptr<ConnectorCore>> OpenEmbedded(std::shared_ptr<daemon::Daemon> daemon,
                                                             ConnectorOptions options);
  ~ConnectorCore();
  ConnectorCore(const ConnectorCore&) = delete;
  ConnectorCore& operator=(const ConnectorCore&) = delete;

  // Connector::RegisterKvCaches: host caches (kvd's shared memory, or inside AllocateHostMemory's)
  // or GPU caches, never both.
  Result<std::vector<KvCache>> RegisterKvCaches(std::span<const KvCacheDesc> caches);

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
  // Connector::SaveLayers: the layer's event is recorded once for every save.
  Result<std::vector<Status>> SaveLayers(int layer, std::span<const SaveSpec> saves,
                                         void* cuda_stream);
  // Connector::SetTransferToken (which checked the token's size): one-way, as SaveLayer.
  Status SetTransferToken(const std::string& request, const std::string& transfer_token);
  // transfer_token: the engine's (Connector::RequestFinished checked its size), or empty.
  Result<TransferParams> RequestFinished(const std::string& request,
                                         const std::string& transfer_token);

  // RequestFinished for every entry of `finishes` (tokens checked by Connector) in one round
  // trip: the messages go out in one write and kvd answers each. Per request in order, what
  // RequestFinished would have returned; the call's own error only for an empty batch or more
  // than kMaxFinishesPerCall (nothing sent). Any kvd: the messages are RequestFinished's own.
  Result<std::vector<Result<TransferParams>>> RequestsFinished(
      std::span<const FinishSpec> finishes);

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
  // GetFailedBlocks into the caller's buffer (the C API): kResourceExhausted, with nothing taken
  // and *count set, when they do not fit.
  Status TakeFailedBlocksInto(std::span<int64_t> out, size_t* count);
  // Why the load of `request` failed (Client::LoadError): Ok when it did not or is not known.
  Status LoadError(const std::string& request);

  Result<proto::DaemonStatus> DaemonStatus();
  Result<std::string> DaemonStatusJson();

  // CPU offload. `region` is the index of a cache RegisterKvCaches
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
  static Result<std::unique_ptr<ConnectorCore>> Connect(int fd, ConnectorOptions options,
                                                        std::shared_ptr<daemon::Daemon> embedded);
  ConnectorCore(std::unique_ptr<Client> client, std::shared_ptr<daemon::Daemon> embedded);
  friend class OffloadOp;
  // Records `layer`'s event on the stream when work there is pending; true when it was not
  // (the layer is written: kvd copies without waiting). Always false for host caches.
  Result<bool> RecordLayer(int layer, void* cuda_stream);
  Status SendSave(const std::string& request, int layer, std::span<const int64_t> block_ids,
                  bool written);
  // A finished request's next save (a reused id) names its blocks again.
  void ForgetNamedBlocks(std::span<const std::string> requests);
  Result<int> RegionLayers(uint32_t region) const;
  Status WaitOffload(const std::string& id, int layer);
  void ForgetOffload(const std::string& id);

  std::vector<int> region_layers_;  // layers of each registered cache; empty before registering
  int64_t region_blocks_ = 0;       // the fewest blocks of any registered cache
  std::atomic<uint64_t> next_offload_ = 1;
  std::mutex offload_mu_;  // taken before the client's lock, never after it
  // Held from deciding whether a save leaves its blocks out until it was written (NamedBlocks);
  // taken before the client's lock, never after it.
  std::mutex named_mu_;
  NamedBlocks named_;
  // Ops a live handle names, and those of them GetFinished() took as done from the client
  // (the client then no longer knows them).
  std::set<std::string> live_offloads_, done_offloads_;

  std::shared_ptr<daemon::Daemon> embedded_;  // kept alive for the connector's lifetime
  std::vector<kv::SharedMemory> memory_;      // this process's view of registered host regions
  // GPU caches: the per-layer events SaveLayer records. Set once by RegisterKvCaches.
  std::unique_ptr<kv::gpu::LayerEvents> layer_events_;
  std::unique_ptr<Client> client_;  // destroyed first: no event arrives after it
};

}  // namespace kv::connector
