// ipc_memory.h and layer_events.h in a build without CUDA: each entry point reports kUnsupported,
// so kvd and the connector refuse GPU memory at run time with a clear error instead of by #ifdef.
#include "gpu/ipc_memory.h"
#include "gpu/layer_events.h"

namespace kv::gpu {
namespace {
Status NoCuda(const char* what) {
  return Status::Unsupported(std::string(what) + ": this build has no CUDA");
}
}  // namespace

Result<IpcExport> ExportDeviceMemory(const void*, uint64_t, int) {
  return NoCuda("GPU memory registration");
}
Result<std::string> DeviceUuid(int) {
  return NoCuda("device UUID");
}
Result<bool> SharedThroughMps(int) {
  return NoCuda("MPS query");
}
Result<int> DeviceWithUuid(std::string_view) {
  return NoCuda("GPU memory registration");
}
IpcMemory::~IpcMemory() = default;
Result<std::shared_ptr<IpcMemory>> OpenIpcMemory(std::string_view, int) {
  return NoCuda("CUDA IPC");
}
Result<std::shared_ptr<IpcMemory>> OpenVmmMemory(UniqueFd, uint64_t, int, int) {
  return NoCuda("CUDA VMM memory");
}

struct LayerEvents::Impl {};
LayerEvents::LayerEvents(std::unique_ptr<Impl> impl, std::vector<std::string> handles)
    : impl_(std::move(impl)), handles_(std::move(handles)) {}
LayerEvents::~LayerEvents() = default;
Result<std::unique_ptr<LayerEvents>> LayerEvents::Create(int, int) {
  return NoCuda("layer events");
}
Status LayerEvents::Record(int, void*) const {
  return NoCuda("layer events");
}
Result<bool> LayerEvents::RecordIfPending(int, void*) const {
  return NoCuda("layer events");
}

struct ImportedLayerEvents::Impl {};
ImportedLayerEvents::ImportedLayerEvents(std::unique_ptr<Impl> impl, int layers)
    : impl_(std::move(impl)), layers_(layers) {}
ImportedLayerEvents::~ImportedLayerEvents() = default;
Result<std::unique_ptr<ImportedLayerEvents>> ImportedLayerEvents::Import(
    std::span<const std::string>, int) {
  return NoCuda("layer events");
}
Result<bool> ImportedLayerEvents::Fired(int) const {
  return NoCuda("layer events");
}

}  // namespace kv::gpu
