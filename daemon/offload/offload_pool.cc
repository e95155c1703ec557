#include "daemon/offload/offload_pool.h"

#include <unordered_set>
#include <utility>

namespace kv::offload {
namespace {

// Logical bytes of one block: what a slot holds, whatever the physical order.
uint64_t BlockBytes(const KvRegion& r) {
  return static_cast<uint64_t>(r.size(Axis::kL) * r.size(Axis::kH) * r.size(Axis::kN) *
                               r.logical_content_bytes());
}

std::string KeyList(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += "\n  " + line;
  return out;
}

}  // namespace

std::string DescribeShape(const KvRegion& r) {
  return std::to_string(r.size(Axis::kL)) + " layers × " + std::to_string(r.size(Axis::kH)) +
         " heads × " + std::to_string(r.size(Axis::kN)) + " tokens × " +
         std::to_string(r.logical_content_bytes()) + " B";
}

int64_t OffloadPool::ShardOf(const KvRegion& region) {
  return region.spec().replicated ? 0 : region.global_head(0);
}

Result<KvRegion> OffloadPool::SlotRegion(const LayoutSpec& layout, uint64_t bytes) {
  LayoutSpec one = layout;
  one.blocks = 1;
  one.strides = {};
  one.tp_rank = 0;
  one.tp_size = 1;
  one.total_heads = 0;
  one.replicated = false;
  auto shape = KvRegion::Create(one);
  if (!shape.ok()) return shape.status().WithContext("offload slot layout");
  const uint64_t slot_bytes = BlockBytes(*shape);
  const uint64_t slots = bytes / slot_bytes;
  if (slots == 0) {
    return Status::InvalidArgument("offload pool of " + std::to_string(bytes) +
                                   " bytes holds no block of " + DescribeShape(*shape) + " (" +
                                   std::to_string(slot_bytes) + " bytes)");
  }
  if (slots > UINT32_MAX) return Status::InvalidArgument("offload pool has over 2^32 slots");
  one.blocks = static_cast<int64_t>(slots);
  KV_ASSIGN_OR_RETURN(KvRegion region, KvRegion::Create(one));
  if (region.span_bytes() != slots * slot_bytes) {
    return Status::Internal("dense slot layout spans " + std::to_string(region.span_bytes()) +
                            " bytes, not " + std::to_string(slots * slot_bytes));
  }
  return region;
}

Result<std::unique_ptr<OffloadPool>> OffloadPool::Create(const PoolOptions& options) {
  KV_ASSIGN_OR_RETURN(KvRegion region, SlotRegion(options.slot_layout, options.capacity_bytes));
  KV_ASSIGN_OR_RETURN(HostBuffer memory, HostBuffer::Allocate(region.span_bytes(), options.memory));
  return std::unique_ptr<OffloadPool>(
      new OffloadPool(std::move(region), std::move(memory), options.gpu));
}

Result<std::unique_ptr<OffloadPool>> OffloadPool::Create(const PoolOptions& options,
                                                         HostBuffer& memory) {
  KV_ASSIGN_OR_RETURN(KvRegion region, SlotRegion(options.slot_layout, memory.size()));
  return std::unique_ptr<OffloadPool>(
      new OffloadPool(std::move(region), std::move(memory), options.gpu));
}

OffloadPool::OffloadPool(KvRegion slots, HostBuffer memory, const CudaMoverOptions& gpu)
    : slots_(std::move(slots)),
      slot_bytes_(BlockBytes(slots_)),
      memory_(std::move(memory)),
      gpu_(gpu),
      index_(static_cast<uint32_t>(slots_.size(Axis::kB))),
      host_mover_(CreateHostPageMover()) {
  stats_.slot_bytes = slot_bytes_;
  stats_.capacity_slots = index_.capacity();
  stats_.capacity_bytes = stats_.capacity_slots * slot_bytes_;
  stats_.huge_pages = memory_.huge_pages();
  stats_.pinned_memory = memory_.pinned();
}

OffloadPool::~OffloadPool() {
  // Movers finish their accepted jobs here, while the index they report into still exists.
  std::lock_guard lock(movers_mu_);
  cuda_movers_.clear();
  host_mover_.reset();
}

Status OffloadPool::CheckShape(const KvRegion& r) const {
  const bool same = r.size(Axis::kL) == slots_.size(Axis::kL) &&
                    r.size(Axis::kH) == slots_.size(Axis::kH) &&
                    r.size(Axis::kN) == slots_.size(Axis::kN) &&
                    r.logical_content_bytes() == slots_.logical_content_bytes();
  if (same) return Status::Ok();
  return Status::Incompatible("blocks of " + DescribeShape(r) +
                              " cannot use this offload pool, whose slots hold blocks of " +
                              DescribeShape(slots_));
}

Status OffloadPool::CheckRequest(const BlockTransfer& req) const {
  if (req.region == nullptr || req.base == nullptr) {
    return Status::InvalidArgument("offload request without a region or base address");
  }
  if (req.keys.size() != req.blocks.size()) {
    return Status::InvalidArgument(std::to_string(req.keys.size()) + " keys but " +
                                   std::to_string(req.blocks.size()) + " block ids");
  }
  KV_RETURN_IF_ERROR(CheckShape(*req.region));
  const int64_t num_blocks = req.region->size(Axis::kB);
  for (size_t i = 0; i < req.keys.size(); ++i) {
    if (req.keys[i].empty())
      return Status::InvalidArgument("key " + std::to_string(i) + " is empty");
    if (req.blocks[i] < 0 || req.blocks[i] >= num_blocks) {
      return Status::OutOfRange("block id " + std::to_string(req.blocks[i]) + " (key " +
                                std::to_string(i) + ") outside [0, " + std::to_string(num_blocks) +
                                ")");
    }
  }
  return Status::Ok();
}

Result<KvRegion> OffloadPool::PoolView(const KvRegion& engine) const {
  LayoutSpec spec = slots_.spec();
  spec.tp_rank = engine.spec().tp_rank;
  spec.tp_size = engine.spec().tp_size;
  spec.total_heads = engine.spec().total_heads;
  spec.replicated = engine.spec().replicated;
  return KvRegion::Create(spec);
}

Result<PageMover*> OffloadPool::MoverFor(MemoryLocation where) {
  std::lock_guard lock(movers_mu_);
  if (where.kind == MemoryKind::kHost) return host_mover_.get();
  if (!memory_.pinned()) {
    // Copies from the GPU would read or write host memory the device cannot address.
    return Status::Unavailable("cannot offload pages of cuda:" + std::to_string(where.device) +
                               ": the pool's memory is not pinned (no CUDA device when it was "
                               "allocated, or pinning was turned off)");
  }
  auto it = cuda_movers_.find(where.device);
  if (it == cuda_movers_.end()) {
    KV_ASSIGN_OR_RETURN(auto mover, CreateCudaPageMover(where.device, gpu_));
    it = cuda_movers_.emplace(where.device, std::move(mover)).first;
  }
  return it->second.get();
}

Result<StoreTicket> OffloadPool::Store(const BlockTransfer& req, Completion done) {
  KV_RETURN_IF_ERROR(CheckRequest(req));
  const KvRegion& engine = *req.region;
  KV_ASSIGN_OR_RETURN(KvRegion pool, PoolView(engine));
  KV_ASSIGN_OR_RETURN(PageMover * mover, MoverFor(req.where));
  const int64_t shard = ShardOf(engine);

  StoreTicket ticket;
  std::vector<PoolKey> claimed;
  std::vector<int64_t> src_blocks, dst_slots;
  {
    std::lock_guard lock(mu_);
    // Keys already held are pinned while this store claims slots, so that making room for the
    // new keys can never evict a key the ticket reports as present. Unpinning them afterwards
    // makes them the most recently used.
    std::unordered_set<PoolKey, PoolKeyHash> fresh, present;
    std::vector<size_t> to_store;
    for (size_t i = 0; i < req.keys.size(); ++i) {
      PoolKey key{shard, req.keys[i]};
      if (index_.Find(key) != nullptr) {
        if (present.insert(key).second) index_.Pin(key);
        ++ticket.already_present;
      } else if (fresh.insert(key).second) {
        to_store.push_back(i);
      } else {
        ++ticket.already_present;  // a repeat within this request
      }
    }
    const size_t room = size_t{index_.free_slots()} + index_.evictable();
    if (to_store.size() > room) {
      for (const auto& key : present) index_.Unpin(key);
      return Status::ResourceExhausted(
          "store needs " + std::to_string(to_store.size()) + " slots; the pool has " +
          std::to_string(index_.free_slots()) + " free and " + std::to_string(index_.evictable()) +
          " evictable of " + std::to_string(index_.capacity()) +
          " (the rest are in flight or named by this store)");
    }
    for (size_t i : to_store) {
      PoolKey key{shard, req.keys[i]};
      std::optional<PoolKey> evicted;
      uint32_t slot = *index_.Claim(key, &evicted);  // enough slots were checked above
      if (evicted) {
        ticket.evicted.push_back(evicted->key);
        ++stats_.evictions;
      }
      claimed.push_back(key);
      src_blocks.push_back(req.blocks[i]);
      dst_slots.push_back(slot);
    }
    for (const auto& key : present) index_.Unpin(key);
  }
  ticket.stored = claimed.size();

  auto abandon = [&](const Status& s) {
    std::lock_guard lock(mu_);
    for (const auto& key : claimed) index_.Abandon(key);
    return s;
  };
  CopyJob job;
  job.src_base = req.base;
  job.dst_base = memory_.data();
  job.ready_event = req.ready_event;
  if (!claimed.empty()) {
    TransferSpec spec{src_blocks, dst_slots,
                      static_cast<int64_t>(claimed.size()) * engine.size(Axis::kN)};
    auto plan = PlanTransfer(engine, pool, spec);
    if (!plan.ok()) return abandon(plan.status().WithContext("planning the store"));
    Status fits = ValidateRuns(plan->runs, engine.span_bytes(), memory_.size());
    if (!fits.ok()) return abandon(fits.WithContext("planning the store"));
    ticket.bytes = plan->bytes;
    ticket.runs = plan->runs.size();
    job.phases.push_back(std::move(plan->runs));
  }
  job.done = [this, claimed, bytes = ticket.bytes, done = std::move(done)](Status s) {
    FinishStore(claimed, bytes, s);
    done(std::move(s));
  };
  Status submitted = mover->Submit(std::move(job));
  if (!submitted.ok()) return abandon(submitted);
  return ticket;
}

void OffloadPool::FinishStore(const std::vector<PoolKey>& keys, uint64_t bytes,
                              const Status& status) {
  std::lock_guard lock(mu_);
  for (const auto& key : keys) {
    if (status.ok()) {
      index_.Publish(key);
    } else if (status.code() == Code::kTimeout) {
      index_.Retire(key);  // the copy may still land: its slot must never be handed out again
    } else {
      index_.Abandon(key);
    }
  }
  if (status.ok()) {
    stats_.bytes_in += bytes;
  } else {
    ++stats_.failed_copies;
  }
}

Result<size_t> OffloadPool::Lookup(const KvRegion& region, std::span<const BlockKey> keys) {
  KV_RETURN_IF_ERROR(CheckShape(region));
  const int64_t shard = ShardOf(region);
  std::lock_guard lock(mu_);
  size_t found = 0;
  while (found < keys.size()) {
    const SlotIndex::Entry* e = index_.Find({shard, keys[found]});
    if (e == nullptr || e->state != SlotIndex::State::kReady) break;
    ++found;
  }
  stats_.hits += found;
  stats_.misses += keys.size() - found;
  return found;
}

Result<std::vector<OffloadPool::KeyState>> OffloadPool::Probe(
    const KvRegion& region, std::span<const BlockKey> keys) const {
  KV_RETURN_IF_ERROR(CheckShape(region));
  const int64_t shard = ShardOf(region);
  std::vector<KeyState> states;
  states.reserve(keys.size());
  std::lock_guard lock(mu_);
  for (const auto& key : keys) {
    const SlotIndex::Entry* e = index_.Find({shard, key});
    states.push_back(e == nullptr                           ? KeyState::kAbsent
                     : e->state == SlotIndex::State::kReady ? KeyState::kReady
                                                            : KeyState::kStoring);
  }
  return states;
}

Result<LoadTicket> OffloadPool::Load(const BlockTransfer& req, LayerDone on_layer,
                                     Completion done) {
  KV_RETURN_IF_ERROR(CheckRequest(req));
  const KvRegion& engine = *req.region;
  std::unordered_set<int64_t> targets;
  for (int64_t b : req.blocks) {
    if (!targets.insert(b).second) {
      return Status::InvalidArgument("block id " + std::to_string(b) +
                                     " appears twice as a load destination");
    }
  }
  KV_ASSIGN_OR_RETURN(KvRegion pool, PoolView(engine));
  KV_ASSIGN_OR_RETURN(PageMover * mover, MoverFor(req.where));
  const int64_t shard = ShardOf(engine);

  std::vector<PoolKey> pinned;
  std::vector<int64_t> src_slots;
  {
    std::lock_guard lock(mu_);
    std::vector<std::string> missing;
    for (size_t i = 0; i < req.keys.size(); ++i) {
      const SlotIndex::Entry* e = index_.Find({shard, req.keys[i]});
      if (e == nullptr) {
        missing.push_back("key " + std::to_string(i) + " (" + req.keys[i].ToHex() +
                          "): not in the pool");
      } else if (e->state != SlotIndex::State::kReady) {
        missing.push_back("key " + std::to_string(i) + " (" + req.keys[i].ToHex() +
                          "): still being stored");
      } else {
        src_slots.push_back(e->slot);
      }
    }
    if (!missing.empty()) {
      return Status::NotFound(std::to_string(missing.size()) + " of " +
                              std::to_string(req.keys.size()) +
                              " keys cannot be loaded; nothing was written:" + KeyList(missing));
    }
    for (const auto& k : req.keys) {
      PoolKey key{shard, k};
      index_.Touch(key);
      index_.Pin(key);
      pinned.push_back(std::move(key));
    }
  }
  auto unpin = [&](const Status& s) {
    std::lock_guard lock(mu_);
    for (const auto& key : pinned) index_.Unpin(key);
    return s;
  };

  LoadTicket ticket;
  // Phases cost a launch and an event each: split per layer only when someone waits per layer.
  ticket.per_layer = !engine.blocks_first() && on_layer != nullptr;
  const int64_t layers = engine.size(Axis::kL);
  CopyJob job;
  job.src_base = memory_.data();
  job.dst_base = req.base;
  job.ready_event = req.ready_event;
  if (!pinned.empty()) {
    // One phase per layer where a layer's pages are apart from the others', else one phase.
    const int64_t phases = ticket.per_layer ? layers : 1;
    for (int64_t p = 0; p < phases; ++p) {
      TransferSpec spec{src_slots, req.blocks,
                        static_cast<int64_t>(pinned.size()) * engine.size(Axis::kN),
                        ticket.per_layer ? p : 0, ticket.per_layer ? p + 1 : -1};
      auto plan = PlanTransfer(pool, engine, spec);
      if (!plan.ok()) return unpin(plan.status().WithContext("planning the load"));
      Status fits = ValidateRuns(plan->runs, memory_.size(), engine.span_bytes());
      if (!fits.ok()) return unpin(fits.WithContext("planning the load"));
      ticket.bytes += plan->bytes;
      ticket.runs += plan->runs.size();
      job.phases.push_back(std::move(plan->runs));
    }
  }
  if (on_layer) {
    job.on_phase = [on_layer, per_layer = ticket.per_layer, layers](size_t phase) {
      if (per_layer) {
        on_layer(static_cast<int64_t>(phase));
      } else {
        for (int64_t l = 0; l < layers; ++l) on_layer(l);
      }
    };
  }
  job.done = [this, pinned, bytes = ticket.bytes, done = std::move(done)](Status s) {
    FinishLoad(pinned, bytes, s);
    done(std::move(s));
  };
  Status submitted = mover->Submit(std::move(job));
  if (!submitted.ok()) return unpin(submitted);
  return ticket;
}

void OffloadPool::FinishLoad(const std::vector<PoolKey>& keys, uint64_t bytes,
                             const Status& status) {
  std::lock_guard lock(mu_);
  for (const auto& key : keys) index_.Unpin(key);
  if (status.ok()) {
    stats_.bytes_out += bytes;
  } else {
    ++stats_.failed_copies;
  }
}

PoolStats OffloadPool::stats() const {
  std::lock_guard lock(mu_);
  PoolStats s = stats_;
  s.used_slots = index_.used();
  s.pinned_slots = index_.used() - index_.evictable();
  return s;
}

}  // namespace kv::offload
