// The engine protocol: one Connection per local engine (connector), over the unix socket or an
// embedded socketpair. Every message is answered with a Reply carrying its seq.
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/core.h"
#include "protocol/wire_layout.h"

namespace kv::daemon {

void Daemon::Core::ServeEngine(int fd, bool check_credentials) {
  if (check_credentials) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != getuid()) {
      spdlog::warn("kvd {}: refused an engine connection from uid {}", options_.name, cred.uid);
      close(fd);
      return;
    }
  }
  const uint64_t id = next_id_++;
  Engine& engine = registry_.Add(id);
  engine.conn = Connection::Adopt(io_, fd, EngineLimits(), "engine " + std::to_string(id));
  engine.conn->Start(
      [this, id](std::string body) {
        OnEngineMessage(id, body);
        send_queue_->FlushIfDue();
      },
      [this, id](const Status& why) { OnEngineClosed(id, why); });
}

void Daemon::Core::ReplyToEngine(Engine& engine, uint64_t seq, const Status& status,
                                 proto::Reply* payload) {
  proto::DaemonMessage message;
  message.set_seq(seq);
  proto::Reply* reply = message.mutable_reply();
  if (payload != nullptr) reply->Swap(payload);
  if (!status.ok()) ToWire(status, reply->mutable_error());
  (void)engine.conn->Send(message);
}

void Daemon::Core::SendToEngine(uint64_t engine_id, const proto::DaemonMessage& message) {
  if (Engine* engine = FindEngine(engine_id)) (void)engine->conn->Send(message);
}

void Daemon::Core::OnEngineMessage(uint64_t engine_id, const std::string& body) {
  Engine* engine = FindEngine(engine_id);
  if (engine == nullptr) return;
  if (Hold(engine->held, *engine->conn, body)) return;
  proto::EngineMessage m;
  if (!m.ParseFromString(body)) {
    engine->conn->Close(Status::InvalidArgument(engine->conn->label() + ": malformed message"));
    return;
  }
  if (draining_) {
    ReplyToEngine(*engine, m.seq(), Status::Unavailable("kvd " + options_.name + " is stopping"));
    return;
  }
  if (m.body_case() == proto::EngineMessage::kStatus) {
    proto::Reply reply;
    *reply.mutable_status() = BuildStatus();
    ReplyToEngine(*engine, m.seq(), Status::Ok(), &reply);
    return;
  }
  if (m.body_case() == proto::EngineMessage::kHello) {
    ReplyToEngine(*engine, m.seq(), HandleHello(*engine, m.hello()));
    return;
  }
  if (!engine->hello) {
    // Nothing but hello and status before a hello: close, the stream is not one of ours.
    engine->conn->Close(Status::InvalidArgument(engine->conn->label() + ": message before hello"));
    return;
  }
  // A handler may fail this engine and erase it (a send to it that overflows its backlog closes
  // it): the reply looks the engine up again.
  auto reply_to = [&](const Status& status, proto::Reply* payload = nullptr) {
    if (Engine* e = FindEngine(engine_id)) ReplyToEngine(*e, m.seq(), status, payload);
  };
  switch (m.body_case()) {
    case proto::EngineMessage::kRegisterRegion: {
      // Answered once the setup worker opened and registered the memory (RegisterDone).
      const Status s = StartRegister(*engine, m.seq(), m.register_region());
      if (!s.ok()) reply_to(s);
      return;
    }
    case proto::EngineMessage::kSaveLayer: {
      const Status saved = scheduler_->SaveLayer(*engine, m.save_layer());
      if (m.seq() != 0) {
        reply_to(saved);
      } else if (!saved.ok()) {
        scheduler_->FailSave(engine_id, m.save_layer().request_id(), saved);
      }
      return;
    }
    case proto::EngineMessage::kSetTransferToken: {
      // One-way from the connector, as a save: a token kvd refuses fails the request.
      const proto::SetTransferToken& set = m.set_transfer_token();
      const Status fixed = scheduler_->SetTransferToken(*engine, set);
      if (!fixed.ok()) {
        scheduler_->FailSave(engine_id, set.request_id(), fixed, "set_transfer_token");
      }
      if (m.seq() != 0) reply_to(fixed);
      return;
    }
    case proto::EngineMessage::kRequestFinished: {
      auto params = scheduler_->RequestFinished(*engine, m.request_finished());
      proto::Reply reply;
      if (params.ok()) *reply.mutable_params() = std::move(*params);
      reply_to(params.status(), &reply);
      return;
    }
    // The engine hears back first, then the completed requests' Wants leave (RequestGathered).
    case proto::EngineMessage::kStartLoad:
      reply_to(scheduler_->StartLoad(*engine, m.start_load()));
      scheduler_->RequestGathered();
      return;
    case proto::EngineMessage::kStartLoads: {
      auto results = StartLoads(engine_id, m.start_loads());
      proto::Reply reply;
      if (results.ok()) *reply.mutable_loads() = std::move(*results);
      reply_to(results.status(), &reply);
      scheduler_->RequestGathered();
      return;
    }
    case proto::EngineMessage::kOffloadStore:
    case proto::EngineMessage::kOffloadLookup:
    case proto::EngineMessage::kOffloadLoad: {
      auto result = m.has_offload_store()    ? offload_->Store(*engine, m.offload_store())
                    : m.has_offload_lookup() ? offload_->Lookup(*engine, m.offload_lookup())
                                             : offload_->Load(*engine, m.offload_load());
      proto::Reply reply;
      if (result.ok()) *reply.mutable_offload() = std::move(*result);
      reply_to(result.status(), &reply);
      return;
    }
    default:
      engine->conn->Close(Status::InvalidArgument(engine->conn->label() + ": unknown message"));
  }
}

Status Daemon::Core::HandleHello(Engine& engine, const proto::EngineHello& hello) {
  if (hello.protocol_version() < proto::OLDEST_ENGINE_PROTOCOL ||
      hello.protocol_version() > proto::PROTOCOL_VERSION) {
    return Status::Incompatible("engine speaks protocol " +
                                std::to_string(hello.protocol_version()) + ", kvd speaks " +
                                std::to_string(proto::OLDEST_ENGINE_PROTOCOL) + " to " +
                                std::to_string(proto::PROTOCOL_VERSION));
  }
  if (engine.hello) return Status::AlreadyExists("hello sent twice");
  if (hello.tp_size() < 1 || hello.tp_size() > kMaxTpSize || hello.tp_rank() < 0 ||
      hello.tp_rank() >= hello.tp_size()) {
    return Status::InvalidArgument("TP rank " + std::to_string(hello.tp_rank()) + " of " +
                                   std::to_string(hello.tp_size()) + " is not valid");
  }
  if (hello.instance().empty() || hello.instance().size() > kMaxRequestIdBytes) {
    return Status::InvalidArgument("instance name must have 1 to 256 bytes");
  }
  if (registry_.HasRank(hello.instance(), hello.tp_rank())) {
    return Status::AlreadyExists("instance " + hello.instance() + " rank " +
                                 std::to_string(hello.tp_rank()) + " is already connected");
  }
  engine.hello = true;
  engine.instance = hello.instance();
  if (hello.offload_namespace().size() > kMaxRequestIdBytes) {
    return Status::InvalidArgument("offload namespace must have at most 256 bytes");
  }
  engine.offload_namespace =
      hello.offload_namespace().empty() ? hello.instance() : hello.offload_namespace();
  engine.tp_rank = hello.tp_rank();
  engine.tp_size = hello.tp_size();
  spdlog::info("kvd {}: engine {} rank {}/{} connected", options_.name, engine.instance,
               engine.tp_rank, engine.tp_size);
  return Status::Ok();
}

Result<proto::LoadResults> Daemon::Core::StartLoads(uint64_t engine_id,
                                                    const proto::StartLoads& batch) {
  if (batch.loads().empty()) return Status::InvalidArgument("start_loads names no loads");
  if (batch.loads_size() > proto::MAX_LOADS_PER_CALL) {
    return Status::InvalidArgument("start_loads takes at most " +
                                   std::to_string(proto::MAX_LOADS_PER_CALL) + " loads, not " +
                                   std::to_string(batch.loads_size()));
  }
  Trace("loads", batch.loads(0).request_id(), -1, static_cast<uint64_t>(batch.loads_size()));
  proto::LoadResults results;
  for (const proto::StartLoad& load : batch.loads()) {
    Engine* engine = FindEngine(engine_id);
    const Status s = engine != nullptr
                         ? scheduler_->StartLoad(*engine, load)
                         : Status::Aborted("the engine's connection closed during start_loads");
    ToWire(s, results.add_errors());
  }
  return results;
}

namespace {

// A registration's checks before its memory is opened: the share against the location and the
// fd that came with it, the layout the engine declares, that the region lies inside its memory
// object and holds its layout, that it agrees with the engine's earlier regions (layer count,
// memory kind), and the layer events a GPU engine's first region carries.
Result<KvRegion> CheckRegistration(const Engine& engine, const proto::RegisterRegion& reg,
                                   bool with_fd) {
  using Share = proto::RegisterRegion;
  const bool host = reg.location().device_uuid().empty();
  if (reg.share_case() == Share::SHARE_NOT_SET) {
    return Status::InvalidArgument("RegisterRegion names no share (memfd, cuda_ipc or vmm_fd)");
  }
  if (host != (reg.share_case() == Share::kMemfd)) {
    return Status::InvalidArgument(host ? "host memory is shared as a memfd"
                                        : "GPU memory is shared through cuda_ipc or vmm_fd");
  }
  const bool wants_fd = reg.share_case() != Share::kCudaIpc;
  if (with_fd != wants_fd) {
    return Status::InvalidArgument(wants_fd ? "RegisterRegion came without its memory object's fd"
                                            : "a cuda_ipc RegisterRegion came with an fd");
  }
  if (reg.share_case() == Share::kCudaIpc && reg.cuda_ipc().size() != gpu::kIpcHandleBytes) {
    return Status::InvalidArgument("GPU region's IPC handle has " +
                                   std::to_string(reg.cuda_ipc().size()) + " bytes, not " +
                                   std::to_string(gpu::kIpcHandleBytes));
  }
  if (engine.regions.size() >= static_cast<size_t>(kMaxRegionsPerEngine)) {
    return Status::ResourceExhausted("an engine registers at most " +
                                     std::to_string(kMaxRegionsPerEngine) + " regions");
  }
  auto layout = FromWire(reg.layout());
  if (!layout.ok()) return layout.status().WithContext("region layout");
  if (layout->spec().tp_rank != engine.tp_rank || layout->spec().tp_size != engine.tp_size) {
    return Status::InvalidArgument(
        "region layout says TP rank " + std::to_string(layout->spec().tp_rank) + " of " +
        std::to_string(layout->spec().tp_size) + ", the engine said " +
        std::to_string(engine.tp_rank) + " of " + std::to_string(engine.tp_size));
  }
  if (reg.offset() > reg.object_bytes() || reg.bytes() > reg.object_bytes() - reg.offset()) {
    return Status::OutOfRange("region of " + std::to_string(reg.bytes()) + " bytes at offset " +
                              std::to_string(reg.offset()) + " runs past its memory object of " +
                              std::to_string(reg.object_bytes()) + " bytes");
  }
  if (reg.bytes() < layout->span_bytes()) {
    return Status::OutOfRange("region of " + std::to_string(reg.bytes()) +
                              " bytes cannot hold its layout's " +
                              std::to_string(layout->span_bytes()) + " bytes");
  }
  const int64_t layers = layout->spec().layers;
  if (!engine.regions.empty()) {
    const Region& first = *engine.regions.front();
    if (first.layout.spec().layers != layers) {
      return Status::Incompatible("every region of an engine must have the same layer count (" +
                                  std::to_string(first.layout.spec().layers) + " vs " +
                                  std::to_string(layers) + ")");
    }
    if ((first.where.kind == MemoryKind::kHost) != host) {
      return Status::Incompatible("an engine registers host caches or GPU caches, not both");
    }
  }
  const bool wants_events = !host && engine.regions.empty();
  if (!wants_events && reg.layer_events_size() > 0) {
    return Status::InvalidArgument(host ? "host regions have no layer events"
                                        : "layer events come with the engine's first GPU region");
  }
  if (wants_events && reg.layer_events_size() != layers) {
    return Status::InvalidArgument(std::to_string(reg.layer_events_size()) + " layer events for " +
                                   std::to_string(layers) + " layers");
  }
  return layout;
}

// Bytes the engines of `instance` have registered (Region::bytes, what kvd maps or opened).
uint64_t InstanceBytes(const std::map<uint64_t, Engine>& engines, const std::string& instance) {
  uint64_t n = 0;
  for (const auto& [id, engine] : engines) {
    if (engine.instance != instance) continue;
    for (const auto& region : engine.regions) n += region->bytes;
  }
  return n;
}

// Issue 19: one instance's registrations (all its ranks) stay within `limit`
// (--max-registered-bytes).
Status CheckRegisteredBytes(uint64_t registered, uint64_t adding, uint64_t limit,
                            const std::string& instance) {
  if (adding <= limit && registered <= limit - adding) return Status::Ok();
  return Status::ResourceExhausted("engine instance '" + instance + "' would register " +
                                   std::to_string(registered) + " + " + std::to_string(adding) +
                                   " bytes, above this kvd's limit of " + std::to_string(limit) +
                                   " bytes per instance (kvd --max-registered-bytes)");
}

}  // namespace

Status Daemon::Core::StartRegister(Engine& engine, uint64_t seq, const proto::RegisterRegion& reg) {
  // The fd arrived with this message's bytes, or none did; claimed first so that it is closed
  // on every path.
  kv::UniqueFd fd(engine.conn->TakeFd());
  KV_ASSIGN_OR_RETURN(KvRegion layout, CheckRegistration(engine, reg, fd.valid()));
  // What kvd will map (a host region: its layout's span) or open (a GPU region: its bytes).
  const uint64_t adding = reg.has_memfd() ? layout.span_bytes() : reg.bytes();
  if (Status s = CheckRegisteredBytes(InstanceBytes(registry_.engines(), engine.instance), adding,
                                      options_.max_registered_bytes, engine.instance);
      !s.ok()) {
    ++registrations_refused_;
    return s;
  }
  if (!reg.has_memfd() && !transport_->supports(MemoryKind::kCuda)) {
    return Status::Unsupported("kvd " + options_.name + "'s transport " +
                               std::string(transport_->name()) +
                               " cannot reach GPU memory (start kvd with --transport ipc, nccl "
                               "or ucx)");
  }
  // Opening and registering a slab takes from milliseconds (a memfd's pages) to seconds (CUDA
  // IPC, pinning): off the io thread, with this engine's later messages held until it is done.
  const int first_device = engine.regions.empty() ? -1 : engine.regions.front()->where.device;
  auto work = [this, reg, layout = std::move(layout),
               fd = std::make_shared<UniqueFd>(std::move(fd)),
               first_device]() -> Result<OpenedRegion> {
    return OpenRegion(reg, layout, std::move(*fd), first_device);
  };
  auto done = [this, id = engine.id, seq](Result<OpenedRegion> opened) {
    RegisterDone(id, seq, std::move(opened));
  };
  KV_RETURN_IF_ERROR(setup_->Submit<OpenedRegion>(Clock::now() + options_.lease, std::move(work),
                                                  std::move(done)));
  engine.held.busy = true;
  return Status::Ok();
}

// The setup worker's thread: touches nothing of the Core but its options and the transport
// (thread-safe).
Result<OpenedRegion> Daemon::Core::OpenRegion(const proto::RegisterRegion& reg,
                                              const KvRegion& layout, UniqueFd fd,
                                              int first_device) {
  OpenedRegion out;
  auto region = std::make_shared<Region>();
  region->layout = layout;
  if (reg.has_memfd()) {
    // kvd populates what it maps, so it maps the layout's span alone: a 1 KiB layout that names
    // a 1 GiB memfd (sparse, or other caches of the engine sharing it) costs kvd 1 KiB of pages.
    // Adopt bounds it by the object's real size.
    KV_ASSIGN_OR_RETURN(
        region->host, SharedMemory::Adopt(fd.release(), region->layout.span_bytes(), reg.offset()));
    region->base = region->host.data();
    region->bytes = region->host.size();
    region->where = MemoryLocation::Host();
  } else {
    auto device = gpu::DeviceWithUuid(reg.location().device_uuid());
    if (!device.ok()) return device.status().WithContext("GPU region");
    if (first_device >= 0 && first_device != *device) {
      return Status::InvalidArgument("every GPU cache of an engine must live on one device");
    }
    auto mapping = reg.has_vmm_fd()
                       ? gpu::OpenVmmMemory(std::move(fd), reg.object_bytes(), *device, *device)
                       : gpu::OpenIpcMemory(reg.cuda_ipc(), *device);
    if (!mapping.ok()) return mapping.status().WithContext("opening the engine's GPU region");
    // What the driver says the allocation spans, not what the engine claimed, bounds the region.
    const uint64_t mapped = (*mapping)->bytes();
    if (reg.offset() > mapped || reg.bytes() > mapped - reg.offset()) {
      return Status::OutOfRange("GPU region of " + std::to_string(reg.bytes()) +
                                " bytes at offset " + std::to_string(reg.offset()) +
                                " runs past the " + std::to_string(mapped) + " bytes kvd opened");
    }
    if (reg.layer_events_size() > 0) {
      std::vector<std::string> handles(reg.layer_events().begin(), reg.layer_events().end());
      KV_ASSIGN_OR_RETURN(out.events, gpu::ImportedLayerEvents::Import(handles, *device));
    }
    region->base = static_cast<char*>((*mapping)->base()) + reg.offset();
    region->bytes = reg.bytes();
    region->where = MemoryLocation::Cuda(*device);
    region->gpu = std::move(mapping).value();
  }
  // A host region names its memfd: a backend that maps peers' memory (host_ipc) shares it.
  const transport::Transport::SharedObject object =
      region->host.fd() >= 0 ? transport::Transport::SharedObject{region->host.fd(), reg.offset()}
                             : transport::Transport::SharedObject{};
  KV_ASSIGN_OR_RETURN(
      region->registration,
      transport_->register_shared_memory(region->base, region->bytes, region->where, object));
  // Peers write into it only what a request granted them (write_grants.h).
  if (region->where.kind == MemoryKind::kHost) {
    KV_RETURN_IF_ERROR(transport_->guard_writes(*region->registration));
  }
  out.vmm = reg.has_vmm_fd();
  out.region = std::move(region);
  return out;
}

void Daemon::Core::RegisterDone(uint64_t engine_id, uint64_t seq, Result<OpenedRegion> opened) {
  Engine* engine = FindEngine(engine_id);
  if (engine == nullptr) return;  // left meanwhile: what was opened closes here
  proto::Reply reply;
  if (opened.ok()) {
    // Checked again now that it is open: another rank of the instance may have registered
    // meanwhile. A refused region closes here.
    Status within = CheckRegisteredBytes(InstanceBytes(registry_.engines(), engine->instance),
                                         opened->region->bytes, options_.max_registered_bytes,
                                         engine->instance);
    if (!within.ok()) {
      ++registrations_refused_;
      opened = within;
    }
  }
  if (opened.ok()) {
    std::shared_ptr<Region>& region = opened->region;
    if (region->gpu) {
      spdlog::info(
          "kvd {}: engine {} rank {} registered a GPU region of {} bytes on device {} ({})",
          options_.name, engine->instance, engine->tp_rank, region->bytes, region->where.device,
          opened->vmm ? "VMM fd" : "CUDA IPC");
    }
    if (opened->events) engine->layer_events = std::move(opened->events);
    engine->regions.push_back(std::move(region));
    reply.set_region_id(static_cast<uint32_t>(engine->regions.size() - 1));
  }
  ReplyToEngine(*engine, seq, opened.status(), &reply);
  ReleaseEngine(engine_id);
}

void Daemon::Core::ReleaseEngine(uint64_t engine_id) {
  if (Engine* p = FindEngine(engine_id)) p->held.busy = false;
  // Looked up again after each message: its handler may close the connection, or start another
  // setup step (which releases the rest when it is done).
  for (Engine* p = FindEngine(engine_id);
       p != nullptr && !p->held.busy && !p->held.messages.empty(); p = FindEngine(engine_id)) {
    std::string body = std::move(p->held.messages.front());
    p->held.messages.pop_front();
    p->held.bytes -= body.size();
    OnEngineMessage(engine_id, body);
    send_queue_->FlushIfDue();
  }
}

void Daemon::Core::OnEngineClosed(uint64_t engine_id, const Status& why) {
  Engine* engine = FindEngine(engine_id);
  if (engine == nullptr) return;
  if (why.ok()) {
    spdlog::info("kvd {}: engine {} rank {} disconnected", options_.name, engine->instance,
                 engine->tp_rank);
  } else {
    spdlog::warn("kvd {}: closed engine {}: {}", options_.name, engine->instance, why.ToString());
  }
  scheduler_->FailRequestsOfEngine(
      engine_id, Status::Aborted("engine " + engine->instance + " rank " +
                                 std::to_string(engine->tp_rank) + " disconnected"));
  registry_.Remove(engine_id);
}

}  // namespace kv::daemon
