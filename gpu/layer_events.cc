#include "gpu/layer_events.h"

#include <cuda_runtime_api.h>

#include "gpu/cuda_util.h"
#include "gpu/ipc_event.h"

namespace kv::gpu {
namespace {

// LayerEvents runs in the engine's process, on its threads: an error it returns must not also
// stay the thread's last CUDA error, which the engine's next launch check (PyTorch's, say) would
// take as its own. A sticky error stays whatever this does.
Status Cleared(Status status) {
  if (!status.ok()) cudaGetLastError();
  return status;
}

}  // namespace

struct LayerEvents::Impl {
  int device = 0;
  std::vector<CudaEvent> events;
};

LayerEvents::LayerEvents(std::unique_ptr<Impl> impl, std::vector<std::string> handles)
    : impl_(std::move(impl)), handles_(std::move(handles)) {}
LayerEvents::~LayerEvents() = default;

Result<std::unique_ptr<LayerEvents>> LayerEvents::Create(int device, int layers) {
  if (layers < 1) return Status::InvalidArgument("layer events need at least one layer");
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  std::vector<std::string> handles;
  for (int l = 0; l < layers; ++l) {
    KV_ASSIGN_OR_RETURN(CudaEvent event, CreateShareableEvent(device));
    KV_ASSIGN_OR_RETURN(std::string handle, ExportEvent(event));
    impl->events.push_back(std::move(event));
    handles.push_back(std::move(handle));
  }
  return std::unique_ptr<LayerEvents>(new LayerEvents(std::move(impl), std::move(handles)));
}

Status LayerEvents::Record(int layer, void* stream) const {
  if (layer < 0 || layer >= layers()) {
    return Status::OutOfRange("layer " + std::to_string(layer) + " has no event (" +
                              std::to_string(layers()) + " layers)");
  }
  // The legacy default stream is the current device's: make it the events' device.
  DeviceGuard guard(impl_->device);
  return Cleared(impl_->events[layer].Record(static_cast<cudaStream_t>(stream)));
}

Result<bool> LayerEvents::RecordIfPending(int layer, void* stream) const {
  if (layer < 0 || layer >= layers()) return Record(layer, stream);
  DeviceGuard guard(impl_->device);
  const cudaError_t state = cudaStreamQuery(static_cast<cudaStream_t>(stream));
  if (state == cudaSuccess) return false;
  if (state != cudaErrorNotReady) return Cleared(CudaStatus(state, "cudaStreamQuery"));
  KV_RETURN_IF_ERROR(Cleared(impl_->events[layer].Record(static_cast<cudaStream_t>(stream))));
  return true;
}

struct ImportedLayerEvents::Impl {
  std::vector<CudaEvent> events;
};

ImportedLayerEvents::ImportedLayerEvents(std::unique_ptr<Impl> impl, int layers)
    : impl_(std::move(impl)), layers_(layers) {}
ImportedLayerEvents::~ImportedLayerEvents() = default;

Result<std::unique_ptr<ImportedLayerEvents>> ImportedLayerEvents::Import(
    std::span<const std::string> handles, int device) {
  auto impl = std::make_unique<Impl>();
  for (size_t l = 0; l < handles.size(); ++l) {
    auto event = ImportEvent(handles[l], device);
    if (!event.ok()) return event.status().WithContext("layer " + std::to_string(l) + "'s event");
    impl->events.push_back(std::move(event).value());
  }
  const int layers = static_cast<int>(impl->events.size());
  return std::unique_ptr<ImportedLayerEvents>(new ImportedLayerEvents(std::move(impl), layers));
}

Result<bool> ImportedLayerEvents::Fired(int layer) const {
  return impl_->events.at(static_cast<size_t>(layer)).Query();
}

}  // namespace kv::gpu
