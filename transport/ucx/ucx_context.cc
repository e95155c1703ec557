#include "transport/ucx/ucx_context.h"

#include <string>

namespace kv::transport::ucx {

Status FromUcs(ucs_status_t status, std::string_view what) {
  std::string message = std::string(what) + ": " + ucs_status_string(status);
  switch (status) {
    case UCS_OK:
      return Status::Ok();
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
      return Status::Timeout(std::move(message));
    case UCS_ERR_CANCELED:
      return Status::Aborted(std::move(message));
    case UCS_ERR_UNSUPPORTED:
      return Status::Unsupported(std::move(message));
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
      return Status::Unavailable(std::move(message));
    default:
      return Status::IoError(std::move(message));
  }
}

namespace {

struct ConfigDeleter {
  void operator()(ucp_config_t* config) const { ucp_config_release(config); }
};

}  // namespace

Result<ContextPtr> CreateContext(const TransportOptions& options) {
  ucp_config_t* raw_config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &raw_config); s != UCS_OK)
    return FromUcs(s, "ucp_config_read");
  std::unique_ptr<ucp_config_t, ConfigDeleter> config(raw_config);
  // Peer-failure support for the posix and sysv transports (MM_ reaches both through UCX's
  // transport-level table), set through the config, not the environment; a choice in the
  // settings wins.
  bool error_handling_chosen = false;
  for (const auto& [name, value] : options.settings) {
    const std::string key = name.rfind("UCX_", 0) == 0 ? name.substr(4) : name;
    error_handling_chosen = error_handling_chosen || key == "POSIX_ERROR_HANDLING" ||
                            key == "SYSV_ERROR_HANDLING" || key == "MM_ERROR_HANDLING";
  }
  if (!error_handling_chosen) (void)ucp_config_modify(config.get(), "MM_ERROR_HANDLING", "y");
  for (const auto& [name, value] : options.settings) {
    std::string key = name.rfind("UCX_", 0) == 0 ? name.substr(4) : name;
    if (ucp_config_modify(config.get(), key.c_str(), value.c_str()) != UCS_OK)
      return Status::InvalidArgument("UCX setting " + name + "=" + value + " was refused");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  ucp_context_h context = nullptr;
  if (ucs_status_t s = ucp_init(&params, config.get(), &context); s != UCS_OK)
    return FromUcs(s, "ucp_init");
  return ContextPtr(context);
}

Result<WorkerPtr> CreateWorker(ucp_context_h context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  if (ucs_status_t s = ucp_worker_create(context, &params, &worker); s != UCS_OK)
    return FromUcs(s, "ucp_worker_create");
  return WorkerPtr(worker);
}

Result<std::string> WorkerAddress(ucp_worker_h worker) {
  ucp_address_t* address = nullptr;
  size_t length = 0;
  if (ucs_status_t s = ucp_worker_get_address(worker, &address, &length); s != UCS_OK)
    return FromUcs(s, "ucp_worker_get_address");
  std::string bytes(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker, address);
  return bytes;
}

bool ContextSupports(ucp_context_h context, MemoryKind kind) {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context, &attr) != UCS_OK) return false;
  ucs_memory_type_t type = kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  return (attr.memory_types & UCS_BIT(type)) != 0;
}

Result<std::shared_ptr<MemoryMap>> MemoryMap::Create(ucp_context_h context, void* base,
                                                     uint64_t length, MemoryLocation where) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = base;
  params.length = length;
  params.memory_type =
      where.kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  return Map(context, params, where);
}

Result<std::shared_ptr<MemoryMap>> MemoryMap::Allocate(ucp_context_h context, uint64_t length) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = length;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  return Map(context, params, MemoryLocation::Host());
}

Result<std::shared_ptr<MemoryMap>> MemoryMap::Map(ucp_context_h context,
                                                  const ucp_mem_map_params_t& params,
                                                  MemoryLocation where) {
  ucp_mem_h memh = nullptr;
  if (ucs_status_t s = ucp_mem_map(context, &params, &memh); s != UCS_OK)
    return FromUcs(s, "ucp_mem_map of " + std::to_string(params.length) + " bytes");
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucs_status_t s = ucp_mem_query(memh, &attr); s != UCS_OK) {
    ucp_mem_unmap(context, memh);
    return FromUcs(s, "ucp_mem_query");
  }
  // An allocation may be rounded up; the registration covers what was asked for.
  std::shared_ptr<MemoryMap> map(new MemoryMap(context, memh, attr.address, params.length, where));
  void* rkey = nullptr;
  size_t rkey_size = 0;
  if (ucs_status_t s = ucp_rkey_pack(context, memh, &rkey, &rkey_size); s != UCS_OK)
    return FromUcs(s, "ucp_rkey_pack");
  map->rkey_.assign(static_cast<const char*>(rkey), rkey_size);
  ucp_rkey_buffer_release(rkey);
  return map;
}

MemoryMap::~MemoryMap() {
  ucp_mem_unmap(context_, memh_);
}

}  // namespace kv::transport::ucx
