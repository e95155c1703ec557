#include "connector/connector_core.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

#include <google/protobuf/util/json_util.h>

#include "connector/client.h"
#include "connector/connector.h"
#include "connector/host_memory.h"
#include "daemon/daemon.h"
#include "daemon/transfer_support.h"
#include "gpu/ipc_memory.h"
#include "protocol/wire_layout.h"

namespace kv::connector {

static_assert(kMaxIdBytes == daemon::kMaxRequestIdBytes,
              "<kv/connector.h>'s kMaxIdBytes must be kvd's bound on ids");
static_assert(kMaxLoadsPerCall == static_cast<size_t>(proto::MAX_LOADS_PER_CALL),
              "connector.h's kMaxLoadsPerCall must be the engine protocol's MAX_LOADS_PER_CALL");

namespace {

Result<int> ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path '" + path + "' is empty or too long");
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IoError(std::string("socket: ") + std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Status s = Status::Unavailable("no kvd at " + path + ": " + std::strerror(errno));
    close(fd);
    return s;
  }
  return fd;
}

constexpr std::string_view kOffloadPrefix = "offload:";

bool IsOffloadId(const std::string& id) {
  return id.starts_with(kOffloadPrefix);
}

Status CheckEngineRequestId(const std::string& id) {
  if (IsOffloadId(id)) {
    return Status::InvalidArgument("request id '" + id + "': ids starting '" +
                                   std::string(kOffloadPrefix) + "' are reserved for offload ops");
  }
  return Status::Ok();
}

Status AlreadyLoading(const std::string& id) {
  return Status::AlreadyExists("request " + id +
                               " is loading on this connector, or finished and not yet collected "
                               "by get_finished");
}

void ToWire(const LoadSpec& load, proto::StartLoad* out) {
  out->set_request_id(load.request);
  out->set_peer_address(load.params.peer_address);
  out->set_tokens(load.params.tokens);
  out->set_mode(load.params.mode == Mode::kPull ? proto::MODE_PULL : proto::MODE_PUSH);
  out->set_transfer_token(load.params.transfer_token);
  out->mutable_block_ids()->Add(load.block_ids.begin(), load.block_ids.end());
}

template <typename Field>
void AddKeys(std::span<const offload::BlockKey> keys, Field* out) {
  for (const auto& key : keys) {
    out->Add(std::string(reinterpret_cast<const char*>(key.bytes().data()), key.bytes().size()));
  }
}

}  // namespace

ConnectorCore::ConnectorCore(std::unique_ptr<Client> client,
                             std::shared_ptr<daemon::Daemon> embedded)
    : embedded_(std::move(embedded)), client_(std::move(client)) {}

ConnectorCore::~ConnectorCore() = default;

Result<std::unique_ptr<ConnectorCore>> ConnectorCore::Connect(
    int fd, ConnectorOptions options, std::shared_ptr<daemon::Daemon> embedded) {
  KV_ASSIGN_OR_RETURN(auto client, Client::Create(fd, options.timeout, options.busy_poll));
  proto::EngineMessage m;
  auto* hello = m.mutable_hello();
  hello->set_protocol_version(proto::PROTOCOL_VERSION);
  hello->set_instance(options.instance);
  hello->set_tp_rank(options.tp_rank);
  hello->set_tp_size(options.tp_size);
  hello->set_offload_namespace(options.offload_namespace);
  KV_RETURN_IF_ERROR(client->Call(std::move(m)).status());
  return std::unique_ptr<ConnectorCore>(new ConnectorCore(std::move(client), std::move(embedded)));
}

Result<std::unique_ptr<ConnectorCore>> ConnectorCore::Open(const std::string& socket_path,
                                                           ConnectorOptions options) {
  KV_ASSIGN_OR_RETURN(int fd, ConnectUnix(socket_path));
  return Connect(fd, std::move(options), nullptr);
}

Result<std::unique_ptr<ConnectorCore>> ConnectorCore::OpenEmbedded(
    std::shared_ptr<daemon::Daemon> daemon, ConnectorOptions options) {
  if (!daemon) return Status::InvalidArgument("OpenEmbedded needs a daemon");
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return Status::IoError(std::string("socketpair: ") + std::strerror(errno));
  }
  Status attached = daemon->AttachEngine(fds[1]);
  if (!attached.ok()) {
    close(fds[0]);
    return attached;
  }
  return Connect(fds[0], std::move(options), std::move(daemon));
}

Result<std::vector<KvCache>> ConnectorCore::RegisterKvCaches(std::span<const KvCacheDesc> caches) {
  if (!region_layers_.empty()) return Status::AlreadyExists("KV caches were already registered");
  if (caches.empty()) return Status::InvalidArgument("no KV caches to register");
  const MemoryLocation where = caches.front().location;
  const bool host = where.kind == MemoryKind::kHost;
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i].location.kind != where.kind) {
      return Status::InvalidArgument("KV cache " + std::to_string(i) +
                                     ": host and GPU caches do not mix in one connector");
    }
  }
  if (!host && embedded_) {
    return Status::Unsupported(
        "GPU caches need kvd in another process: CUDA IPC cannot open memory of its own "
        "process (use Connector::Open, not OpenEmbedded)");
  }
  // Every cache is checked, and its memory found, made or exported, before kvd hears of any.
  struct Planned {
    proto::EngineMessage message;  // its RegisterRegion
    kv::UniqueFd fd;               // sent beside it: a memfd or a VMM allocation's handle
    KvCache cache;
  };
  std::vector<Planned> planned;
  std::vector<kv::SharedMemory> made;
  for (size_t i = 0; i < caches.size(); ++i) {
    const KvCacheDesc& desc = caches[i];
    const std::string which = (host ? "KV cache " : "GPU cache ") + std::to_string(i);
    if (!host && desc.base == nullptr) return Status::InvalidArgument(which + ": base is null");
    if (!host && desc.location.device < 0) {
      return Status::InvalidArgument(which + ": a CUDA region needs a device ordinal, got " +
                                     std::to_string(desc.location.device));
    }
    auto layout = KvRegion::Create(desc.layout);
    if (!layout.ok()) return layout.status().WithContext(which);
    if (!host && (desc.location.device != where.device ||
                  layout->spec().layers != caches.front().layout.layers)) {
      return Status::InvalidArgument(which +
                                     ": every GPU cache must live on one device and have "
                                     "the same layer count");
    }
    Planned p;
    p.cache = KvCache{desc.base,
                      desc.layout.region_bytes > 0 ? static_cast<uint64_t>(desc.layout.region_bytes)
                                                   : layout->span_bytes(),
                      layout->spec(), host ? MemoryLocation::Host() : desc.location};
    auto* reg = p.message.mutable_register_region();
    kv::proto::ToWire(p.cache.layout, reg->mutable_layout());
    reg->set_bytes(p.cache.bytes);
    if (host && desc.base == nullptr) {
      auto memory = kv::SharedMemory::Create(p.cache.bytes, "kv-cache-" + std::to_string(i));
      if (!memory.ok()) return memory.status().WithContext(which);
      KV_ASSIGN_OR_RETURN(p.fd, DuplicateFd(memory->fd()));
      reg->set_object_bytes(memory->size());
      p.cache.base = memory->data();
      made.push_back(std::move(memory).value());
    } else if (host) {
      auto slice = FindHostMemory(desc.base, p.cache.bytes);
      if (!slice.ok()) return slice.status().WithContext(which);
      p.fd = std::move(slice->fd);
      reg->set_object_bytes(slice->allocation_bytes);
      reg->set_offset(slice->offset);
    } else {
      auto exported = kv::gpu::ExportDeviceMemory(desc.base, p.cache.bytes, where.device);
      if (!exported.ok()) return exported.status().WithContext(which);
      reg->mutable_location()->set_device_uuid(exported->device_uuid);
      reg->set_object_bytes(exported->allocation_bytes);
      reg->set_offset(exported->offset);
      // A VMM allocation's fd goes with the message (kvd keeps its own copy); ours closes with
      // `planned`.
      if (exported->kind == kv::gpu::ShareKind::kPosixFd) {
        reg->set_vmm_fd(true);
        p.fd = std::move(exported->fd);
      } else {
        reg->set_cuda_ipc(exported->handle);
      }
    }
    if (host) reg->set_memfd(true);
    planned.push_back(std::move(p));
  }
  // GPU caches: the per-layer events SaveLayer records go with the first region.
  std::unique_ptr<kv::gpu::LayerEvents> events;
  if (!host) {
    const int layers = static_cast<int>(planned.front().cache.layout.layers);
    KV_ASSIGN_OR_RETURN(events, kv::gpu::LayerEvents::Create(where.device, layers));
    auto* first = planned.front().message.mutable_register_region();
    for (const std::string& handle : events->handles()) first->add_layer_events(handle);
  }
  std::vector<KvCache> out;
  for (Planned& p : planned) {
    KV_RETURN_IF_ERROR(client_->Call(std::move(p.message), p.fd.get()).status());
    out.push_back(p.cache);
  }
  layer_events_ = std::move(events);
  for (const KvCache& cache : out) region_layers_.push_back(static_cast<int>(cache.layout.layers));
  region_blocks_ = out.front().layout.blocks;
  for (const KvCache& cache : out) region_blocks_ = std::min(region_blocks_, cache.layout.blocks);
  for (auto& memory : made) memory_.push_back(std::move(memory));
  return out;
}

Status ConnectorCore::SaveLayer(const std::string& request, int layer,
                                std::span<const int64_t> block_ids, void* cuda_stream) {
  KV_RETURN_IF_ERROR(CheckEngineRequestId(request));
  if (region_layers_.empty()) return Status::InvalidArgument("register_kv_caches first");
  if (layer < 0 || layer >= region_layers_.front()) {
    return Status::OutOfRange("layer " + std::to_string(layer) + " out of range [0, " +
                              std::to_string(region_layers_.front()) + ")");
  }
  if (block_ids.empty()) return Status::InvalidArgument("save_layer names no blocks");
  for (int64_t id : block_ids) {
    if (id < 0 || id >= region_blocks_) {
      return Status::OutOfRange("block id " + std::to_string(id) + " out of range [0, " +
                                std::to_string(region_blocks_) + ")");
    }
  }
  KV_RETURN_IF_ERROR(client_->SaveError(request));
  KV_ASSIGN_OR_RETURN(bool written, RecordLayer(layer, cuda_stream));
  return SendSave(request, layer, block_ids, written);
}

Result<bool> ConnectorCore::RecordLayer(int layer, void* cuda_stream) {
  if (!layer_events_) return false;
  KV_ASSIGN_OR_RETURN(bool recorded, layer_events_->RecordIfPending(layer, cuda_stream));
  return !recorded;  // the stream had run everything: the layer is written, no event to wait on
}

namespace {

// A save that leaves its blocks out: kvd takes the ones the request's first save named.
constexpr std::span<const int64_t> kNoBlocks;

proto::EngineMessage SaveMessage(const std::string& request, int layer,
                                 std::span<const int64_t> block_ids, bool written) {
  proto::EngineMessage m;
  auto* save = m.mutable_save_layer();
  save->set_request_id(request);
  save->set_layer(layer);
  save->set_written(written);
  save->mutable_block_ids()->Add(block_ids.begin(), block_ids.end());
  return m;
}

}  // namespace

Status ConnectorCore::SendSave(const std::string& request, int layer,
                               std::span<const int64_t> block_ids, bool written) {
  std::lock_guard<std::mutex> lock(named_mu_);
  const bool repeat = named_.Repeats(request, block_ids);
  Status s = client_->Send(SaveMessage(request, layer, repeat ? kNoBlocks : block_ids, written));
  if (!s.ok()) named_.Forget(request);  // kvd may not have had them
  return s;
}

Result<std::vector<Status>> ConnectorCore::SaveLayers(int layer, std::span<const SaveSpec> saves,
                                                      void* cuda_stream) {
  if (saves.empty()) return Status::InvalidArgument("save_layers names no saves");
  if (region_layers_.empty()) return Status::InvalidArgument("register_kv_caches first");
  if (layer < 0 || layer >= region_layers_.front()) {
    return Status::OutOfRange("layer " + std::to_string(layer) + " out of range [0, " +
                              std::to_string(region_layers_.front()) + ")");
  }
  // One event record for the step's saves: every one of them waits for the same point of the
  // engine's stream.
  KV_ASSIGN_OR_RETURN(bool written, RecordLayer(layer, cuda_stream));
  std::vector<Status> out;
  out.reserve(saves.size());
  std::vector<proto::EngineMessage> messages;
  std::vector<size_t> sent;  // of out: the saves that go out
  std::lock_guard<std::mutex> lock(named_mu_);
  for (const SaveSpec& save : saves) {
    Status s =
        save.request.empty() || save.request.size() > kMaxIdBytes
            ? Status::InvalidArgument("request id of " + std::to_string(save.request.size()) +
                                      " bytes; it must be 1 to 256 bytes")
            : CheckEngineRequestId(save.request);
    if (s.ok() && save.block_ids.empty()) s = Status::InvalidArgument("a save names no blocks");
    for (int64_t id : save.block_ids) {
      if (!s.ok()) break;
      if (id < 0 || id >= region_blocks_) {
        s = Status::OutOfRange("block id " + std::to_string(id) + " out of range [0, " +
                               std::to_string(region_blocks_) + ")");
      }
    }
    if (s.ok()) s = client_->SaveError(save.request);
    if (s.ok()) {
      const bool repeat = named_.Repeats(save.request, save.block_ids);
      messages.push_back(
          SaveMessage(save.request, layer, repeat ? kNoBlocks : save.block_ids, written));
      sent.push_back(out.size());
    }
    out.push_back(std::move(s));
  }
  // The step's saves in one write: kvd takes them in one wake-up, where a write each cost an
  // engine's step one kvd wake-up per request (issue 24: a wave's saves crowd out its loads'
  // hops on a host short of cores).
  const Status s = client_->SendAll(messages);
  for (size_t i : sent) {
    out[i] = s;
    if (!s.ok()) named_.Forget(saves[i].request);  // kvd may not have had them
  }
  return out;
}

Status ConnectorCore::SetTransferToken(const std::string& request,
                                       const std::string& transfer_token) {
  KV_RETURN_IF_ERROR(CheckEngineRequestId(request));
  KV_RETURN_IF_ERROR(client_->SaveError(request));
  proto::EngineMessage m;
  m.mutable_set_transfer_token()->set_request_id(request);
  m.mutable_set_transfer_token()->set_transfer_token(transfer_token);
  return client_->Send(std::move(m));
}

namespace {

proto::EngineMessage FinishMessage(const std::string& request, const std::string& transfer_token) {
  proto::EngineMessage m;
  m.mutable_request_finished()->set_request_id(request);
  m.mutable_request_finished()->set_transfer_token(transfer_token);
  return m;
}

Result<TransferParams> FinishParams(const proto::Reply& reply, const std::string& request,
                                    const std::string& transfer_token) {
  TransferParams params;
  params.peer_name = reply.params().peer_name();
  params.peer_address = reply.params().peer_address();
  params.request_id = reply.params().request_id();
  params.transfer_token = reply.params().transfer_token();
  if (!transfer_token.empty() && params.transfer_token != transfer_token) {
    // A kvd older than RequestFinished.transfer_token issued its own: the decode side, which
    // got the engine's, would be refused.
    return Status::Incompatible("kvd did not take the engine's transfer token for request " +
                                request + ": it is older than this connector");
  }
  params.remote_block_ids.assign(reply.params().remote_block_ids().begin(),
                                 reply.params().remote_block_ids().end());
  return params;
}

}  // namespace

void ConnectorCore::ForgetNamedBlocks(std::span<const std::string> requests) {
  std::lock_guard<std::mutex> lock(named_mu_);
  for (const std::string& request : requests) named_.Forget(request);
}

Result<TransferParams> ConnectorCore::RequestFinished(const std::string& request,
                                                      const std::string& transfer_token) {
  ForgetNamedBlocks({&request, 1});
  auto reply = client_->Call(FinishMessage(request, transfer_token));
  // kvd answers after every save sent before: a save it refused has been heard of by now.
  KV_RETURN_IF_ERROR(client_->TakeSaveError(request));
  if (!reply.ok()) return reply.status();
  return FinishParams(*reply, request, transfer_token);
}

Result<std::vector<Result<TransferParams>>> ConnectorCore::RequestsFinished(
    std::span<const FinishSpec> finishes) {
  if (finishes.empty()) return Status::InvalidArgument("requests_finished names no requests");
  if (finishes.size() > kMaxFinishesPerCall) {
    return Status::InvalidArgument("requests_finished takes at most " +
                                   std::to_string(kMaxFinishesPerCall) + " requests, not " +
                                   std::to_string(finishes.size()));
  }
  std::vector<proto::EngineMessage> messages;
  messages.reserve(finishes.size());
  std::vector<std::string> requests;
  for (const FinishSpec& f : finishes) {
    messages.push_back(FinishMessage(f.request, f.transfer_token));
    requests.push_back(f.request);
  }
  ForgetNamedBlocks(requests);
  std::vector<Result<proto::Reply>> replies = client_->CallAll(messages);
  std::vector<Result<TransferParams>> out;
  out.reserve(finishes.size());
  for (size_t i = 0; i < finishes.size(); ++i) {
    const FinishSpec& f = finishes[i];
    if (Status saved = client_->TakeSaveError(f.request); !saved.ok()) {
      out.emplace_back(std::move(saved));
    } else if (!replies[i].ok()) {
      out.emplace_back(replies[i].status());
    } else {
      out.push_back(FinishParams(*replies[i], f.request, f.transfer_token));
    }
  }
  return out;
}

Status ConnectorCore::StartLoad(const std::string& request, const TransferParams& params,
                                std::span<const int64_t> local_block_ids) {
  KV_RETURN_IF_ERROR(CheckEngineRequestId(request));
  proto::EngineMessage m;
  ToWire(LoadSpec{request, params, local_block_ids}, m.mutable_start_load());
  // Registered before the call: the first LayerReady may overtake the reply.
  if (!client_->ExpectLoad(request, {local_block_ids.begin(), local_block_ids.end()})) {
    return AlreadyLoading(request);
  }
  Status s = client_->Call(std::move(m)).status();
  if (!s.ok()) client_->ForgetLoad(request);
  return s;
}

Result<std::vector<Status>> ConnectorCore::StartLoads(std::span<const LoadSpec> loads) {
  if (loads.empty()) return Status::InvalidArgument("start_loads names no loads");
  // kvd would refuse it whole too, but only after every load was tracked here and sent.
  if (loads.size() > kMaxLoadsPerCall) {
    return Status::InvalidArgument("start_loads takes at most " + std::to_string(kMaxLoadsPerCall) +
                                   " loads, not " + std::to_string(loads.size()));
  }
  std::vector<Status> results(loads.size());
  std::vector<size_t> sent;  // indices into `loads` of the message's loads, in its order
  proto::EngineMessage m;
  for (size_t i = 0; i < loads.size(); ++i) {
    const LoadSpec& load = loads[i];
    results[i] = CheckEngineRequestId(load.request);
    // Registered before the call: the first LayerReady may overtake the reply. A second load of
    // one id (tracked already, perhaps by this batch) would share the first's events and forget
    // them if refused.
    if (results[i].ok() &&
        !client_->ExpectLoad(load.request, {load.block_ids.begin(), load.block_ids.end()})) {
      const bool in_batch = std::any_of(sent.begin(), sent.end(),
                                        [&](size_t k) { return loads[k].request == load.request; });
      results[i] = in_batch ? Status::InvalidArgument("request " + load.request +
                                                      " appears more than once in one start_loads")
                            : AlreadyLoading(load.request);
    }
    if (!results[i].ok()) continue;
    ToWire(load, m.mutable_start_loads()->add_loads());
    sent.push_back(i);
  }
  if (sent.empty()) return results;
  auto reply = client_->Call(std::move(m));
  Status error = reply.status();
  if (error.ok() && reply->loads().errors_size() != static_cast<int>(sent.size())) {
    error = Status::Internal("kvd answered " + std::to_string(reply->loads().errors_size()) +
                             " results for " + std::to_string(sent.size()) + " loads");
  }
  for (size_t k = 0; k < sent.size(); ++k) {
    const size_t i = sent[k];
    if (error.ok()) results[i] = kv::proto::FromWire(reply->loads().errors(static_cast<int>(k)));
    if (!error.ok() || !results[i].ok()) client_->ForgetLoad(loads[i].request);
  }
  if (!error.ok()) return error;
  return results;
}

Status ConnectorCore::WaitLayer(const std::string& request, int layer) {
  return client_->WaitLayer(request, layer);
}

Finished ConnectorCore::GetFinished() {
  // Held across TakeFinished: an op the client forgets is in done_offloads_ before a waiter
  // that missed it in the client looks there.
  std::lock_guard lock(offload_mu_);
  Finished finished = client_->TakeFinished();
  std::erase_if(finished.received, [this](const std::string& id) {
    if (!IsOffloadId(id)) return false;
    if (live_offloads_.count(id)) done_offloads_.insert(id);
    return true;
  });
  return finished;
}

std::vector<int64_t> ConnectorCore::GetFailedBlocks() {
  return client_->TakeFailedBlocks();
}

Status ConnectorCore::TakeFailedBlocksInto(std::span<int64_t> out, size_t* count) {
  return client_->TakeFailedBlocksInto(out, count);
}

Status ConnectorCore::LoadError(const std::string& request) {
  return client_->LoadError(request);
}

Result<proto::DaemonStatus> ConnectorCore::DaemonStatus() {
  proto::EngineMessage m;
  m.mutable_status();
  KV_ASSIGN_OR_RETURN(proto::Reply reply, client_->Call(std::move(m)));
  return reply.status();
}

Result<std::string> ConnectorCore::DaemonStatusJson() {
  KV_ASSIGN_OR_RETURN(proto::DaemonStatus status, DaemonStatus());
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  auto s = google::protobuf::util::MessageToJsonString(status, &json, options);
  if (!s.ok()) return Status::Internal("status as JSON: " + std::string(s.message()));
  return json;
}

// ---- CPU offload
// ----------------------------------------------------------------------------------

Result<int> ConnectorCore::RegionLayers(uint32_t region) const {
  if (region >= region_layers_.size()) {
    return Status::OutOfRange("region " + std::to_string(region) + " is not registered (" +
                              std::to_string(region_layers_.size()) + " regions)");
  }
  return region_layers_[region];
}

Result<OffloadStored> ConnectorCore::OffloadStore(std::span<const offload::BlockKey> keys,
                                                  std::span<const int64_t> block_ids,
                                                  uint32_t region, void* cuda_stream) {
  KV_ASSIGN_OR_RETURN(int layers, RegionLayers(region));
  // kvd orders the copy after this record (daemon/offload_service.cc).
  if (layer_events_) KV_RETURN_IF_ERROR(layer_events_->Record(layers - 1, cuda_stream));
  const std::string id = std::string(kOffloadPrefix) + std::to_string(next_offload_++);
  proto::EngineMessage m;
  auto* store = m.mutable_offload_store();
  store->set_request_id(id);
  store->set_region_id(region);
  AddKeys(keys, store->mutable_keys());
  store->mutable_block_ids()->Add(block_ids.begin(), block_ids.end());
  {
    std::lock_guard lock(offload_mu_);
    live_offloads_.insert(id);
  }
  // A store's failure leaves the engine's blocks as they were: no blocks to report as failed.
  client_->ExpectLoad(id, {});
  OffloadStored out;
  out.op = OffloadOp(this, id, 0);  // from here on, an error forgets the op
  KV_ASSIGN_OR_RETURN(proto::Reply reply, client_->Call(std::move(m)));
  const proto::OffloadResult& r = reply.offload();
  out.stored = r.stored();
  out.already_present = r.already_present();
  out.bytes = r.bytes();
  out.runs = r.runs();
  for (const std::string& bytes : r.evicted()) {
    auto key = offload::BlockKey::FromBytes(
        {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    if (!key.ok()) return key.status().WithContext("kvd reported an evicted key");
    out.evicted.push_back(*key);
  }
  return out;
}

Result<size_t> ConnectorCore::OffloadLookup(std::span<const offload::BlockKey> keys,
                                            uint32_t region) {
  proto::EngineMessage m;
  m.mutable_offload_lookup()->set_region_id(region);
  AddKeys(keys, m.mutable_offload_lookup()->mutable_keys());
  KV_ASSIGN_OR_RETURN(proto::Reply reply, client_->Call(std::move(m)));
  if (reply.offload().hits() > keys.size()) {
    return Status::Internal("kvd reported more hits than keys asked for");
  }
  return static_cast<size_t>(reply.offload().hits());
}

Result<std::vector<KeyState>> ConnectorCore::OffloadProbe(std::span<const offload::BlockKey> keys,
                                                          uint32_t region) {
  proto::EngineMessage m;
  m.mutable_offload_lookup()->set_region_id(region);
  m.mutable_offload_lookup()->set_per_key(true);
  AddKeys(keys, m.mutable_offload_lookup()->mutable_keys());
  KV_ASSIGN_OR_RETURN(proto::Reply reply, client_->Call(std::move(m)));
  if (static_cast<size_t>(reply.offload().key_states_size()) != keys.size()) {
    return Status::Internal("kvd answered " + std::to_string(reply.offload().key_states_size()) +
                            " key states for " + std::to_string(keys.size()) + " keys");
  }
  std::vector<KeyState> states;
  for (int state : reply.offload().key_states()) {
    states.push_back(state == proto::KEY_READY     ? KeyState::kReady
                     : state == proto::KEY_STORING ? KeyState::kStoring
                                                   : KeyState::kAbsent);
  }
  return states;
}

Result<OffloadLoaded> ConnectorCore::OffloadLoad(std::span<const offload::BlockKey> keys,
                                                 std::span<const int64_t> block_ids, bool per_layer,
                                                 uint32_t region,
                                                 std::vector<MissingKey>* missing) {
  KV_ASSIGN_OR_RETURN(int layers, RegionLayers(region));
  const std::string id = std::string(kOffloadPrefix) + std::to_string(next_offload_++);
  proto::EngineMessage m;
  auto* load = m.mutable_offload_load();
  load->set_request_id(id);
  load->set_region_id(region);
  load->set_per_layer(per_layer);
  AddKeys(keys, load->mutable_keys());
  load->mutable_block_ids()->Add(block_ids.begin(), block_ids.end());
  {
    std::lock_guard lock(offload_mu_);
    live_offloads_.insert(id);
  }
  // Registered before the call: the first layer may land before the reply is read.
  client_->ExpectLoad(id, {block_ids.begin(), block_ids.end()});
  OffloadLoaded out;
  out.op = OffloadOp(this, id, layers - 1);
  auto reply = client_->Call(std::move(m));
  if (!reply.ok()) {
    if (reply.status().code() == Code::kNotFound && missing != nullptr) {
      missing->clear();
      auto states = OffloadProbe(keys, region);
      for (size_t i = 0; states.ok() && i < states->size(); ++i) {
        if ((*states)[i] != KeyState::kReady) missing->push_back({i, (*states)[i]});
      }
    }
    return reply.status();
  }
  out.bytes = reply->offload().bytes();
  out.runs = reply->offload().runs();
  out.per_layer = reply->offload().per_layer();
  return out;
}

Status ConnectorCore::WaitOffload(const std::string& id, int layer) {
  Status s = client_->WaitLayer(id, layer);
  if (s.code() != Code::kNotFound) return s;
  // The client forgot the op: GetFinished() took it as done, or GetFailedBlocks() as failed.
  std::lock_guard lock(offload_mu_);
  if (done_offloads_.count(id)) return Status::Ok();
  return Status::Aborted("offload op " + id +
                         " failed; a load's blocks were reported by GetFailedBlocks()");
}

void ConnectorCore::ForgetOffload(const std::string& id) {
  client_->ForgetLoad(id);
  std::lock_guard lock(offload_mu_);
  live_offloads_.erase(id);
  done_offloads_.erase(id);
}

OffloadOp::OffloadOp(OffloadOp&& other) noexcept {
  *this = std::move(other);
}

OffloadOp& OffloadOp::operator=(OffloadOp&& other) noexcept {
  if (this != &other) {
    Forget();
    owner_ = std::exchange(other.owner_, nullptr);
    id_ = std::move(other.id_);
    last_layer_ = other.last_layer_;
  }
  return *this;
}

OffloadOp::~OffloadOp() {
  Forget();
}

void OffloadOp::Forget() {
  if (owner_ != nullptr) owner_->ForgetOffload(id_);
  owner_ = nullptr;
}

Status OffloadOp::Wait() {
  return WaitLayer(last_layer_);
}

Status OffloadOp::WaitLayer(int layer) {
  if (owner_ == nullptr) return Status::InvalidArgument("offload op handle is empty");
  if (layer < 0 || layer > last_layer_) {
    return Status::OutOfRange("layer " + std::to_string(layer) + " of offload op " + id_ +
                              " outside [0, " + std::to_string(last_layer_ + 1) + ")");
  }
  return owner_->WaitOffload(id_, layer);
}

Result<proto::DaemonStatus> QueryDaemonStatus(const std::string& socket_path,
                                              std::chrono::milliseconds timeout) {
  KV_ASSIGN_OR_RETURN(int fd, ConnectUnix(socket_path));
  KV_ASSIGN_OR_RETURN(auto client, ConnectorCore::Client::Create(fd, timeout));
  proto::EngineMessage m;
  m.mutable_status();
  KV_ASSIGN_OR_RETURN(proto::Reply reply, client->Call(std::move(m)));
  return reply.status();
}

}  // namespace kv::connector
