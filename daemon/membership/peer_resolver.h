// Daemon names in transfer params, resolved through etcd (`kvd --etcd`): a decode engine's
// start_load may name its source kvd by its daemon name ("prefill-3") where it would give
// HOST:PORT, and the decode kvd looks the name up among the members etcd holds (membership.h).
// A prefill kvd restarted on another port, or moved to another host, is found again: its new
// record replaces the old one under the same key.
//
// Never in a transfer's way beyond the first lookup of a name: addresses are cached, a cached
// one is used at once however old (it keeps working while its daemon lives), and refreshed in
// the background once older than `refresh`. Only a name never seen, or one whose address failed
// (Forget), waits for etcd, on the resolver's own thread, bounded by `timeout`. etcd unreachable:
// cached names keep their addresses, new names fail, the outage is logged once.
//
// Thread-safety: every method may be called from any thread. Callbacks run on the resolver's
// thread, never inside a call to the resolver; they must not block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/status.h"
#include "daemon/membership/etcd_client.h"

namespace kv::daemon::membership {

// Whether a transfer's peer (StartLoad.peer_address) is a daemon name rather than HOST:PORT:
// a name has no ':' (kvd --name), an address always has one.
bool IsDaemonName(std::string_view peer);

struct ResolverOptions {
  std::string etcd_url;                     // http://HOST:PORT
  std::string prefix = "/kvd/members/";     // membership.h's kDefaultPrefix
  std::chrono::milliseconds timeout{1000};  // of each etcd lookup
  // A cached address older than this is looked up again in the background on its next use.
  std::chrono::milliseconds refresh{5000};
  size_t max_pending = 1024;  // names waiting for etcd at once; more fail at once
};

class PeerResolver {
 public:
  // Address of a name, or: NotFound (etcd has no live member of that name), Unavailable (etcd
  // did not answer within the timeout), ResourceExhausted (too many names pending).
  using Done = std::function<void(Result<std::string>)>;

  // Fails only on a malformed URL; etcd itself is reached on first use.
  static Result<std::unique_ptr<PeerResolver>> Start(ResolverOptions options);
  // Joins the thread; callbacks of lookups not finished are dropped, never called.
  ~PeerResolver();
  PeerResolver(const PeerResolver&) = delete;
  PeerResolver& operator=(const PeerResolver&) = delete;

  // The cached address of `name`, if any, without waiting; one older than `refresh` is also
  // queued for a lookup in the background.
  std::optional<std::string> Cached(const std::string& name);
  // Looks `name` up in etcd and calls `done` with the result on the resolver's thread. Lookups of
  // one name share one etcd call.
  void Resolve(const std::string& name, Done done);
  // `address` failed (its connection was lost or refused): every name cached at it is dropped,
  // so the next request for one looks it up again.
  void Forget(const std::string& address);

 private:
  struct Entry {
    std::string address;
    std::chrono::steady_clock::time_point fetched;
  };
  PeerResolver(ResolverOptions options, EtcdClient client);
  void Run();
  // Queues `name` unless it is already; mu_ held.
  void EnqueueLocked(const std::string& name);
  Result<std::string> Lookup(const std::string& name) const;

  ResolverOptions options_;
  EtcdClient client_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::map<std::string, Entry> cache_;
  std::map<std::string, std::vector<Done>> waiting_;  // by name: queued or being looked up
  std::deque<std::string> queue_;
  bool etcd_down_ = false;  // logged once per outage
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kv::daemon::membership
