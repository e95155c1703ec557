// GPU engines in kvd: their KV caches opened through CUDA IPC (cudaMalloc memory) or their VMM
// allocations' fds, their per-layer events, and batches out of their regions held until those
// events fired (daemon/event_gate.h).
#include <spdlog/spdlog.h>

#include "daemon/core.h"

namespace kv::daemon {


Result<uint32_t> Daemon::Core::HandleRegisterGpu(Engine& engine,
                                                 const proto::RegisterGpuRegion& reg) {
  // An fd arrived with this message's bytes, or none did; claimed first so that it is closed on
  // every path.
  kv::UniqueFd fd(engine.conn->TakeFd());
  const bool vmm = reg.share() == proto::GPU_SHARE_POSIX_FD;
  if (!vmm && reg.share() != proto::GPU_SHARE_CUDA_IPC) {
    return Status::InvalidArgument("GPU region of unknown share kind " +
                                   std::to_string(static_cast<int>(reg.share())));
  }
  if (vmm != fd.valid()) {
    return Status::InvalidArgument(vmm ? "VMM GPU region came without its allocation's fd"
                                       : "CUDA IPC GPU region came with an fd");
  }
  if (!transport_->supports(MemoryKind::kCuda)) {
    return Status::Unsupported("kvd " + options_.name + "'s transport " +
                               std::string(transport_->name()) +
                               " cannot reach GPU memory (start kvd with --transport ipc, nccl "
                               "or ucx)");
  }
  KV_ASSIGN_OR_RETURN(KvRegion layout,
                      CheckRegistration(engine, reg.layout(), reg.bytes(), MemoryKind::kCuda));
  if (!vmm && reg.ipc_handle().size() != gpu::kIpcHandleBytes) {
    return Status::InvalidArgument("GPU region's IPC handle has " +
                                   std::to_string(reg.ipc_handle().size()) + " bytes, not " +
                                   std::to_string(gpu::kIpcHandleBytes));
  }
  if (reg.offset() > reg.allocation_bytes() ||
      reg.bytes() > reg.allocation_bytes() - reg.offset()) {
    return Status::OutOfRange("GPU region of " + std::to_string(reg.bytes()) + " bytes at offset " +
                              std::to_string(reg.offset()) + " runs past its allocation of " +
                              std::to_string(reg.allocation_bytes()) + " bytes");
  }
  auto device = gpu::DeviceWithUuid(reg.device_uuid());
  if (!device.ok()) return device.status().WithContext("GPU region");
  if (!engine.regions.empty() && engine.regions.front()->where.device != *device) {
    return Status::InvalidArgument("every GPU cache of an engine must live on one device");
  }
  auto mapping = vmm ? gpu::OpenVmmMemory(std::move(fd), reg.allocation_bytes(), *device, *device)
                     : gpu::OpenIpcMemory(reg.ipc_handle(), *device);
  if (!mapping.ok()) return mapping.status().WithContext("opening the engine's GPU region");
  // What the driver says the allocation spans, not what the engine claimed, bounds the region.
  const uint64_t mapped = (*mapping)->bytes();
  if (reg.offset() > mapped || reg.bytes() > mapped - reg.offset()) {
    return Status::OutOfRange("GPU region of " + std::to_string(reg.bytes()) + " bytes at offset " +
                              std::to_string(reg.offset()) + " runs past the " +
                              std::to_string(mapped) + " bytes kvd opened");
  }
  auto region = std::make_shared<Region>();
  region->layout = std::move(layout);
  region->base = static_cast<char*>((*mapping)->base()) + reg.offset();
  region->bytes = reg.bytes();
  region->where = MemoryLocation::Cuda(*device);
  region->gpu = std::move(mapping).value();
  KV_ASSIGN_OR_RETURN(region->registration,
                      transport_->register_memory(region->base, region->bytes, region->where));
  spdlog::info("kvd {}: engine {} rank {} registered a GPU region of {} bytes on device {} ({})",
               options_.name, engine.instance, engine.tp_rank, region->bytes, *device,
               vmm ? "VMM fd" : "CUDA IPC");
  engine.regions.push_back(std::move(region));
  return static_cast<uint32_t>(engine.regions.size() - 1);
}

Status Daemon::Core::HandleLayerEvents(Engine& engine, const proto::RegisterLayerEvents& m) {
  if (engine.layer_events) return Status::AlreadyExists("layer events were registered already");
  if (engine.regions.empty() || engine.regions.front()->where.kind != MemoryKind::kCuda) {
    return Status::InvalidArgument("layer events follow the engine's GPU caches");
  }
  const Region& first = *engine.regions.front();
  const int64_t layers = first.layout.spec().layers;
  if (m.handles_size() != layers) {
    return Status::InvalidArgument(std::to_string(m.handles_size()) + " layer events for " +
                                   std::to_string(layers) + " layers");
  }
  auto device = gpu::DeviceWithUuid(m.device_uuid());
  if (!device.ok()) return device.status().WithContext("layer events");
  if (*device != first.where.device) {
    return Status::InvalidArgument("layer events live on another device than the GPU caches");
  }
  std::vector<std::string> handles(m.handles().begin(), m.handles().end());
  KV_ASSIGN_OR_RETURN(engine.layer_events, gpu::ImportedLayerEvents::Import(handles, *device));
  return Status::Ok();
}

Status Daemon::Core::PostFromEngine(const Engine& engine, int event_layer,
                                    const transport::Batch& batch, transport::Completion done) {
  if (engine.regions.empty() || engine.regions.front()->where.kind != MemoryKind::kCuda ||
      event_layer < 0) {
    return transport_->post(batch, std::move(done));
  }
  if (!engine.layer_events) {
    return Status::InvalidArgument("GPU caches need the engine's layer events before save_layer");
  }
  // Posted at once when the event fired already; else held in the gate until it has, seen from
  // the host. The probe keeps the engine's events open while the batch waits, even if the engine
  // leaves meanwhile.
  return event_gate_->Post(
      batch, [events = engine.layer_events, event_layer] { return events->Fired(event_layer); },
      std::move(done));
}

}  // namespace kv::daemon
