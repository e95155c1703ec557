#include "transport/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "base/codec.h"
#include "base/framed_socket.h"
#include "transport/channel_auth.h"
#include "transport/nccl/lanes.h"
#include "transport/nccl/nccl_comm.h"
#include "transport/nccl/nccl_link.h"
#include "transport/nccl/run_tables.h"
#include "transport/nccl/wire.h"
#include "transport/run_check.h"
#include "transport/settings.h"

namespace kv::transport {
namespace {

using kv::FrameReader;
using kv::Listener;
using kv::Socket;
using nccl::Link;
using nccl::LinkOptions;
using nccl::NoteSink;
using nccl::RegionTable;

constexpr std::string_view kDescriptorMagic = "kvd-nccl-region/1";

// Loads the copy and NCCL kernels once per device and process (nccl_comm.h, run_tables.h say
// why this must come before any copy waits on an engine).
Status LoadKernels(int device) {
  static std::mutex mu;
  static std::vector<int> loaded;
  std::lock_guard lock(mu);
  if (std::find(loaded.begin(), loaded.end(), device) != loaded.end()) return Status::Ok();
  KV_RETURN_IF_ERROR(nccl::LoadCopyKernel(device));
  KV_RETURN_IF_ERROR(nccl::LoadNcclKernels(device));
  loaded.push_back(device);
  return Status::Ok();
}

class NcclRegistration final : public MemoryRegistration {
 public:
  NcclRegistration(std::shared_ptr<RegionTable> table, char* base, uint64_t length,
                   MemoryLocation where)
      : table_(std::move(table)),
        id_(table_->Add(base, length)),
        base_(base),
        length_(length),
        where_(where) {}
  ~NcclRegistration() override { table_->Remove(id_); }

  void* base() const override { return base_; }
  uint64_t length() const override { return length_; }
  MemoryLocation location() const override { return where_; }
  std::string packed_descriptor() const override {
    return ByteWriter().bytes(kDescriptorMagic).u64(id_).u64(length_).take();
  }

 private:
  std::shared_ptr<RegionTable> table_;
  uint64_t id_;
  char* base_;
  uint64_t length_;
  MemoryLocation where_;
};

class NcclRemote final : public RemoteMemory {
 public:
  NcclRemote(PeerId peer, uint64_t id, uint64_t length) : peer_(peer), id_(id), length_(length) {}
  PeerId peer() const override { return peer_; }
  uint64_t length() const override { return length_; }
  uint64_t id() const { return id_; }

 private:
  PeerId peer_;
  uint64_t id_;
  uint64_t length_;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(const LinkOptions& options, PeerAuth auth)
      : options_(options), auth_(std::move(auth)) {}

  Status Start(const std::string& listen_host) {
    KV_RETURN_IF_ERROR(LoadKernels(options_.device));
    KV_ASSIGN_OR_RETURN(listener_, Listener::Listen("tcp:" + listen_host + ":0"));
    acceptor_ = std::thread([this] { AcceptLoop(); });
    return Status::Ok();
  }

  ~NcclTransport() override {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    std::lock_guard lock(mu_);
    peers_.clear();
    incoming_.clear();
  }

  std::string_view name() const override { return "nccl"; }
  std::string address() const override { return listener_.endpoint(); }
  bool supports(MemoryKind kind) const override { return kind == MemoryKind::kCuda; }
  // A put's groups travel as rows (wire.h): a TP split's page is one entry on the wire, in the
  // tables and in the gather and scatter, instead of one per token.
  bool takes_run_groups() const override { return true; }
  // A put's blocks of groups (an LBNHC page converted to BLHNC: 8 heads at one step) travel as
  // one entry each where the receiver accepts that (SplitBlocks), so the plan, the post and the
  // sender handle an eighth of the entries.
  bool takes_group_blocks() const override { return true; }

  Result<std::unique_ptr<MemoryRegistration>> register_memory(void* base, uint64_t length,
                                                              MemoryLocation where) override {
    if (where.kind != MemoryKind::kCuda) {
      return Status::Unsupported("nccl registers CUDA device memory only");
    }
    if (base == nullptr || length == 0) return Status::InvalidArgument("nccl: empty registration");
    cudaPointerAttributes attrs{};
    if (cudaPointerGetAttributes(&attrs, base) != cudaSuccess ||
        attrs.type != cudaMemoryTypeDevice || attrs.device != options_.device) {
      cudaGetLastError();
      return Status::InvalidArgument("nccl: base is not device memory of device " +
                                     std::to_string(options_.device));
    }
    return std::unique_ptr<MemoryRegistration>(
        new NcclRegistration(regions_, static_cast<char*>(base), length, where));
  }

  Result<PeerId> connect(std::string_view peer_address) override {
    const auto deadline = Clock::now() + options_.init_timeout;
    KV_ASSIGN_OR_RETURN(Socket socket, Socket::Connect(peer_address, deadline));
    // Nothing crosses before the peer proved the secret (channel_auth.h): the unique ids that
    // follow let their holder join a communicator that writes into our regions.
    FrameReader reader;
    auto proved = DialHandshake(socket, reader, auth_, nccl::kHelloMagic, deadline);
    if (!proved.ok()) {
      return proved.status().WithContext("nccl: side channel to " + std::string(peer_address));
    }
    KV_RETURN_IF_ERROR(socket.SendFrame(nccl::EncodeHello(), deadline));
    KV_ASSIGN_OR_RETURN(std::string hello, kv::ReceiveFrame(socket.fd(), reader, deadline));
    KV_RETURN_IF_ERROR(nccl::DecodeHello(hello));
    KV_ASSIGN_OR_RETURN(
        auto link, Link::Start(std::move(socket), std::move(reader), options_, regions_, notes_));
    std::lock_guard lock(mu_);
    PeerId id = next_peer_++;
    peers_[id] = std::move(link);
    return id;
  }

  void disconnect(PeerId peer) override {
    std::shared_ptr<Link> link;
    {
      std::lock_guard lock(mu_);
      auto it = peers_.find(peer);
      if (it == peers_.end()) return;
      link = std::move(it->second);
      peers_.erase(it);
    }
    link->Fail(Status::Aborted("nccl: peer disconnected"));
  }

  Result<std::unique_ptr<RemoteMemory>> import_remote(PeerId peer,
                                                      std::string_view packed) override {
    {
      std::lock_guard lock(mu_);
      if (peers_.count(peer) == 0) return Status::NotFound("nccl: unknown peer");
    }
    ByteReader r(packed);
    std::string_view magic;
    uint64_t id = 0, length = 0;
    if (!r.bytes(&magic) || magic != kDescriptorMagic || !r.u64(&id) || !r.u64(&length) ||
        !r.at_end() || length == 0) {
      return Status::InvalidArgument("not an nccl region descriptor");
    }
    return std::unique_ptr<RemoteMemory>(new NcclRemote(peer, id, length));
  }

  Status post(const Batch& batch, Completion done) override {
    auto* local = dynamic_cast<const NcclRegistration*>(batch.local);
    auto* remote = dynamic_cast<const NcclRemote*>(batch.remote);
    if (local == nullptr || remote == nullptr) {
      return Status::InvalidArgument("nccl: batch names memory of another transport");
    }
    KV_RETURN_IF_ERROR(CheckBatch(batch, /*takes_groups=*/true, /*takes_blocks=*/true));
    KV_ASSIGN_OR_RETURN(auto link, FindLink(remote->peer()));
    char* base = static_cast<char*>(local->base());
    if (batch.op == Op::kPut) {
      return link->Put(base, batch.runs, batch.groups, batch.blocks, remote->id(), batch.deadline,
                       std::move(done));
    }
    return link->Get(base, batch.runs, batch.groups, batch.blocks, remote->id(), batch.deadline,
                     std::move(done));
  }

  Status notify(PeerId peer, std::string message) override {
    KV_ASSIGN_OR_RETURN(auto link, FindLink(peer));
    return link->Notify(std::move(message));
  }

  void set_notification_handler(NotificationHandler handler) override {
    notes_->Set(std::move(handler));
  }

 private:
  Result<std::shared_ptr<Link>> FindLink(PeerId peer) {
    std::lock_guard lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return Status::NotFound("nccl: peer not connected");
    if (it->second->failed()) return Status::Unavailable("nccl: link to peer failed");
    return it->second;
  }

  // Peers that connect to us get a link too: they put into our regions, get from them and send
  // notifications. The authentication (channel_auth.h) and hello exchange of every accepted
  // socket progress here without blocking, each bounded by init_timeout, so a slow or silent
  // peer delays no one else. A peer AdmitPeer refuses (not loopback, without a secret) is closed
  // at once. Failed links are dropped here.
  void AcceptLoop() {
    std::vector<Handshake> pending;
    while (!stop_) {
      std::vector<pollfd> fds{{listener_.fd(), POLLIN, 0}};
      for (const Handshake& h : pending) fds.push_back({h.socket.fd(), POLLIN, 0});
      poll(fds.data(), fds.size(), 50);
      {
        std::lock_guard lock(mu_);
        std::erase_if(incoming_, [](const std::shared_ptr<Link>& l) { return l->failed(); });
      }
      const auto now = Clock::now();
      for (size_t i = 0; i < pending.size(); ++i) {
        if (fds[i + 1].revents != 0) pending[i].done = Progress(pending[i]);
        if (now >= pending[i].deadline) pending[i].done = true;
      }
      std::erase_if(pending, [](const Handshake& h) { return h.done; });
      while (true) {
        auto accepted = listener_.Accept();
        if (!accepted.ok() || !accepted->valid()) break;
        if (pending.size() >= kMaxHandshakes) continue;  // closes it: too many unfinished hellos
        if (!AdmitPeer(auth_, accepted->fd()).ok()) continue;  // closes it
        Handshake& h =
            pending.emplace_back(std::move(accepted).value(), auth_, now + options_.init_timeout);
        h.auth.Begin();  // the acceptor sends nothing before the dialer's challenge
      }
    }
  }

  struct Handshake {
    Handshake(Socket s, const PeerAuth& peer_auth, Clock::time_point until)
        : socket(std::move(s)),
          auth(peer_auth, std::string(nccl::kHelloMagic), ChannelHandshake::Role::kAcceptor),
          deadline(until) {}
    Socket socket;
    ChannelHandshake auth;
    FrameReader reader;
    Clock::time_point deadline;
    bool sealed = false;  // SealChannel ran (once the handshake was done)
    bool done = false;    // a link started, or the peer failed the exchange: drop it
  };
  static constexpr size_t kMaxHandshakes = 16;

  // Reads what the peer sent: the authentication first, then its hello, which is answered and
  // starts the link. True when finished.
  bool Progress(Handshake& h) {
    if (!h.reader.ReadAvailable(h.socket.fd()).ok()) return true;
    while (!h.auth.done()) {
      auto frame = h.reader.Next();
      if (!frame) return false;
      ChannelHandshake::Step step = h.auth.OnFrame(*frame);
      for (const std::string& out : step.send) {
        if (!h.socket.SendFrame(out, h.deadline).ok()) return true;
      }
      if (!step.status.ok()) return true;  // refused (the peer heard why): close
    }
    if (!h.sealed) {
      // Every frame after the handshake is sealed (channel_auth.h): the hello, the unique ids.
      if (!h.auth.SealChannel(h.socket, h.reader).ok()) return true;
      h.sealed = true;
    }
    auto hello = h.reader.Next();
    if (!hello) return false;
    if (!nccl::DecodeHello(*hello).ok()) return true;
    // A fresh socket's send buffer takes the small answer at once.
    if (!h.socket.SendFrame(nccl::EncodeHello(), h.deadline).ok()) return true;
    auto link = Link::Start(std::move(h.socket), std::move(h.reader), options_, regions_, notes_);
    if (link.ok()) {
      std::lock_guard lock(mu_);
      incoming_.push_back(std::move(link).value());
    }
    return true;
  }

  const LinkOptions options_;
  const PeerAuth auth_;
  std::shared_ptr<RegionTable> regions_ = std::make_shared<RegionTable>();
  std::shared_ptr<NoteSink> notes_ = std::make_shared<NoteSink>();
  Listener listener_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;

  std::mutex mu_;
  std::map<PeerId, std::shared_ptr<Link>> peers_;
  std::vector<std::shared_ptr<Link>> incoming_;
  PeerId next_peer_ = 1;
};

}  // namespace

std::span<const SettingInfo> NcclSettings() {
  static constexpr SettingInfo kSettings[] = {
      {"device", "CUDA ordinal of the copies and communicators (kvd: --device)"},
      {"listen_host", "host of the TCP side channel (127.0.0.1)"},
      {"staging_bytes", "a staging slot and the chunk size; both sides allow it (33554432)"},
      {"staging_slots", "staging slots per side and direction, 1..64 (4)"},
      {"lanes", "communicators per direction the sender opens, 1..4 (4)"},
      {"copy_ctas", "grid of the gather/scatter kernels, 0 = one CTA per SM (16)"},
      {"group_ops", "sends or receives per NCCL launch, at most staging_slots / 2 (2)"},
      {"direct_bytes", "runs this long skip staging, 0 = never (8388608)"},
      {"piece_bytes",
       "a larger put moves as batches of about this many bytes, so its first bytes move while "
       "the rest is laid out, 0 = never cut (67108864)"},
      {"timeout_ms", "connects, communicator creation and control messages (30000)"},
      {"busy_poll",
       "0|1: each link's sender, receiver and reader threads spin instead of sleeping, three "
       "cores per link (0; kvd --busy-poll)"},
      {"blocking_launch",
       "0|1: launch NCCL operations on the link's own threads, on blocking communicators split "
       "from the non-blocking ones, instead of on a thread NCCL starts per launch; the sending "
       "side decides for both. On two H200s: about +0.03 of throughput for bursts of requests, "
       "0.2-0.3 ms more latency per streamed layer (0)"},
  };
  return kSettings;
}

Result<std::unique_ptr<Transport>> CreateNcclTransport(const TransportOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::Unsupported("nccl: no CUDA device visible");
  }
  int current = 0;
  cudaGetDevice(&current);
  LinkOptions link;
  KV_ASSIGN_OR_RETURN(int64_t device, IntSetting(options, "nccl", "device", current, 0));
  KV_ASSIGN_OR_RETURN(int64_t staging,
                      IntSetting(options, "nccl", "staging_bytes", 32ll << 20,
                                 static_cast<int64_t>(nccl::kMinChunkBytes), 1ll << 40));
  KV_ASSIGN_OR_RETURN(int64_t slots, IntSetting(options, "nccl", "staging_slots", 4, 1, 64));
  KV_ASSIGN_OR_RETURN(int64_t lanes,
                      IntSetting(options, "nccl", "lanes", link.lanes, 1, nccl::kMaxLanes));
  KV_ASSIGN_OR_RETURN(int64_t copy_ctas, IntSetting(options, "nccl", "copy_ctas", 16, 0, 1 << 16));
  KV_ASSIGN_OR_RETURN(int64_t group_ops,
                      IntSetting(options, "nccl", "group_ops", link.group_ops, 1, 64));
  KV_ASSIGN_OR_RETURN(int64_t direct, IntSetting(options, "nccl", "direct_bytes",
                                                 static_cast<int64_t>(link.direct_bytes), 0));
  KV_ASSIGN_OR_RETURN(int64_t piece, IntSetting(options, "nccl", "piece_bytes",
                                                static_cast<int64_t>(link.piece_bytes), 0));
  KV_ASSIGN_OR_RETURN(int64_t timeout_ms,
                      IntSetting(options, "nccl", "timeout_ms", 30000, 1, kMaxTimeoutMs));
  KV_ASSIGN_OR_RETURN(int64_t busy_poll, IntSetting(options, "nccl", "busy_poll", 0, 0, 1));
  KV_ASSIGN_OR_RETURN(int64_t blocking_launch,
                      IntSetting(options, "nccl", "blocking_launch", 0, 0, 1));
  if (device >= count) {
    return Status::InvalidArgument("nccl: device " + std::to_string(device) + " of " +
                                   std::to_string(count));
  }
  link.device = static_cast<int>(device);
  link.chunk_bytes = static_cast<uint64_t>(staging);
  link.slots = static_cast<int>(slots);
  link.lanes = static_cast<int>(lanes);
  link.copy_ctas = static_cast<int>(copy_ctas);
  link.group_ops = static_cast<int>(group_ops);
  link.direct_bytes = static_cast<uint64_t>(direct);
  link.piece_bytes = static_cast<uint64_t>(piece);
  link.init_timeout = std::chrono::milliseconds(timeout_ms);
  link.trace = options.trace;
  link.busy_poll = busy_poll != 0;
  link.blocking_launch = blocking_launch != 0;
  std::string host = "127.0.0.1";
  for (const auto& [k, v] : options.settings) {  // the first one wins, as in IntSetting
    if (k == "listen_host") {
      host = v;
      break;
    }
  }
  auto transport = std::make_unique<NcclTransport>(link, options.auth);
  KV_RETURN_IF_ERROR(transport->Start(host));
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace kv::transport
