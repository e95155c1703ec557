// The public verbs of the ucx backend: validation on the caller's thread, then a command for the
// progress thread (ucx_progress.cc). Rules on deadlines, failure and lifetime: ucx_engine.h.
#include "transport/ucx/ucx_transport.h"

#include <map>
#include <mutex>
#include <set>

#include "base/codec.h"
#include "transport/run_check.h"
#include "transport/settings.h"
#include "transport/ucx/ucx_engine.h"

namespace kv::transport {
namespace {

using ucx::Engine;

constexpr uint32_t kAddressMagic = 0x4155564b;     // "KVUA"
constexpr uint32_t kDescriptorMagic = 0x4d55564b;  // "KVUM"
constexpr uint32_t kWireVersion = 1;
constexpr size_t kMaxBlob = 64 << 10;  // worker addresses and rkeys are a few hundred bytes

// Owns what a registration or a remote descriptor lends its batches (ucx::Lent); hands it to
// the progress thread when it goes.
template <typename T>
class LentRef {
 public:
  LentRef(Engine* engine, std::shared_ptr<T> ref)
      : engine_(engine), lent_(new ucx::Lent<T>(std::move(ref))) {}
  ~LentRef() {
    engine_->Enqueue([lent = lent_] { ucx::Lent<T>::Release(lent); });
  }
  LentRef(const LentRef&) = delete;
  LentRef& operator=(const LentRef&) = delete;
  ucx::Lent<T>* get() const { return lent_; }

 private:
  Engine* engine_;
  ucx::Lent<T>* lent_;
};

class UcxRegistration final : public MemoryRegistration {
 public:
  // Host memory is also where peers' put messages may land (ucx_am_put.cc) while registered.
  UcxRegistration(Engine* engine, std::shared_ptr<ucx::MemoryMap> map)
      : engine_(engine), map_(std::move(map)), lent_(engine, map_) {
    if (map_->location().kind == MemoryKind::kHost)
      token_ = engine_->regions().Add(map_->base(), map_->length());
  }
  ~UcxRegistration() override {
    if (token_ != 0) engine_->regions().Remove(token_);
  }
  UcxRegistration(const UcxRegistration&) = delete;
  UcxRegistration& operator=(const UcxRegistration&) = delete;
  void* base() const override { return map_->base(); }
  uint64_t length() const override { return map_->length(); }
  MemoryLocation location() const override { return map_->location(); }
  std::string packed_descriptor() const override {
    return ByteWriter()
        .u32(kDescriptorMagic)
        .u32(kWireVersion)
        .u64(reinterpret_cast<uintptr_t>(map_->base()))
        .u64(map_->length())
        .bytes(map_->packed_rkey())
        .take();
  }
  ucx::Lent<ucx::MemoryMap>* lent_map() const { return lent_.get(); }
  Engine* engine() const { return engine_; }
  uint64_t token() const { return token_; }  // 0: not host memory, no put messages land here

 private:
  Engine* engine_;
  std::shared_ptr<ucx::MemoryMap> map_;
  LentRef<ucx::MemoryMap> lent_;
  uint64_t token_ = 0;
};

class UcxRemote final : public RemoteMemory {
 public:
  UcxRemote(Engine* engine, PeerId peer, uint64_t address, uint64_t length,
            std::shared_ptr<ucx::RemoteKey> key)
      : engine_(engine), peer_(peer), address_(address), length_(length), key_(engine, key) {}
  PeerId peer() const override { return peer_; }
  uint64_t length() const override { return length_; }
  const Engine* engine() const { return engine_; }
  uint64_t address() const { return address_; }
  ucx::Lent<ucx::RemoteKey>* lent_key() const { return key_.get(); }

 private:
  const Engine* engine_;
  PeerId peer_;
  uint64_t address_;
  uint64_t length_;
  LentRef<ucx::RemoteKey> key_;
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(std::unique_ptr<Engine> engine, bool cuda)
      : engine_(std::move(engine)), address_(Wrap(engine_->worker_address())), cuda_(cuda) {}

  std::string_view name() const override { return "ucx"; }
  std::string address() const override { return address_; }
  bool supports(MemoryKind kind) const override { return kind == MemoryKind::kHost || cuda_; }

  Result<std::unique_ptr<MemoryRegistration>> register_memory(void* base, uint64_t length,
                                                              MemoryLocation where) override {
    if (base == nullptr || length == 0)
      return Status::InvalidArgument("register_memory needs a non-null base and a length > 0");
    if (!supports(where.kind))
      return Status::Unsupported(
          "this UCX has no CUDA memory support (ucp_context_query lists no cuda memory type); "
          "stage GPU memory through pinned host memory");
    // Slabs are registered once: the same range again shares the mapping.
    auto key = std::make_tuple(reinterpret_cast<uintptr_t>(base), length, where.kind, where.device);
    std::lock_guard lock(mu_);
    std::shared_ptr<ucx::MemoryMap> map = maps_[key].lock();
    if (!map) {
      KV_ASSIGN_OR_RETURN(map, ucx::MemoryMap::Create(engine_->context(), base, length, where));
      maps_[key] = map;
    }
    std::erase_if(maps_, [](const auto& entry) { return entry.second.expired(); });
    return std::unique_ptr<MemoryRegistration>(new UcxRegistration(engine_.get(), std::move(map)));
  }

  Result<std::unique_ptr<MemoryRegistration>> allocate_memory(uint64_t length,
                                                              MemoryLocation where) override {
    if (length == 0) return Status::InvalidArgument("allocate_memory needs a length > 0");
    if (where.kind != MemoryKind::kHost)
      return Status::Unsupported("the ucx transport allocates host memory only");
    KV_ASSIGN_OR_RETURN(auto map, ucx::MemoryMap::Allocate(engine_->context(), length));
    return std::unique_ptr<MemoryRegistration>(new UcxRegistration(engine_.get(), std::move(map)));
  }

  Result<PeerId> connect(std::string_view peer_address) override {
    return Connect(peer_address, 0);
  }

  Result<LocalEndpoint> open_endpoint() override {
    using Opened = std::pair<uint64_t, std::string>;
    Result<Opened> opened = engine_->RunSync<Opened>([this] { return engine_->OpenEndpoint(); });
    if (!opened.ok()) return opened.status();
    return LocalEndpoint{opened->first, Wrap(opened->second)};
  }

  Result<PeerId> connect_endpoint(std::string_view peer_address, uint64_t endpoint) override {
    Result<PeerId> connected = Connect(peer_address, endpoint);
    // Consumed either way: a Connect that never ran (malformed address) gives it back here.
    if (!connected.ok()) release_endpoint(endpoint);
    return connected;
  }

  void release_endpoint(uint64_t endpoint) override {
    if (endpoint == 0) return;
    engine_->Enqueue([engine = engine_.get(), endpoint] { engine->ReleaseEndpoint(endpoint); });
  }

  void disconnect(PeerId peer) override {
    {
      std::lock_guard lock(mu_);
      if (peers_.erase(peer) == 0) return;
    }
    engine_->Enqueue([this, peer] { (void)engine_->Disconnect(peer); });
  }

  Result<std::unique_ptr<RemoteMemory>> import_remote(PeerId peer,
                                                      std::string_view packed) override {
    KV_RETURN_IF_ERROR(CheckPeer(peer));
    ByteReader in(packed);
    uint32_t magic = 0, version = 0;
    uint64_t address = 0, length = 0;
    std::string_view rkey;
    if (!in.u32(&magic) || magic != kDescriptorMagic || !in.u32(&version) || !in.u64(&address) ||
        !in.u64(&length) || !in.bytes(&rkey) || !in.at_end() || rkey.empty() ||
        rkey.size() > kMaxBlob)
      return Status::InvalidArgument("not a ucx memory descriptor");
    if (version != kWireVersion)
      return Status::Incompatible("ucx descriptor version " + std::to_string(version));
    if (length == 0 || address + length < address)
      return Status::InvalidArgument("ucx descriptor range wraps around or is empty");
    KV_ASSIGN_OR_RETURN(
        std::shared_ptr<ucx::RemoteKey> key,
        engine_->RunSync<std::shared_ptr<ucx::RemoteKey>>(
            [this, peer, r = std::string(rkey)] { return engine_->UnpackRkey(peer, r); }));
    return std::unique_ptr<RemoteMemory>(
        new UcxRemote(engine_.get(), peer, address, length, std::move(key)));
  }

  Status post(const Batch& batch, Completion done) override {
    KV_RETURN_IF_ERROR(CheckBatch(batch));
    auto* local = dynamic_cast<const UcxRegistration*>(batch.local);
    auto* remote = dynamic_cast<const UcxRemote*>(batch.remote);
    if (local == nullptr || remote == nullptr || local->engine() != engine_.get() ||
        remote->engine() != engine_.get())
      return Status::InvalidArgument("batch names memory of another transport");
    KV_RETURN_IF_ERROR(CheckPeer(remote->peer()));
    ucx::BatchState* state = engine_->NewBatch();
    state->engine = engine_.get();
    state->peer = remote->peer();
    state->op = batch.op;
    state->runs.assign(batch.runs.begin(), batch.runs.end());
    state->local = static_cast<char*>(local->base());
    state->remote_address = remote->address();
    state->lent_map = local->lent_map();
    state->lent_key = remote->lent_key();
    state->done = std::move(done);
    state->deadline = batch.deadline;
    engine_->Enqueue([engine = engine_.get(), state] { engine->Post(state); });
    return Status::Ok();
  }

  Status notify(PeerId peer, std::string message) override {
    if (message.size() > ucx::kMaxNotification)
      return Status::InvalidArgument("notification of " + std::to_string(message.size()) +
                                     " bytes; the limit is " +
                                     std::to_string(ucx::kMaxNotification));
    KV_RETURN_IF_ERROR(CheckPeer(peer));
    engine_->Enqueue([engine = engine_.get(), peer, m = std::move(message)]() mutable {
      engine->Notify(peer, std::move(m));
    });
    return Status::Ok();
  }

  bool checks_write_grants() const override { return true; }
  Status guard_writes(const MemoryRegistration& memory) override {
    KV_ASSIGN_OR_RETURN(uint64_t token, HostToken(memory));
    return engine_->regions().Guard(token);
  }
  Status grant_writes(uint64_t grant, PeerId peer, const MemoryRegistration& memory,
                      std::span<const WriteRange> ranges) override {
    KV_ASSIGN_OR_RETURN(uint64_t token, HostToken(memory));
    return engine_->regions().Grant(grant, peer, token, ranges);
  }
  void revoke_writes(uint64_t grant) override { engine_->regions().Revoke(grant); }

  void set_notification_handler(NotificationHandler handler) override {
    // Synchronous, so a peer told "ready" afterwards cannot reach the old handler.
    (void)engine_->RunSync<bool>([this, h = std::move(handler)]() mutable -> Result<bool> {
      engine_->SetHandler(std::move(h));
      return true;
    });
  }

 private:
  // The put-message table's token of one of our host registrations (where grants apply).
  Result<uint64_t> HostToken(const MemoryRegistration& memory) const {
    auto* reg = dynamic_cast<const UcxRegistration*>(&memory);
    if (reg == nullptr || reg->engine() != engine_.get())
      return Status::InvalidArgument("write grant names memory of another transport");
    if (reg->token() == 0)
      return Status::Unsupported("ucx: put messages land in host memory only; no grant applies");
    return reg->token();
  }

  static std::string Wrap(const std::string& worker_address) {
    return ByteWriter().u32(kAddressMagic).u32(kWireVersion).bytes(worker_address).take();
  }

  // On the reserved worker `endpoint`, or the shared one for 0.
  Result<PeerId> Connect(std::string_view peer_address, uint64_t endpoint) {
    ByteReader in(peer_address);
    uint32_t magic = 0, version = 0;
    std::string_view worker;
    if (!in.u32(&magic) || magic != kAddressMagic || !in.u32(&version) || !in.bytes(&worker) ||
        !in.at_end() || worker.empty() || worker.size() > kMaxBlob)
      return Status::InvalidArgument("not a ucx transport address");
    if (version != kWireVersion)
      return Status::Incompatible("ucx address version " + std::to_string(version) +
                                  ", this build speaks " + std::to_string(kWireVersion));
    PeerId id;
    {
      std::lock_guard lock(mu_);
      id = next_peer_++;
    }
    Result<PeerId> connected =
        engine_->RunSync<PeerId>([this, id, endpoint, w = std::string(worker)] {
          return engine_->Connect(w, id, endpoint);
        });
    if (!connected.ok()) {
      // Timed out, the Connect is still queued: close what it will open (commands run in order).
      engine_->Enqueue([this, id] { (void)engine_->Disconnect(id); });
      return connected.status();
    }
    std::lock_guard lock(mu_);
    peers_.insert(*connected);
    return *connected;
  }

  Status CheckPeer(PeerId peer) {
    std::lock_guard lock(mu_);
    if (peers_.count(peer) == 0)
      return Status::NotFound("peer " + std::to_string(peer) + " is not connected");
    return Status::Ok();
  }

  std::unique_ptr<Engine> engine_;
  const std::string address_;
  const bool cuda_;

  std::mutex mu_;  // guards everything below
  std::map<std::tuple<uintptr_t, uint64_t, MemoryKind, int>, std::weak_ptr<ucx::MemoryMap>> maps_;
  std::set<PeerId> peers_;
  PeerId next_peer_ = 1;
};

constexpr SettingInfo kSettings[] = {
    {"max_inflight_bytes", "a peer's bytes handed to UCX at once; more wait (16777216)"},
    {"put_path", "auto|am|rma: puts as kvd's messages or UCX's RMA; auto: am without RMA lane"},
    {"UCX_*", "any UCX configuration variable, e.g. UCX_TLS=tcp; wins over the environment"},
};

// The engine's own settings; every other one is UCX's (ucx_transport.h).
bool IsEngineSetting(const std::string& key) {
  return key == "max_inflight_bytes" || key == "put_path";
}

Result<ucx::EngineOptions> ParseEngineOptions(const TransportOptions& options) {
  ucx::EngineOptions engine;
  KV_ASSIGN_OR_RETURN(int64_t bound, IntSetting(options, "ucx", "max_inflight_bytes",
                                                static_cast<int64_t>(ucx::kMaxBytesInFlight), 1));
  engine.max_bytes_in_flight = static_cast<uint64_t>(bound);
  for (const auto& [k, v] : options.settings) {  // the first one counts, as in IntSetting
    if (k != "put_path") continue;
    if (v == "am") {
      engine.put_path = ucx::PutPath::kMessages;
    } else if (v == "rma") {
      engine.put_path = ucx::PutPath::kRma;
    } else if (v != "auto") {
      return Status::InvalidArgument("ucx setting put_path='" + v + "' must be auto, am or rma");
    }
    break;
  }
  return engine;
}

}  // namespace

std::span<const SettingInfo> UcxSettings() {
  return kSettings;
}

Result<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options) {
  KV_ASSIGN_OR_RETURN(ucx::EngineOptions engine_options, ParseEngineOptions(options));
  TransportOptions ucx_config;
  for (const auto& setting : options.settings) {
    if (!IsEngineSetting(setting.first)) ucx_config.settings.push_back(setting);
  }
  KV_ASSIGN_OR_RETURN(ucx::ContextPtr context, ucx::CreateContext(ucx_config));
  bool cuda = ucx::ContextSupports(context.get(), MemoryKind::kCuda);
  KV_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                      Engine::Create(std::move(context), engine_options));
  return std::unique_ptr<Transport>(new UcxTransport(std::move(engine), cuda));
}

}  // namespace kv::transport
