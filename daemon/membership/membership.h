// kvd's membership in etcd (`kvd --etcd http://HOST:2379`): the daemon's record under
// `<prefix><name>`, attached to a lease that a thread of its own keeps alive, so a daemon that
// dies leaves the list within one lease, and one that exits cleanly revokes it at once.
//
// etcd is optional and never on a transfer's path: kvd serves its static peers whether or not
// etcd answers. An unreachable etcd is logged (once per outage) and retried every second; every
// call to etcd is bounded (EtcdClient's timeout).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/daemon.h"
#include "daemon/membership/etcd_client.h"
#include "base/status.h"

namespace kv::daemon::membership {

inline constexpr char kDefaultPrefix[] = "/kvd/members/";

struct MembershipOptions {
  std::string etcd_url;  // http://HOST:PORT
  std::string prefix = kDefaultPrefix;
  // The record.
  std::string name;
  std::string address;  // peer address, HOST:PORT
  std::vector<std::string> transports;
  std::string version;
  // The lease: etcd drops the record this long after the last keep-alive. Renewed every third.
  std::chrono::seconds ttl{10};
  std::chrono::milliseconds timeout{2000};  // of each call to etcd
};

// One member as etcd holds it (kvctl cluster reads these).
struct Member {
  std::string name, address, version, host;
  std::vector<std::string> transports;
  int64_t pid = 0;
};
// The JSON value of `m` and back.
std::string MemberJson(const Member& m);
Result<Member> ParseMember(const std::string& json);

class Membership {
 public:
  // Fails only on options that can never work (a malformed URL); etcd itself is reached later,
  // on the membership thread.
  static Result<std::unique_ptr<Membership>> Start(MembershipOptions options);
  // Revokes the lease (bounded by the timeout) and joins the thread.
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

 private:
  Membership(MembershipOptions options, EtcdClient client);
  void Run();
  // Grants a lease and puts the record under it; the lease, or 0 when etcd did not take both.
  int64_t Register();

  MembershipOptions options_;
  EtcdClient client_;
  std::string key_, value_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// kvd's --etcd and --etcd-lease-s: null without a URL, else `daemon` registered under its name,
// peer address and transport.
Result<std::unique_ptr<Membership>> JoinIfAsked(const std::string& url,
                                                const std::string& lease_seconds,
                                                const Daemon& daemon);

}  // namespace kv::daemon::membership
