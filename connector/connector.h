// Connector: the engine side of kvd, shaped after the worker half of vLLM's KVConnectorBase_V1.
//
// One Connector per engine process and TP rank. It talks to its node's kvd over the unix socket
// (Open) or to a kvd core running inside this process (OpenEmbedded: same protocol, over a
// socketpair). Host KV caches are allocated by RegisterKvCaches in shared memory that kvd maps,
// so pages move without a copy through this process.
//
//   prefill rank:  RegisterKvCaches → per layer: (write K/V) → SaveLayer → RequestFinished
//   decode rank:   RegisterKvCaches → StartLoad → per layer: WaitLayer → (attend)
//   both:          GetFinished / GetFailedBlocks once per step
//
// Errors are values; every blocking call ends by the connector's timeout at the latest.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/proto/kvd.pb.h"
#include "daemon/shared_memory.h"
#include "layout/kv_region.h"
#include "layout/status.h"

namespace kv::daemon {
class Daemon;
}

namespace kv::connector {

enum class Mode { kPush, kPull };

// What the decode side needs to load a request: returned by RequestFinished on the prefill side
// and handed over by the scheduler (as vLLM's kv_transfer_params).
struct TransferParams {
  std::string peer_name;     // the source kvd
  std::string peer_address;  // its TCP address, HOST:PORT
  std::string request_id;
  std::vector<int64_t> remote_block_ids;  // prefill rank 0's blocks (informational)
  int64_t tokens = 0;  // prompt tokens to move; the decode side knows its prompt length
  Mode mode = Mode::kPush;
};

struct ConnectorOptions {
  std::string instance = "engine";  // engines of one TP group share it
  int tp_rank = 0;
  int tp_size = 1;
  std::chrono::milliseconds timeout{30000};  // bound of every blocking call
};

// One registered KV cache: `base` points at layout.span_bytes() bytes of shared host memory,
// valid while the Connector lives.
struct KvCache {
  void* base = nullptr;
  uint64_t bytes = 0;
  KvRegion layout;
};

struct Finished {
  std::vector<std::string> sent;      // source side: blocks released, free to reuse
  std::vector<std::string> received;  // destination side: every layer in place
};

class Connector {
 public:
  static Result<std::unique_ptr<Connector>> Open(const std::string& socket_path,
                                                 ConnectorOptions options);
  static Result<std::unique_ptr<Connector>> OpenEmbedded(std::shared_ptr<daemon::Daemon> daemon,
                                                         ConnectorOptions options);
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // Once, before anything else: allocates and registers one host region per layout.
  Result<std::vector<KvCache>> RegisterKvCaches(std::span<const LayoutSpec> layouts);

  // Prefill: `layer` of `request` is written in `block_ids`; kvd may send it now.
  Status SaveLayer(const std::string& request, int layer, std::span<const int64_t> block_ids);
  Result<TransferParams> RequestFinished(const std::string& request);

  // Decode: load `request` into `local_block_ids` (params.tokens tokens).
  Status StartLoad(const std::string& request, const TransferParams& params,
                   std::span<const int64_t> local_block_ids);
  // Blocks until `layer` of `request` is in place: OK, the request's error, or kTimeout.
  Status WaitLayer(const std::string& request, int layer);

  // Requests finished since the last call.
  Finished GetFinished();
  // Local blocks of loads that failed since the last call: their content is undefined.
  std::vector<int64_t> GetFailedBlocks();

  Result<proto::DaemonStatus> DaemonStatus();

  class Client;

 private:
  static Result<std::unique_ptr<Connector>> Connect(int fd, ConnectorOptions options,
                                                    std::shared_ptr<daemon::Daemon> embedded);
  Connector(std::unique_ptr<Client> client, std::shared_ptr<daemon::Daemon> embedded);

  std::shared_ptr<daemon::Daemon> embedded_;  // kept alive for the connector's lifetime
  std::vector<daemon::SharedMemory> memory_;  // this process's view of the registered regions
  std::unique_ptr<Client> client_;            // destroyed first: no event arrives after it
};

// kvctl's view: asks the kvd at `socket_path` for its status without registering an engine.
Result<proto::DaemonStatus> QueryDaemonStatus(const std::string& socket_path,
                                              std::chrono::milliseconds timeout);

}  // namespace kv::connector
