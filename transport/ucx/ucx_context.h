// RAII owners of UCX objects and the set-up calls of the ucx backend.
//
// Thread-safety: the context is created with mt_workers_shared, so memory mapping and rkey
// packing (MemoryMap) may run on any thread; the worker is single-threaded and every worker call
// (endpoints, rkey unpack/destroy, progress) happens on the transport's progress thread.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <string>
#include <type_traits>

#include "transport/transport.h"

namespace kv::transport::ucx {

// A UCX status as a kv::Status: peer and transport failures become kUnavailable, timeouts
// kTimeout, cancellations kAborted, missing support kUnsupported, anything else kIoError.
Status FromUcs(ucs_status_t status, std::string_view what);

struct ContextDeleter {
  void operator()(ucp_context_h context) const { ucp_cleanup(context); }
};
using ContextPtr = std::unique_ptr<std::remove_pointer_t<ucp_context_h>, ContextDeleter>;

struct WorkerDeleter {
  void operator()(ucp_worker_h worker) const { ucp_worker_destroy(worker); }
};
using WorkerPtr = std::unique_ptr<std::remove_pointer_t<ucp_worker_h>, WorkerDeleter>;

// Features RMA, AM and WAKEUP; UCX reads its UCX_* environment variables, then every setting (a
// UCX configuration variable, with or without "UCX_") is applied through ucp_config_modify, so a
// setting wins over the environment. Unless the settings name POSIX_, SYSV_ or
// MM_ERROR_HANDLING, the posix and sysv transports get peer-failure support
// (MM_ERROR_HANDLING=y, through ucp_config_modify too, so it also wins over those variables in
// the environment; kvd forwards them as settings): without it UCX 1.13 cannot use shared memory
// for endpoints in peer error-handling mode and falls back to TCP on one host. A dead peer over
// shared memory is then found by UCX's keepalive (UCX_KEEPALIVE_INTERVAL) or, sooner, by the
// batch deadline.
Result<ContextPtr> CreateContext(const TransportOptions& options);
Result<WorkerPtr> CreateWorker(ucp_context_h context);
// The worker's address as bytes a peer can pass to ucp_ep_create.
Result<std::string> WorkerAddress(ucp_worker_h worker);
// Whether the context reaches memory of this kind (ucp_context_query memory types).
bool ContextSupports(ucp_context_h context, MemoryKind kind);

// One ucp_mem_map of [base, base + length) with its packed rkey. Unmapped on destruction, which
// the owner delays until no request that uses it is in flight.
class MemoryMap {
 public:
  static Result<std::shared_ptr<MemoryMap>> Create(ucp_context_h context, void* base,
                                                   uint64_t length, MemoryLocation where);
  // Memory allocated by UCX itself (UCP_MEM_MAP_ALLOCATE: on one host, a System V or POSIX
  // shared-memory segment that peers map and write into directly). Freed with the mapping.
  static Result<std::shared_ptr<MemoryMap>> Allocate(ucp_context_h context, uint64_t length);
  ~MemoryMap();
  MemoryMap(const MemoryMap&) = delete;
  MemoryMap& operator=(const MemoryMap&) = delete;

  void* base() const { return base_; }
  uint64_t length() const { return length_; }
  MemoryLocation location() const { return where_; }
  const std::string& packed_rkey() const { return rkey_; }

 private:
  MemoryMap(ucp_context_h context, ucp_mem_h memh, void* base, uint64_t length,
            MemoryLocation where)
      : context_(context), memh_(memh), base_(base), length_(length), where_(where) {}
  static Result<std::shared_ptr<MemoryMap>> Map(ucp_context_h context,
                                                const ucp_mem_map_params_t& params,
                                                MemoryLocation where);
  ucp_context_h context_;
  ucp_mem_h memh_;
  void* base_;
  uint64_t length_;
  MemoryLocation where_;
  std::string rkey_;
};

}  // namespace kv::transport::ucx
