#include "connector/connector.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "connector/client.h"
#include "daemon/daemon.h"
#include "daemon/wire_layout.h"

namespace kv::connector {

namespace {

Result<int> ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path '" + path + "' is empty or too long");
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IoError(std::string("socket: ") + std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Status s = Status::Unavailable("no kvd at " + path + ": " + std::strerror(errno));
    close(fd);
    return s;
  }
  return fd;
}

}  // namespace

Connector::Connector(std::unique_ptr<Client> client, std::shared_ptr<daemon::Daemon> embedded)
    : embedded_(std::move(embedded)), client_(std::move(client)) {}

Connector::~Connector() = default;

Result<std::unique_ptr<Connector>> Connector::Connect(int fd, ConnectorOptions options,
                                                      std::shared_ptr<daemon::Daemon> embedded) {
  auto client = std::make_unique<Client>(fd, options.timeout);
  proto::EngineMessage m;
  auto* hello = m.mutable_hello();
  hello->set_protocol_version(proto::PROTOCOL_VERSION);
  hello->set_instance(options.instance);
  hello->set_tp_rank(options.tp_rank);
  hello->set_tp_size(options.tp_size);
  KV_RETURN_IF_ERROR(client->Call(std::move(m)).status());
  return std::unique_ptr<Connector>(new Connector(std::move(client), std::move(embedded)));
}

Result<std::unique_ptr<Connector>> Connector::Open(const std::string& socket_path,
                                                   ConnectorOptions options) {
  KV_ASSIGN_OR_RETURN(int fd, ConnectUnix(socket_path));
  return Connect(fd, std::move(options), nullptr);
}

Result<std::unique_ptr<Connector>> Connector::OpenEmbedded(std::shared_ptr<daemon::Daemon> daemon,
                                                           ConnectorOptions options) {
  if (!daemon) return Status::InvalidArgument("OpenEmbedded needs a daemon");
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return Status::IoError(std::string("socketpair: ") + std::strerror(errno));
  }
  Status attached = daemon->AttachEngine(fds[1]);
  if (!attached.ok()) {
    close(fds[0]);
    return attached;
  }
  return Connect(fds[0], std::move(options), std::move(daemon));
}

Result<std::vector<KvCache>> Connector::RegisterKvCaches(std::span<const LayoutSpec> layouts) {
  if (!memory_.empty()) return Status::AlreadyExists("register_kv_caches was already called");
  std::vector<KvCache> caches;
  for (size_t i = 0; i < layouts.size(); ++i) {
    KV_ASSIGN_OR_RETURN(KvRegion layout, KvRegion::Create(layouts[i]));
    KV_ASSIGN_OR_RETURN(
        daemon::SharedMemory memory,
        daemon::SharedMemory::Create(layout.span_bytes(), "kv-cache-" + std::to_string(i)));
    proto::EngineMessage m;
    daemon::ToWire(layout.spec(), m.mutable_register_region()->mutable_layout());
    m.mutable_register_region()->set_bytes(memory.size());
    KV_RETURN_IF_ERROR(client_->Call(std::move(m), memory.fd()).status());
    caches.push_back(KvCache{memory.data(), memory.size(), layout});
    memory_.push_back(std::move(memory));
  }
  return caches;
}

Status Connector::SaveLayer(const std::string& request, int layer,
                            std::span<const int64_t> block_ids) {
  proto::EngineMessage m;
  auto* save = m.mutable_save_layer();
  save->set_request_id(request);
  save->set_layer(layer);
  save->mutable_block_ids()->Add(block_ids.begin(), block_ids.end());
  return client_->Call(std::move(m)).status();
}

Result<TransferParams> Connector::RequestFinished(const std::string& request) {
  proto::EngineMessage m;
  m.mutable_request_finished()->set_request_id(request);
  KV_ASSIGN_OR_RETURN(proto::Reply reply, client_->Call(std::move(m)));
  TransferParams params;
  params.peer_name = reply.params().peer_name();
  params.peer_address = reply.params().peer_address();
  params.request_id = reply.params().request_id();
  params.remote_block_ids.assign(reply.params().remote_block_ids().begin(),
                                 reply.params().remote_block_ids().end());
  return params;
}

Status Connector::StartLoad(const std::string& request, const TransferParams& params,
                            std::span<const int64_t> local_block_ids) {
  proto::EngineMessage m;
  auto* load = m.mutable_start_load();
  load->set_request_id(request);
  load->set_peer_address(params.peer_address);
  load->set_tokens(params.tokens);
  load->set_mode(params.mode == Mode::kPull ? proto::MODE_PULL : proto::MODE_PUSH);
  load->mutable_block_ids()->Add(local_block_ids.begin(), local_block_ids.end());
  // Registered before the call: the first LayerReady may overtake the reply.
  client_->ExpectLoad(request, {local_block_ids.begin(), local_block_ids.end()});
  Status s = client_->Call(std::move(m)).status();
  if (!s.ok()) client_->ForgetLoad(request);
  return s;
}

Status Connector::WaitLayer(const std::string& request, int layer) {
  return client_->WaitLayer(request, layer);
}

Finished Connector::GetFinished() {
  return client_->TakeFinished();
}

std::vector<int64_t> Connector::GetFailedBlocks() {
  return client_->TakeFailedBlocks();
}

Result<proto::DaemonStatus> Connector::DaemonStatus() {
  proto::EngineMessage m;
  m.mutable_status();
  KV_ASSIGN_OR_RETURN(proto::Reply reply, client_->Call(std::move(m)));
  return reply.status();
}

Result<proto::DaemonStatus> QueryDaemonStatus(const std::string& socket_path,
                                              std::chrono::milliseconds timeout) {
  KV_ASSIGN_OR_RETURN(int fd, ConnectUnix(socket_path));
  Connector::Client client(fd, timeout);
  proto::EngineMessage m;
  m.mutable_status();
  KV_ASSIGN_OR_RETURN(proto::Reply reply, client.Call(std::move(m)));
  return reply.status();
}

}  // namespace kv::connector
