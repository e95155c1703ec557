#include "transport/local/local_transport.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <unistd.h>

#include "base/codec.h"
#include "transport/run_check.h"

namespace kv::transport {
namespace {

constexpr uint32_t kDescriptorMagic = 0x4f4c564b;  // "KVLO"

// What peers can reach of one LocalTransport: its registrations and its task queue. Shared so a
// peer that outlives this transport sees "gone" instead of a dangling pointer.
struct Endpoint {
  std::string address;

  std::mutex mu;  // guards everything below
  std::condition_variable wake;
  std::map<uint64_t, std::pair<char*, uint64_t>> regions;  // live registrations by id
  uint64_t next_region = 1;
  std::deque<std::function<void()>> tasks;  // run in order on the progress thread
  bool closed = false;
  NotificationHandler handler;

  // False once the endpoint closed: the task is dropped.
  bool Push(std::function<void()> task) {
    {
      std::lock_guard lock(mu);
      if (closed) return false;
      tasks.push_back(std::move(task));
    }
    wake.notify_one();
    return true;
  }
};

class Directory {
 public:
  static Directory& Get() {
    static Directory directory;
    return directory;
  }
  std::string Add(const std::shared_ptr<Endpoint>& ep) {
    std::lock_guard lock(mu_);
    // The pid makes addresses of different processes differ, so a peer in another process is
    // refused by connect() instead of resolving to this process's transport of the same number.
    std::string address = "local:" + std::to_string(getpid()) + ":" + std::to_string(next_++);
    endpoints_[address] = ep;
    return address;
  }
  void Remove(const std::string& address) {
    std::lock_guard lock(mu_);
    endpoints_.erase(address);
  }
  std::shared_ptr<Endpoint> Find(std::string_view address) {
    std::lock_guard lock(mu_);
    auto it = endpoints_.find(std::string(address));
    return it == endpoints_.end() ? nullptr : it->second.lock();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<Endpoint>> endpoints_;
  uint64_t next_ = 0;
};

class LocalRegistration final : public MemoryRegistration {
 public:
  LocalRegistration(std::shared_ptr<Endpoint> ep, uint64_t id, char* base, uint64_t length)
      : ep_(std::move(ep)), id_(id), base_(base), length_(length) {}
  ~LocalRegistration() override {
    std::lock_guard lock(ep_->mu);
    ep_->regions.erase(id_);
  }
  void* base() const override { return base_; }
  uint64_t length() const override { return length_; }
  MemoryLocation location() const override { return MemoryLocation::Host(); }
  std::string packed_descriptor() const override {
    return ByteWriter().u32(kDescriptorMagic).bytes(ep_->address).u64(id_).u64(length_).take();
  }
  const Endpoint* endpoint() const { return ep_.get(); }

 private:
  std::shared_ptr<Endpoint> ep_;
  uint64_t id_;
  char* base_;
  uint64_t length_;
};

// A connected peer. `open` turns false on disconnect so queued batches abort.
struct Peer {
  std::weak_ptr<Endpoint> ep;
  std::shared_ptr<std::atomic<bool>> open = std::make_shared<std::atomic<bool>>(true);
};

// `importer` is the endpoint of the transport that imported it: (peer, id) mean something only
// there, and post() refuses a remote another LocalTransport imported (its peer ids would name a
// different peer, whose region `id` may be shorter than the runs were checked against).
class LocalRemote final : public RemoteMemory {
 public:
  LocalRemote(const Endpoint* importer, PeerId peer, uint64_t id, uint64_t length)
      : importer_(importer), peer_(peer), id_(id), length_(length) {}
  PeerId peer() const override { return peer_; }
  uint64_t length() const override { return length_; }
  const Endpoint* importer() const { return importer_; }
  uint64_t id() const { return id_; }

 private:
  const Endpoint* importer_;
  PeerId peer_;
  uint64_t id_;
  uint64_t length_;
};

class LocalTransport final : public Transport {
 public:
  LocalTransport() : ep_(std::make_shared<Endpoint>()) {
    ep_->address = Directory::Get().Add(ep_);
    thread_ = std::thread([this] { ProgressLoop(); });
  }

  ~LocalTransport() override {
    Directory::Get().Remove(ep_->address);
    {
      std::lock_guard lock(mu_);
      stopping_ = true;  // batches still queued complete with kAborted
    }
    {
      std::lock_guard lock(ep_->mu);
      ep_->closed = true;
    }
    ep_->wake.notify_one();
    thread_.join();
  }

  std::string_view name() const override { return "local"; }
  std::string address() const override { return ep_->address; }
  bool supports(MemoryKind kind) const override { return kind == MemoryKind::kHost; }

  Result<std::unique_ptr<MemoryRegistration>> register_memory(void* base, uint64_t length,
                                                              MemoryLocation where) override {
    if (where.kind != MemoryKind::kHost)
      return Status::Unsupported("the local transport copies host memory only");
    if (base == nullptr || length == 0)
      return Status::InvalidArgument("register_memory needs a non-null base and a length > 0");
    std::lock_guard lock(ep_->mu);
    uint64_t id = ep_->next_region++;
    ep_->regions[id] = {static_cast<char*>(base), length};
    return std::unique_ptr<MemoryRegistration>(
        new LocalRegistration(ep_, id, static_cast<char*>(base), length));
  }

  Result<PeerId> connect(std::string_view peer_address) override {
    std::shared_ptr<Endpoint> peer = Directory::Get().Find(peer_address);
    if (!peer) {
      const std::string self = "local:" + std::to_string(getpid()) + ":";
      if (peer_address.substr(0, self.size()) != self) {
        return Status::Incompatible("local transport at '" + std::string(peer_address) +
                                    "' is in another process; the local backend moves bytes "
                                    "inside one process only (use ucx between processes)");
      }
      return Status::Unavailable("no local transport at '" + std::string(peer_address) + "'");
    }
    std::lock_guard lock(mu_);
    PeerId id = next_peer_++;
    peers_[id].ep = peer;
    return id;
  }

  void disconnect(PeerId peer) override {
    std::lock_guard lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    it->second.open->store(false);
    peers_.erase(it);
  }

  Result<std::unique_ptr<RemoteMemory>> import_remote(PeerId peer,
                                                      std::string_view packed) override {
    KV_ASSIGN_OR_RETURN(Peer p, FindPeer(peer));
    ByteReader in(packed);
    uint32_t magic = 0;
    std::string_view address;
    uint64_t id = 0, length = 0;
    if (!in.u32(&magic) || magic != kDescriptorMagic || !in.bytes(&address) || !in.u64(&id) ||
        !in.u64(&length) || !in.at_end())
      return Status::InvalidArgument("not a local transport memory descriptor");
    std::shared_ptr<Endpoint> ep = p.ep.lock();
    if (!ep) return Status::Unavailable("peer " + std::to_string(peer) + " is gone");
    if (address != ep->address)
      return Status::InvalidArgument("descriptor of " + std::string(address) +
                                     " imported for peer " + ep->address);
    std::lock_guard lock(ep->mu);
    auto it = ep->regions.find(id);
    if (it == ep->regions.end() || it->second.second != length)
      return Status::NotFound("descriptor names no live registration of " + ep->address);
    return std::unique_ptr<RemoteMemory>(new LocalRemote(ep_.get(), peer, id, length));
  }

  Status post(const Batch& batch, Completion done) override {
    KV_RETURN_IF_ERROR(CheckBatch(batch));
    auto* local = dynamic_cast<const LocalRegistration*>(batch.local);
    auto* remote = dynamic_cast<const LocalRemote*>(batch.remote);
    if (local == nullptr || local->endpoint() != ep_.get() || remote == nullptr ||
        remote->importer() != ep_.get())
      return Status::InvalidArgument("batch names memory of another transport");
    KV_ASSIGN_OR_RETURN(Peer p, FindPeer(remote->peer()));
    std::vector<Run> runs(batch.runs.begin(), batch.runs.end());
    Enqueue([this, p, op = batch.op, base = static_cast<char*>(local->base()), id = remote->id(),
             runs = std::move(runs), deadline = batch.deadline,
             done = std::move(done)] { done(Copy(p, op, base, id, runs, deadline)); });
    return Status::Ok();
  }

  Status notify(PeerId peer, std::string message) override {
    KV_ASSIGN_OR_RETURN(Peer p, FindPeer(peer));
    // Queued behind every batch posted before it; those memcpys are done when it runs.
    Enqueue([p, message = std::move(message)]() mutable {
      std::shared_ptr<Endpoint> ep = p.ep.lock();
      if (!ep || !p.open->load()) return;
      Endpoint* receiver = ep.get();
      receiver->Push([receiver, message = std::move(message)] {
        NotificationHandler handler;
        {
          std::lock_guard lock(receiver->mu);
          handler = receiver->handler;
        }
        if (handler) handler(message);
      });
    });
    return Status::Ok();
  }

  void set_notification_handler(NotificationHandler handler) override {
    std::lock_guard lock(ep_->mu);
    ep_->handler = std::move(handler);
  }

 private:
  Result<Peer> FindPeer(PeerId peer) {
    std::lock_guard lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end())
      return Status::NotFound("peer " + std::to_string(peer) + " is not connected");
    return it->second;
  }

  // The endpoint closes only in ~LocalTransport, after which no method may be called.
  void Enqueue(std::function<void()> task) { ep_->Push(std::move(task)); }

  Status Copy(const Peer& p, Op op, char* local, uint64_t remote_id, const std::vector<Run>& runs,
              Clock::time_point deadline) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return Status::Aborted("local transport closed");
    }
    if (!p.open->load()) return Status::Aborted("peer disconnected");
    if (Clock::now() > deadline) return Status::Timeout("batch started after its deadline");
    std::shared_ptr<Endpoint> ep = p.ep.lock();
    if (!ep) return Status::Unavailable("peer transport is gone");
    // Holding the peer's lock keeps its registration (and so, by contract, its memory) alive.
    std::lock_guard lock(ep->mu);
    auto it = ep->regions.find(remote_id);
    if (it == ep->regions.end()) return Status::Unavailable("peer deregistered the remote memory");
    char* remote = it->second.first;
    for (const Run& r : runs) {
      if (op == Op::kPut) {
        std::memmove(remote + r.dst_offset, local + r.src_offset, r.length);
      } else {
        std::memmove(local + r.dst_offset, remote + r.src_offset, r.length);
      }
    }
    return Status::Ok();
  }

  void ProgressLoop() {
    std::unique_lock lock(ep_->mu);
    for (;;) {
      ep_->wake.wait(lock, [&] { return !ep_->tasks.empty() || ep_->closed; });
      if (ep_->tasks.empty()) return;
      std::function<void()> task = std::move(ep_->tasks.front());
      ep_->tasks.pop_front();
      lock.unlock();
      task();
      // Destroyed before the lock is taken again: its captures may hold the last reference to a
      // registration of this endpoint (a completion keeping kvd's region alive), whose destructor
      // takes ep_->mu. Destroyed under it, it deadlocked the progress thread, and kvd's io thread
      // with it at its next post (found by fuzz_daemon).
      task = nullptr;
      lock.lock();
    }
  }

  std::shared_ptr<Endpoint> ep_;
  std::thread thread_;

  std::mutex mu_;  // guards everything below
  std::map<PeerId, Peer> peers_;
  PeerId next_peer_ = 1;
  bool stopping_ = false;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateLocalTransport(const TransportOptions& options) {
  if (!options.settings.empty())
    return Status::InvalidArgument("the local transport takes no settings (got " +
                                   options.settings.front().first + ")");
  return std::unique_ptr<Transport>(new LocalTransport());
}

}  // namespace kv::transport
