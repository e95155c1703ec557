// OffloadPool: kvd's host-memory cache of KV blocks, keyed by the engine's block hash.
//
// Pages leave an engine's cache (GPU or host memory) for the pool with Store(), and come back on
// a prefix hit with Load(); Lookup() says how many leading keys are present, i.e. how much of a
// prompt the engine need not recompute. The pool belongs to the daemon, not to an engine: an
// engine that restarts and registers again finds the blocks it stored before.
//
// Slots. The pool is one HostBuffer cut into slots; a slot holds one block of every layer (one
// key = one block, whatever the layout). The pool's memory is itself a KvRegion of the slot
// layout with B = slots, so every copy is a PlanTransfer between the engine's region and the
// pool's: consecutive blocks into consecutive slots merge into long runs, and an engine whose
// physical order differs from the pool's (LBNHC vs BLNHC) is converted on the way, not refused.
// For a layer-first pool a slot is L per-layer pages, one per layer, `stride(L)` apart.
//
// Layouts. Every block in a pool has the same logical shape (layers, KV heads, tokens per block,
// content bytes per head-token); a region of another shape is rejected with kIncompatible and a
// message naming both shapes. Tensor-parallel ranks store the same block hash with different
// heads, so a key is held per shard: the first global KV head the region holds. Ranks that hold
// the same heads (replicated heads, MLA) share entries.
//
// Eviction. When no slot is free, a store takes the least recently used ready slot. A slot being
// stored or loaded is pinned and never evicted. A store that cannot get enough slots fails as a
// whole with kResourceExhausted; it never drops blocks silently.
//
// Deadlines. A GPU copy that does not land within PoolOptions::gpu.timeout fails its store or
// load with kTimeout; the keys of such a store are forgotten and their slots never reused (the
// copy may still land; they count as used and in flight), and that device's copies are refused
// from then on. A load that timed out may still write the engine's blocks later: the engine
// must treat them as lost.
//
// Threading: every method is thread-safe. Completions run on a copy thread (one per memory: host,
// or each CUDA device), in submission order per memory, with no pool lock held: they may call
// into the pool, but must not block (that stalls every later copy of that memory). Destruction
// waits for every accepted copy; completions must not call into a pool being destroyed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "daemon/offload/block_key.h"
#include "daemon/offload/host_buffer.h"
#include "daemon/offload/page_mover.h"
#include "daemon/offload/pool_stats.h"
#include "daemon/offload/slot_index.h"
#include "layout/kv_region.h"
#include "base/status.h"

namespace kv::offload {

struct PoolOptions {
  uint64_t capacity_bytes = 0;  // kvd's --offload-bytes; rounded down to whole slots
  // The slot layout: order, layers, heads, block_size and content_bytes. Blocks, strides and the
  // tensor-parallel fields are ignored (the pool is dense; ranks are shards).
  LayoutSpec slot_layout;
  HostBufferOptions memory;
  // How copies between GPU pages and the pool run: path, streams, deadline (see page_mover.h).
  CudaMoverOptions gpu;
};

// The engine side of a store or a load: which of its blocks hold which keys.
struct BlockTransfer {
  const KvRegion* region = nullptr;  // the engine's cache: its layout
  std::byte* base = nullptr;         // the region's base address in this process
  std::span<const BlockKey> keys;
  std::span<const int64_t> blocks;  // blocks[i] holds (store) or receives (load) keys[i]
  // cudaEvent_t recorded by the engine after the kernels that wrote (store) or last read (load)
  // these blocks; the copy waits for it on the device. Null for host regions or "no wait".
  void* ready_event = nullptr;
  MemoryLocation where = MemoryLocation::Host();  // where base points: host or cuda:N
};

struct StoreTicket {
  size_t stored = 0;              // keys copied by this store
  size_t already_present = 0;     // keys the pool held (or was storing) already; refreshed in LRU
  std::vector<BlockKey> evicted;  // keys dropped to make room (the engine may forget them)
  uint64_t bytes = 0;
  size_t runs = 0;  // copies the plan needed: the descriptor count
};

struct LoadTicket {
  uint64_t bytes = 0;
  size_t runs = 0;
  bool per_layer = false;  // layer-first region and an on_layer: each layer lands on its own
};

using Completion = std::function<void(Status)>;
using LayerDone = std::function<void(int64_t layer)>;

class OffloadPool {
 public:
  // Allocates (and, with a CUDA device present, pins) the pool's memory once.
  // kInvalidArgument for a bad slot layout or a capacity under one slot.
  static Result<std::unique_ptr<OffloadPool>> Create(const PoolOptions& options);
  // Over memory allocated earlier (kvd allocates at start, before any engine names the block
  // shape): capacity is memory.size(), options.capacity_bytes and options.memory are ignored.
  // `memory` is moved from only on success, so a failed attempt can be retried with it.
  static Result<std::unique_ptr<OffloadPool>> Create(const PoolOptions& options,
                                                     HostBuffer& memory);
  ~OffloadPool();
  OffloadPool(const OffloadPool&) = delete;
  OffloadPool& operator=(const OffloadPool&) = delete;

  // Copies the blocks of keys not yet held into the pool, asynchronously. Errors, with nothing
  // claimed or copied and `done` never called: kInvalidArgument (malformed request),
  // kOutOfRange (block id), kIncompatible (layout shape), kResourceExhausted (fewer free plus
  // evictable slots than new keys), kUnsupported (memory this build cannot reach). Otherwise
  // `done` runs once; the keys become visible to Lookup/Load only after their bytes landed, and
  // vanish again if the copy fails.
  Result<StoreTicket> Store(const BlockTransfer& request, Completion done);

  // How many leading keys are stored and ready. kIncompatible for a region of another shape.
  Result<size_t> Lookup(const KvRegion& region, std::span<const BlockKey> keys);

  // Where each key stands, for per-key answers (a failed load's reply, kvctl). Unlike Lookup()
  // it neither stops at the first miss nor counts hits. kIncompatible as for Lookup().
  enum class KeyState : uint8_t { kAbsent, kStoring, kReady };
  Result<std::vector<KeyState>> Probe(const KvRegion& region, std::span<const BlockKey> keys) const;

  // Copies stored blocks into the engine's blocks, asynchronously. Every key must be ready:
  // otherwise kNotFound, with one line per missing key, and nothing is written. The loaded keys
  // are pinned until the copy lands. `on_layer(l)` (optional) runs once per layer as soon as
  // that layer's bytes landed: layer by layer for layer-first regions, all at the end
  // otherwise; then `done` runs once. Other errors as for Store().
  Result<LoadTicket> Load(const BlockTransfer& request, LayerDone on_layer, Completion done);

  PoolStats stats() const;
  // The shard a region's keys are held under (see the header comment).
  static int64_t ShardOf(const KvRegion& region);

 private:
  OffloadPool(KvRegion slots, HostBuffer memory, const CudaMoverOptions& gpu);
  // The pool's memory as a region of `layout` holding as many slots as fit in `bytes`.
  static Result<KvRegion> SlotRegion(const LayoutSpec& layout, uint64_t bytes);

  Status CheckShape(const KvRegion& region) const;
  Status CheckRequest(const BlockTransfer& request) const;
  // The pool's memory viewed as a region of the slot layout for the region's shard.
  Result<KvRegion> PoolView(const KvRegion& engine) const;
  Result<PageMover*> MoverFor(MemoryLocation where);
  void FinishStore(const std::vector<PoolKey>& keys, uint64_t bytes, const Status& status);
  void FinishLoad(const std::vector<PoolKey>& keys, uint64_t bytes, const Status& status);

  const KvRegion slots_;  // the pool's memory as a region: B = slots, shard 0
  const uint64_t slot_bytes_;
  HostBuffer memory_;
  const CudaMoverOptions gpu_;

  mutable std::mutex mu_;  // guards index_ and stats_
  SlotIndex index_;
  PoolStats stats_;

  // Declared last so they are destroyed first: their pending completions use the members above.
  std::mutex movers_mu_;
  std::unique_ptr<PageMover> host_mover_;
  std::map<int, std::unique_ptr<PageMover>> cuda_movers_;  // by device ordinal
};

// "32 layers × 8 heads × 16 tokens × 512 B" — a region's logical block shape, for messages.
std::string DescribeShape(const KvRegion& region);

}  // namespace kv::offload
