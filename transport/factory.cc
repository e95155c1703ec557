#include <set>
#include <string>
#include <vector>

#include "transport/backends.h"
#if KV_TRANSPORT_HAVE_HOST_IPC
#include "transport/host_ipc/host_ipc_transport.h"
#endif
#include "transport/local/local_transport.h"
#include "transport/staged/staged_transport.h"
#if KV_TRANSPORT_HAVE_UCX
#include "transport/ucx/ucx_transport.h"
#endif
#if KV_TRANSPORT_HAVE_CUDA_IPC
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#endif
#if KV_TRANSPORT_HAVE_NCCL
#include "transport/nccl/nccl_transport.h"
#endif

namespace kv::transport {
namespace {

#if KV_TRANSPORT_HAVE_UCX
// "ucx" is UCX behind the staged decorator: host memory goes straight to UCX, GPU memory too
// where UCX has CUDA support, and through pinned host staging where it has not.
Result<std::unique_ptr<Transport>> CreateUcx(const TransportOptions& options) {
  return CreateStagedTransport(&CreateUcxTransport, options);
}

// The staged decorator's settings, then UCX's.
std::span<const SettingInfo> UcxBackendSettings() {
  static const std::vector<SettingInfo> settings = [] {
    std::vector<SettingInfo> all;
    for (const SettingInfo& s : StagedSettings()) all.push_back(s);
    for (const SettingInfo& s : UcxSettings()) all.push_back(s);
    return all;
  }();
  return settings;
}
#endif

const Backend* Find(std::span<const Backend> backends, std::string_view name) {
  if (backends.empty()) return nullptr;
  if (name == "auto") return &backends.front();
  if (name == "ipc") name = "cuda_ipc";  // kvd --transport ipc
  for (const Backend& b : backends) {
    if (name == b.name) return &b;
  }
  return nullptr;
}

Status NotInThisBuild(std::string_view backend) {
  std::string known;
  for (const Backend& b : CompiledBackends())
    known += std::string(known.empty() ? "" : ", ") + b.name;
  return Status::Unsupported("transport backend '" + std::string(backend) +
                             "' is not in this build (available: " + known + ")");
}

}  // namespace

std::span<const Backend> CompiledBackends() {
  static const Backend kBackends[] = {
#if KV_TRANSPORT_HAVE_UCX
    {"ucx", &CreateUcx, {.ucx_config = true}, UcxBackendSettings()},
#endif
    {"local", &CreateLocalTransport, {}, {}},
#if KV_TRANSPORT_HAVE_HOST_IPC
    {"host_ipc", &CreateHostIpcTransport, {}, HostIpcSettings()},
#endif
#if KV_TRANSPORT_HAVE_CUDA_IPC
    {"cuda_ipc", &CreateCudaIpcTransport, {.device_copies = true}, CudaIpcSettings()},
#endif
#if KV_TRANSPORT_HAVE_NCCL
    {"nccl", &CreateNcclTransport, {.device_copies = true}, NcclSettings()},
#endif
  };
  return kBackends;
}

Result<std::unique_ptr<Transport>> CreateTransport(std::string_view backend,
                                                   const TransportOptions& options) {
  const Backend* b = Find(CompiledBackends(), backend);
  if (b == nullptr) return NotInThisBuild(backend);
  return b->create(options);
}

Result<BackendInfo> DescribeTransport(std::string_view backend) {
  const Backend* b = Find(CompiledBackends(), backend);
  if (b == nullptr) return NotInThisBuild(backend);
  return BackendInfo{b->name, b->capabilities, b->settings};
}

Status CheckSettings(std::string_view backend, const TransportOptions& options) {
  KV_ASSIGN_OR_RETURN(BackendInfo info, DescribeTransport(backend));
  std::set<std::string> seen;
  for (const auto& [key, value] : options.settings) {
    if (!seen.insert(key).second) {
      return Status::InvalidArgument("transport setting " + key + " is given twice");
    }
    if (info.capabilities.ucx_config) continue;
    bool known = false;
    std::string keys;
    for (const SettingInfo& s : info.settings) {
      known = known || key == s.key;
      keys += std::string(keys.empty() ? "" : ", ") + s.key;
    }
    if (!known) {
      return Status::InvalidArgument("transport " + std::string(info.name) + " takes no setting " +
                                     key + " (it takes: " + (keys.empty() ? "none" : keys) + ")");
    }
  }
  return Status::Ok();
}

std::vector<std::string> AvailableTransports() {
  std::vector<std::string> names;
  for (const Backend& b : CompiledBackends()) names.emplace_back(b.name);
  return names;
}

}  // namespace kv::transport
