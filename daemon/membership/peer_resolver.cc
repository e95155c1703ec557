#include "daemon/membership/peer_resolver.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "daemon/membership/membership.h"

namespace kv::daemon::membership {

bool IsDaemonName(std::string_view peer) {
  return !peer.empty() && peer.find(':') == std::string_view::npos;
}

Result<std::unique_ptr<PeerResolver>> PeerResolver::Start(ResolverOptions options) {
  KV_ASSIGN_OR_RETURN(EtcdClient client, EtcdClient::Create(options.etcd_url, options.timeout));
  return std::unique_ptr<PeerResolver>(new PeerResolver(std::move(options), std::move(client)));
}

PeerResolver::PeerResolver(ResolverOptions options, EtcdClient client)
    : options_(std::move(options)), client_(std::move(client)) {
  thread_ = std::thread([this] { Run(); });
}

PeerResolver::~PeerResolver() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::optional<std::string> PeerResolver::Cached(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = cache_.find(name);
  if (it == cache_.end()) return std::nullopt;
  if (std::chrono::steady_clock::now() - it->second.fetched > options_.refresh) {
    EnqueueLocked(name);  // stale-while-revalidate: this request goes on with what we have
  }
  return it->second.address;
}

void PeerResolver::Resolve(const std::string& name, Done done) {
  std::unique_lock lock(mu_);
  if (!waiting_.count(name) && waiting_.size() >= options_.max_pending) {
    lock.unlock();
    done(Status::ResourceExhausted("peer name '" + name +
                                   "': " + std::to_string(options_.max_pending) +
                                   " names already wait for etcd"));
    return;
  }
  EnqueueLocked(name);
  waiting_[name].push_back(std::move(done));
}

void PeerResolver::Forget(const std::string& address) {
  std::lock_guard lock(mu_);
  std::erase_if(cache_, [&](const auto& entry) { return entry.second.address == address; });
}

void PeerResolver::EnqueueLocked(const std::string& name) {
  if (waiting_.count(name)) return;  // queued or being looked up: its answer serves this one
  waiting_[name];
  queue_.push_back(name);
  wake_.notify_one();
}

Result<std::string> PeerResolver::Lookup(const std::string& name) const {
  KV_ASSIGN_OR_RETURN(std::optional<std::string> record, client_.Get(options_.prefix + name));
  if (!record) {
    return Status::NotFound("no live kvd named '" + name + "' in etcd " + client_.url());
  }
  KV_ASSIGN_OR_RETURN(Member member, ParseMember(*record));
  if (member.address.empty()) {
    return Status::NotFound("kvd '" + name + "' in etcd has no peer address");
  }
  return member.address;
}

void PeerResolver::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const std::string name = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    Result<std::string> address = Lookup(name);
    lock.lock();
    // Not etcd saying "no such name" (or a malformed record): etcd not answering.
    const Code code = address.status().code();
    const bool unreachable =
        code == Code::kUnavailable || code == Code::kTimeout || code == Code::kIoError;
    if (unreachable && !etcd_down_) {
      spdlog::warn(
          "etcd {} unreachable ({}): peer names resolve from the cache only; static peer "
          "addresses are not affected",
          client_.url(), address.status().ToString());
    } else if (!unreachable && etcd_down_) {
      spdlog::info("etcd {} answers again: peer names resolve", client_.url());
    }
    etcd_down_ = unreachable;
    auto cached = cache_.find(name);
    if (address.ok()) {
      if (cached == cache_.end() || cached->second.address != *address) {
        spdlog::info("peer name {} resolves to {} (etcd)", name, *address);
      }
      cache_[name] = Entry{*address, std::chrono::steady_clock::now()};
    } else if (!unreachable) {
      cache_.erase(name);  // etcd says it is gone: its address goes with it
    } else if (cached != cache_.end()) {
      // etcd is down, the address we hold is all there is: keep it, and ask again later.
      cached->second.fetched = std::chrono::steady_clock::now();
      address = cached->second.address;
    }
    std::vector<Done> done = std::move(waiting_[name]);
    waiting_.erase(name);
    lock.unlock();
    for (auto& d : done) d(address);
    lock.lock();
  }
}

}  // namespace kv::daemon::membership
