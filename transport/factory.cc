#include <string>

#include "transport/backends.h"
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
#endif

}  // namespace

std::span<const Backend> CompiledBackends() {
  static const Backend kBackends[] = {
#if KV_TRANSPORT_HAVE_UCX
    {"ucx", &CreateUcx},
#endif
    {"local", &CreateLocalTransport},
#if KV_TRANSPORT_HAVE_CUDA_IPC
    {"cuda_ipc", &CreateCudaIpcTransport},
#endif
#if KV_TRANSPORT_HAVE_NCCL
    {"nccl", &CreateNcclTransport},
#endif
  };
  return kBackends;
}

Result<std::unique_ptr<Transport>> CreateTransport(std::string_view backend,
                                                   const TransportOptions& options) {
  auto backends = CompiledBackends();
  if (backend == "auto") return backends.front().create(options);
  for (const Backend& b : backends) {
    if (backend == b.name) return b.create(options);
  }
  std::string known;
  for (const Backend& b : backends) known += std::string(known.empty() ? "" : ", ") + b.name;
  return Status::Unsupported("transport backend '" + std::string(backend) +
                             "' is not in this build (available: " + known + ")");
}

std::vector<std::string> AvailableTransports() {
  std::vector<std::string> names;
  for (const Backend& b : CompiledBackends()) names.emplace_back(b.name);
  return names;
}

}  // namespace kv::transport
