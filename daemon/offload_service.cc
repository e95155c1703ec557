// OffloadService (offload_service.h): the pool, its key namespaces, and the engine protocol's
// offload messages.
#include "daemon/offload_service.h"

#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <type_traits>

#include "daemon/transfer_support.h"
#include "protocol/wire_layout.h"

namespace kv::daemon {

namespace asio = boost::asio;
using offload::BlockKey;
using offload::OffloadPool;

Result<std::unique_ptr<OffloadService>> OffloadService::Create(const OffloadOptions& options,
                                                               std::string kvd_name,
                                                               asio::io_context& io,
                                                               Registry& registry,
                                                               EventGate* gate) {
  std::optional<offload::HostBuffer> memory;
  if (options.capacity_bytes > 0) {
    KV_ASSIGN_OR_RETURN(memory,
                        offload::HostBuffer::Allocate(options.capacity_bytes, options.memory));
  }
  return std::unique_ptr<OffloadService>(
      new OffloadService(options, std::move(memory), std::move(kvd_name), io, registry, gate));
}

OffloadService::OffloadService(const OffloadOptions& options,
                               std::optional<offload::HostBuffer> memory, std::string kvd_name,
                               asio::io_context& io, Registry& registry, EventGate* gate)
    : options_(options),
      kvd_name_(std::move(kvd_name)),
      io_(io),
      registry_(registry),
      gate_(gate),
      memory_(std::move(memory)) {}

OffloadService::~OffloadService() = default;

std::vector<BlockKey> OffloadService::Namespaced(const std::string& instance,
                                                 const std::vector<BlockKey>& keys, bool record) {
  std::vector<BlockKey> out;
  out.reserve(keys.size());
  for (const BlockKey& key : keys) {
    std::string message;
    const uint32_t n = static_cast<uint32_t>(instance.size());
    message.append(reinterpret_cast<const char*>(&n), sizeof n);
    message.append(instance);
    message.append(reinterpret_cast<const char*>(key.bytes().data()), key.bytes().size());
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_Digest(message.data(), message.size(), digest, &length, EVP_sha256(), nullptr);
    auto pool_key = BlockKey::FromBytes({digest, BlockKey::kMaxBytes});
    out.push_back(*pool_key);  // 32 bytes: always a valid key
    if (record) {
      origins_.insert_or_assign(
          std::string(reinterpret_cast<const char*>(digest), BlockKey::kMaxBytes),
          std::pair{instance, key});
    }
  }
  return out;
}

std::vector<BlockKey> OffloadService::EvictedOf(const std::string& instance,
                                                const std::vector<BlockKey>& evicted) {
  std::vector<BlockKey> out;
  for (const BlockKey& key : evicted) {
    auto it = origins_.find(
        std::string(reinterpret_cast<const char*>(key.bytes().data()), key.bytes().size()));
    if (it == origins_.end()) continue;
    if (it->second.first == instance) out.push_back(it->second.second);
    origins_.erase(it);
  }
  return out;
}

Result<OffloadPool*> OffloadService::PoolFor(const KvRegion& region) {
  if (pool_) return pool_.get();
  offload::PoolOptions options;
  options.slot_layout = region.spec();
  options.gpu.how = options_.device_copy;
  KV_ASSIGN_OR_RETURN(pool_, OffloadPool::Create(options, *memory_));
  shape_ = offload::DescribeShape(region);
  const offload::PoolStats stats = pool_->stats();
  spdlog::info("offload pool: {} slots of {} ({} bytes each, {})", stats.capacity_slots, shape_,
               stats.slot_bytes, region.spec().order);
  return pool_.get();
}

proto::OffloadStatus OffloadService::Snapshot() const {
  proto::OffloadStatus s;
  s.set_enabled(true);
  if (!pool_) {
    s.set_capacity_bytes(memory_->size());
    s.set_huge_pages(memory_->huge_pages());
    s.set_pinned_memory(memory_->pinned());
    return s;
  }
  const offload::PoolStats p = pool_->stats();
  s.set_shape(shape_);
  s.set_capacity_bytes(p.capacity_bytes);
  s.set_slot_bytes(p.slot_bytes);
  s.set_capacity_slots(p.capacity_slots);
  s.set_used_slots(p.used_slots);
  s.set_pinned_slots(p.pinned_slots);
  s.set_hits(p.hits);
  s.set_misses(p.misses);
  s.set_evictions(p.evictions);
  s.set_bytes_in(p.bytes_in);
  s.set_bytes_out(p.bytes_out);
  s.set_failed_copies(p.failed_copies);
  s.set_huge_pages(p.huge_pages);
  s.set_pinned_memory(p.pinned_memory);
  return s;
}

// ---- the engine protocol's offload messages ----------------------------------------------------

namespace {

template <typename Keys>
Result<std::vector<BlockKey>> ParseKeys(const Keys& wire) {
  if (wire.empty() || wire.size() > kMaxOffloadKeys) {
    return Status::InvalidArgument("an offload request names 1 to " +
                                   std::to_string(kMaxOffloadKeys) + " keys, not " +
                                   std::to_string(wire.size()));
  }
  std::vector<BlockKey> keys;
  keys.reserve(wire.size());
  for (int i = 0; i < wire.size(); ++i) {
    const std::string& bytes = wire.Get(i);
    auto key = BlockKey::FromBytes({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    if (!key.ok()) return key.status().WithContext("key " + std::to_string(i));
    keys.push_back(*key);
  }
  return keys;
}

template <typename Ids>
Result<std::vector<int64_t>> ParseBlocks(const Ids& wire, size_t keys) {
  if (static_cast<size_t>(wire.size()) != keys) {
    return Status::InvalidArgument(std::to_string(keys) + " keys but " +
                                   std::to_string(wire.size()) + " block ids");
  }
  return std::vector<int64_t>(wire.begin(), wire.end());
}

Status CheckOffloadsInFlight(const Engine& engine) {
  if (engine.offload_in_flight < kMaxOffloadOpsInFlight) return Status::Ok();
  return Status::ResourceExhausted(std::to_string(engine.offload_in_flight) +
                                   " offload stores and loads in flight, the most an engine may "
                                   "have; wait for some to complete");
}

// How long a GPU store's copy waits in the event gate for the engine's event: the pool's own
// bound on a GPU copy (CudaMoverOptions::timeout's default).
constexpr auto kStoreEventTimeout = std::chrono::seconds(30);

// The pool's errors name its keys; the engine knows its own (same order).
Status InEngineTerms(const Status& s, const std::vector<BlockKey>& pool_keys,
                     const std::vector<BlockKey>& engine_keys) {
  std::string message = s.message();
  for (size_t i = 0; i < pool_keys.size() && i < engine_keys.size(); ++i) {
    const std::string from = pool_keys[i].ToHex();
    for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at)) {
      const std::string to = engine_keys[i].ToHex();
      message.replace(at, from.size(), to);
      at += to.size();
    }
  }
  return Status(s.code(), std::move(message));
}

// Layers [layer, end) are in place; end 0: layer alone.
proto::DaemonMessage LayerReadyMessage(const std::string& id, int64_t layer, int64_t end = 0) {
  proto::DaemonMessage m;
  m.mutable_layer_ready()->set_request_id(id);
  m.mutable_layer_ready()->set_layer(static_cast<int32_t>(layer));
  if (end > layer + 1) m.mutable_layer_ready()->set_layer_end(static_cast<int32_t>(end));
  return m;
}

}  // namespace

// What a store and a load check before their copy, and what the copy needs: the keys and block
// ids, the engine's region (it rides with the completion; the pool picks its copy path by where
// its bytes are), the event the copy waits for, and the pool, created on first use.
struct OffloadService::Copy {
  std::vector<BlockKey> keys;         // the pool's (OffloadService::Namespaced)
  std::vector<BlockKey> engine_keys;  // as the engine named them
  std::vector<int64_t> blocks;
  std::shared_ptr<Region> region;
  offload::CopyGate gate;
  OffloadPool* pool = nullptr;

  offload::BlockTransfer transfer() const {
    return {&region->layout, static_cast<std::byte*>(region->base), keys, blocks, gate,
            region->where};
  }
};

// GPU regions: a store's copy starts once the event gate saw the engine's most recent record of
// its last layer's event complete, which Connector::OffloadStore makes on the engine's stream
// just before it sends the store (the engine's writes of the blocks come before it). A load
// waits for nothing: the engine gives it blocks no work of its own touches, and hears each
// layer once it landed.
template <typename Message>  // proto::OffloadStore or proto::OffloadLoad
Result<OffloadService::Copy> OffloadService::Prepare(Engine& engine, const Message& m) {
  KV_RETURN_IF_ERROR(CheckRequestId(m.request_id()));
  Copy copy;
  KV_ASSIGN_OR_RETURN(copy.keys, ParseKeys(m.keys()));
  KV_ASSIGN_OR_RETURN(copy.blocks, ParseBlocks(m.block_ids(), copy.keys.size()));
  KV_ASSIGN_OR_RETURN(copy.region, RegionOf(engine, m.region_id()));
  copy.engine_keys = copy.keys;
  copy.keys =
      Namespaced(engine.offload_namespace, copy.keys, std::is_same_v<Message, proto::OffloadStore>);
  KV_RETURN_IF_ERROR(CheckOffloadsInFlight(engine));
  if constexpr (std::is_same_v<Message, proto::OffloadStore>) {
    if (copy.region->where.kind == MemoryKind::kCuda) {
      // The gate's probe keeps the engine's events open while the copy waits, even if the
      // engine leaves meanwhile.
      copy.gate = [gate = gate_, events = engine.layer_events](std::function<void()> start,
                                                               std::function<void(Status)> fail) {
        const int last = events->layers() - 1;
        gate->Hold([events, last] { return events->Fired(last); },
                   Clock::now() + kStoreEventTimeout, std::move(start), std::move(fail),
                   EventKey{events.get(), last});
      };
    }
  }
  KV_ASSIGN_OR_RETURN(copy.pool, PoolFor(copy.region->layout));
  return copy;
}

Result<std::shared_ptr<Region>> OffloadService::RegionOf(const Engine& engine,
                                                         uint32_t region_id) const {
  if (!enabled()) {
    return Status::Unsupported("kvd " + kvd_name_ +
                               " has no offload pool (start it with --offload-bytes)");
  }
  if (region_id >= engine.regions.size()) {
    return Status::OutOfRange("region " + std::to_string(region_id) + " is not registered (" +
                              std::to_string(engine.regions.size()) + " regions)");
  }
  return engine.regions[region_id];
}

void OffloadService::SendToEngine(uint64_t engine_id, const proto::DaemonMessage& message) {
  if (Engine* engine = registry_.Find(engine_id)) (void)engine->conn->Send(message);
}

void OffloadService::Completed(uint64_t engine_id,
                               const std::vector<proto::DaemonMessage>& events) {
  Engine* engine = registry_.Find(engine_id);
  if (engine == nullptr) return;  // it left; the copy still landed (or failed) in the pool
  --engine->offload_in_flight;
  // SendToEngine looks the engine up for each event: a send that fails closes the connection
  // and erases the engine.
  for (const auto& event : events) SendToEngine(engine_id, event);
}

Result<proto::OffloadResult> OffloadService::Store(Engine& engine, const proto::OffloadStore& m) {
  KV_ASSIGN_OR_RETURN(const Copy copy, Prepare(engine, m));
  const std::shared_ptr<Region>& region = copy.region;
  const offload::BlockTransfer transfer = copy.transfer();
  // The ticket's figures are filled in on the io thread right after Store() returns; the
  // completion reads them only in its io-thread half, which runs after this handler.
  auto figures = std::make_shared<std::pair<uint64_t, uint64_t>>();  // bytes, runs
  // The region rides with the completion: its mapping outlives the copy even if the engine
  // disconnects meanwhile.
  auto ticket = copy.pool->Store(transfer, [this, engine_id = engine.id, id = m.request_id(),
                                            region, figures](Status s) {
    asio::post(io_, [this, engine_id, id, s, figures] {
      std::vector<proto::DaemonMessage> events;
      if (s.ok()) events.push_back(LayerReadyMessage(id, 0));
      events.push_back(RequestDoneMessage(id, /*sent=*/false, s, figures->first, figures->second));
      Completed(engine_id, events);
    });
  });
  if (!ticket.ok()) return ticket.status();
  *figures = {ticket->bytes, ticket->runs};
  ++engine.offload_in_flight;
  proto::OffloadResult result;
  result.set_stored(ticket->stored);
  result.set_already_present(ticket->already_present);
  for (const BlockKey& key : EvictedOf(engine.offload_namespace, ticket->evicted)) {
    result.add_evicted(reinterpret_cast<const char*>(key.bytes().data()), key.bytes().size());
  }
  result.set_bytes(ticket->bytes);
  result.set_runs(ticket->runs);
  return result;
}

Result<proto::OffloadResult> OffloadService::Lookup(Engine& engine, const proto::OffloadLookup& m) {
  KV_ASSIGN_OR_RETURN(std::vector<BlockKey> keys, ParseKeys(m.keys()));
  KV_ASSIGN_OR_RETURN(std::shared_ptr<Region> region, RegionOf(engine, m.region_id()));
  keys = Namespaced(engine.offload_namespace, keys, /*record=*/false);
  KV_ASSIGN_OR_RETURN(OffloadPool * pool, PoolFor(region->layout));
  proto::OffloadResult result;
  if (!m.per_key()) {
    KV_ASSIGN_OR_RETURN(size_t hits, pool->Lookup(region->layout, keys));
    result.set_hits(hits);
    return result;
  }
  KV_ASSIGN_OR_RETURN(auto states, pool->Probe(region->layout, keys));
  for (OffloadPool::KeyState state : states) {
    result.add_key_states(state == OffloadPool::KeyState::kReady     ? proto::KEY_READY
                          : state == OffloadPool::KeyState::kStoring ? proto::KEY_STORING
                                                                     : proto::KEY_ABSENT);
  }
  return result;
}

Result<proto::OffloadResult> OffloadService::Load(Engine& engine, const proto::OffloadLoad& m) {
  KV_ASSIGN_OR_RETURN(const Copy copy, Prepare(engine, m));
  const std::shared_ptr<Region>& region = copy.region;
  const offload::BlockTransfer transfer = copy.transfer();
  const uint64_t engine_id = engine.id;
  const std::string id = m.request_id();
  // The last layer is reported with the op's completion, once the pool has closed its books on
  // the load (its pins and byte counts): an engine that waited for every layer then sees the
  // pool's status as of this load. Without per-layer reports every layer is reported then.
  const int64_t layers = region->layout.spec().layers;
  const int64_t first_at_end = m.per_layer() ? layers - 1 : 0;
  offload::LayerDone on_layer;
  if (m.per_layer()) {
    on_layer = [this, engine_id, id, first_at_end](int64_t layer) {
      if (layer >= first_at_end) return;
      asio::post(io_, [this, engine_id, id, layer] {
        SendToEngine(engine_id, LayerReadyMessage(id, layer));
      });
    };
  }
  auto figures = std::make_shared<std::pair<uint64_t, uint64_t>>();  // as in OffloadStore
  auto on_done = [this, engine_id, id, region, first_at_end, layers, figures](Status s) {
    asio::post(io_, [this, engine_id, id, s, first_at_end, layers, figures] {
      std::vector<proto::DaemonMessage> events;
      if (s.ok()) events.push_back(LayerReadyMessage(id, first_at_end, layers));
      events.push_back(RequestDoneMessage(id, /*sent=*/false, s, figures->first, figures->second));
      Completed(engine_id, events);
    });
  };
  auto ticket = copy.pool->Load(transfer, std::move(on_layer), std::move(on_done));
  if (!ticket.ok()) return InEngineTerms(ticket.status(), copy.keys, copy.engine_keys);
  *figures = {ticket->bytes, ticket->runs};
  ++engine.offload_in_flight;
  proto::OffloadResult result;
  result.set_bytes(ticket->bytes);
  result.set_runs(ticket->runs);
  result.set_per_layer(ticket->per_layer);
  return result;
}

}  // namespace kv::daemon
