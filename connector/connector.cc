// kv::connector::Connector: the exported face of ConnectorCore. Every method forwards; the
// contracts are in <kv/connector.h>.
#include "connector/connector.h"

#include "connector/connector_core.h"
#include "daemon/daemon.h"
#include "daemon/peer_auth.h"
#include "protocol/kvd.pb.h"

namespace kv::connector {
namespace {

Status CheckId(const std::string& id, const char* what) {
  if (id.empty() || id.size() > kMaxIdBytes) {
    return Status::InvalidArgument(std::string(what) + " of " + std::to_string(id.size()) +
                                   " bytes; it must be 1 to " + std::to_string(kMaxIdBytes) +
                                   " bytes");
  }
  return Status::Ok();
}

Status CheckOptions(const ConnectorOptions& options) {
  KV_RETURN_IF_ERROR(CheckId(options.instance, "instance name"));
  if (options.offload_namespace.size() > kMaxIdBytes) {
    return Status::InvalidArgument("offload namespace of " +
                                   std::to_string(options.offload_namespace.size()) +
                                   " bytes; it must be at most " + std::to_string(kMaxIdBytes));
  }
  if (options.tp_size < 1 || options.tp_rank < 0 || options.tp_rank >= options.tp_size) {
    return Status::InvalidArgument("tp_rank " + std::to_string(options.tp_rank) + " of tp_size " +
                                   std::to_string(options.tp_size) +
                                   ": need 0 <= tp_rank < tp_size");
  }
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument("timeout of " + std::to_string(options.timeout.count()) +
                                   " ms; it must be positive");
  }
  return Status::Ok();
}

Status CheckEngineToken(const std::string& transfer_token) {
  if (transfer_token.size() < kMinTransferTokenBytes ||
      transfer_token.size() > kMaxTransferTokenBytes) {
    return Status::InvalidArgument("transfer token of " + std::to_string(transfer_token.size()) +
                                   " bytes; an engine's token has " +
                                   std::to_string(kMinTransferTokenBytes) + " to " +
                                   std::to_string(kMaxTransferTokenBytes));
  }
  return Status::Ok();
}

}  // namespace

const char* Version() {
  return KV_VERSION_STRING;
}

Result<std::shared_ptr<daemon::Daemon>> StartEmbeddedDaemon(const EmbeddedDaemonOptions& options) {
  daemon::DaemonOptions o;
  o.name = options.name;
  o.listen = options.listen;
  o.transport_name = options.transport;
  o.offload_bytes = options.offload_bytes;
  if (!options.auth_secret_file.empty()) {
    KV_ASSIGN_OR_RETURN(o.auth_secret, daemon::auth::ReadSecretFile(options.auth_secret_file));
  }
  o.insecure_peers = options.insecure_peers;
  return daemon::Daemon::Start(std::move(o));
}

std::string EmbeddedDaemonAddress(const daemon::Daemon& daemon) {
  return daemon.listen_address();
}

Connector::Connector(std::unique_ptr<ConnectorCore> core) : core_(std::move(core)) {}
Connector::~Connector() = default;

Result<std::unique_ptr<Connector>> Connector::Open(const std::string& socket_path,
                                                   ConnectorOptions options) {
  KV_RETURN_IF_ERROR(CheckOptions(options));
  KV_ASSIGN_OR_RETURN(auto core, ConnectorCore::Open(socket_path, std::move(options)));
  return std::unique_ptr<Connector>(new Connector(std::move(core)));
}

Result<std::unique_ptr<Connector>> Connector::OpenEmbedded(std::shared_ptr<daemon::Daemon> daemon,
                                                           ConnectorOptions options) {
  KV_RETURN_IF_ERROR(CheckOptions(options));
  KV_ASSIGN_OR_RETURN(auto core,
                      ConnectorCore::OpenEmbedded(std::move(daemon), std::move(options)));
  return std::unique_ptr<Connector>(new Connector(std::move(core)));
}

Result<std::vector<KvCache>> Connector::RegisterKvCaches(std::span<const KvCacheDesc> caches) {
  return core_->RegisterKvCaches(caches);
}

Status Connector::SaveLayer(const std::string& request, int layer,
                            std::span<const int64_t> block_ids, void* cuda_stream) {
  KV_RETURN_IF_ERROR(CheckId(request, "request id"));
  return core_->SaveLayer(request, layer, block_ids, cuda_stream);
}

Result<std::vector<Status>> Connector::SaveLayers(int layer, std::span<const SaveSpec> saves,
                                                  void* cuda_stream) {
  return core_->SaveLayers(layer, saves, cuda_stream);
}

Status Connector::SetTransferToken(const std::string& request, const std::string& transfer_token) {
  KV_RETURN_IF_ERROR(CheckId(request, "request id"));
  KV_RETURN_IF_ERROR(CheckEngineToken(transfer_token));
  return core_->SetTransferToken(request, transfer_token);
}

Result<TransferParams> Connector::RequestFinished(const std::string& request) {
  KV_RETURN_IF_ERROR(CheckId(request, "request id"));
  return core_->RequestFinished(request, {});
}

Result<TransferParams> Connector::RequestFinished(const std::string& request,
                                                  const std::string& transfer_token) {
  KV_RETURN_IF_ERROR(CheckId(request, "request id"));
  KV_RETURN_IF_ERROR(CheckEngineToken(transfer_token));
  return core_->RequestFinished(request, transfer_token);
}

Result<std::vector<Result<TransferParams>>> Connector::RequestsFinished(
    std::span<const FinishSpec> finishes) {
  if (finishes.empty() || finishes.size() > kMaxFinishesPerCall) {
    return core_->RequestsFinished(finishes);  // its error: empty, or too many
  }
  // Checked here as RequestFinished checks them; the valid ones still go, in one round trip.
  std::vector<Status> checks(finishes.size());
  std::vector<FinishSpec> valid;
  for (size_t i = 0; i < finishes.size(); ++i) {
    checks[i] = CheckId(finishes[i].request, "request id");
    if (checks[i].ok() && !finishes[i].transfer_token.empty()) {
      checks[i] = CheckEngineToken(finishes[i].transfer_token);
    }
    if (checks[i].ok()) valid.push_back(finishes[i]);
  }
  std::vector<Result<TransferParams>> out;
  out.reserve(finishes.size());
  std::vector<Result<TransferParams>> finished;
  if (!valid.empty()) {
    KV_ASSIGN_OR_RETURN(finished, core_->RequestsFinished(valid));
  }
  size_t next = 0;
  for (Status& check : checks) {
    if (check.ok()) {
      out.push_back(std::move(finished[next++]));
    } else {
      out.emplace_back(std::move(check));
    }
  }
  return out;
}

Status Connector::StartLoad(const std::string& request, const TransferParams& params,
                            std::span<const int64_t> local_block_ids) {
  KV_RETURN_IF_ERROR(CheckId(request, "request id"));
  return core_->StartLoad(request, params, local_block_ids);
}

Result<std::vector<Status>> Connector::StartLoads(std::span<const LoadSpec> loads) {
  return core_->StartLoads(loads);
}

Status Connector::WaitLayer(const std::string& request, int layer) {
  return core_->WaitLayer(request, layer);
}

Finished Connector::GetFinished() {
  return core_->GetFinished();
}

std::vector<int64_t> Connector::GetFailedBlocks() {
  return core_->GetFailedBlocks();
}

Result<std::string> Connector::DaemonStatusJson() {
  return core_->DaemonStatusJson();
}

Result<OffloadStored> Connector::OffloadStore(std::span<const offload::BlockKey> keys,
                                              std::span<const int64_t> block_ids, uint32_t region,
                                              void* cuda_stream) {
  return core_->OffloadStore(keys, block_ids, region, cuda_stream);
}

Result<size_t> Connector::OffloadLookup(std::span<const offload::BlockKey> keys, uint32_t region) {
  return core_->OffloadLookup(keys, region);
}

Result<std::vector<KeyState>> Connector::OffloadProbe(std::span<const offload::BlockKey> keys,
                                                      uint32_t region) {
  return core_->OffloadProbe(keys, region);
}

Result<OffloadLoaded> Connector::OffloadLoad(std::span<const offload::BlockKey> keys,
                                             std::span<const int64_t> block_ids, bool per_layer,
                                             uint32_t region, std::vector<MissingKey>* missing) {
  return core_->OffloadLoad(keys, block_ids, per_layer, region, missing);
}

Result<proto::DaemonStatus> DaemonStatusOf(Connector& connector) {
  return connector.core().DaemonStatus();
}

}  // namespace kv::connector
