#include "daemon/membership/membership.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <cstdlib>
#include <sstream>

#ifndef KVD_VERSION
#define KVD_VERSION "unknown"
#endif

namespace kv::daemon::membership {

namespace pt = boost::property_tree;

std::string MemberJson(const Member& m) {
  std::string transports;
  for (const auto& t : m.transports) {
    if (!transports.empty()) transports += ", ";
    transports += JsonString(t);
  }
  return "{\"name\": " + JsonString(m.name) + ", \"address\": " + JsonString(m.address) +
         ", \"transports\": [" + transports + "], \"version\": " + JsonString(m.version) +
         ", \"host\": " + JsonString(m.host) + ", \"pid\": " + std::to_string(m.pid) + "}";
}

Result<Member> ParseMember(const std::string& json) {
  try {
    std::istringstream in(json);
    pt::ptree tree;
    pt::read_json(in, tree);
    Member m;
    m.name = tree.get<std::string>("name");
    m.address = tree.get<std::string>("address");
    m.version = tree.get<std::string>("version", "");
    m.host = tree.get<std::string>("host", "");
    m.pid = tree.get<int64_t>("pid", 0);
    if (auto ts = tree.get_child_optional("transports")) {
      for (const auto& [unused, t] : *ts) m.transports.push_back(t.get_value<std::string>());
    }
    return m;
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("not a kvd member record: ") + e.what());
  }
}

Result<std::unique_ptr<Membership>> Membership::Start(MembershipOptions options) {
  if (options.name.empty() || options.address.empty()) {
    return Status::InvalidArgument("etcd membership needs the daemon's name and peer address");
  }
  if (options.ttl.count() < 2) return Status::InvalidArgument("etcd lease TTL must be >= 2 s");
  KV_ASSIGN_OR_RETURN(EtcdClient client, EtcdClient::Create(options.etcd_url, options.timeout));
  return std::unique_ptr<Membership>(new Membership(std::move(options), std::move(client)));
}

Membership::Membership(MembershipOptions options, EtcdClient client)
    : options_(std::move(options)), client_(std::move(client)) {
  key_ = options_.prefix + options_.name;
  Member m;
  m.name = options_.name;
  m.address = options_.address;
  m.transports = options_.transports;
  m.version = options_.version;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) m.host = host;
  m.pid = getpid();
  value_ = MemberJson(m);
  thread_ = std::thread([this] { Run(); });
}

Membership::~Membership() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t Membership::Register() {
  auto lease = client_.GrantLease(options_.ttl.count());
  if (!lease.ok()) {
    spdlog::debug("kvd {}: etcd: {}", options_.name, lease.status().ToString());
    return 0;
  }
  if (Status s = client_.Put(key_, value_, *lease); !s.ok()) {
    spdlog::debug("kvd {}: etcd: {}", options_.name, s.ToString());
    (void)client_.Revoke(*lease);
    return 0;
  }
  return *lease;
}

void Membership::Run() {
  int64_t lease = 0;
  auto renewed = std::chrono::steady_clock::now();
  bool reported_down = false;  // one warning per outage, not one per retry
  const auto renew = std::chrono::duration_cast<std::chrono::milliseconds>(options_.ttl) / 3;
  const auto retry = std::chrono::milliseconds(1000);
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    if (lease == 0) {
      lease = Register();
      renewed = std::chrono::steady_clock::now();
      if (lease != 0) {
        spdlog::info("kvd {}: registered in etcd {} as {} (lease {} s)", options_.name,
                     client_.url(), key_, options_.ttl.count());
        reported_down = false;
      } else if (!reported_down) {
        spdlog::warn(
            "kvd {}: etcd {} unreachable or refusing; serving static peers, retrying "
            "every second",
            options_.name, client_.url());
        reported_down = true;
      }
    } else {
      auto left = client_.KeepAlive(lease);
      if (left.ok() && *left > 0) {
        renewed = std::chrono::steady_clock::now();
      } else if (left.ok() || std::chrono::steady_clock::now() - renewed > options_.ttl) {
        // Lost (expired: etcd restarted without its data, or we could not reach it for a whole
        // TTL): the record went with the lease, so register afresh.
        spdlog::warn("kvd {}: etcd lease {} lost ({}); registering again", options_.name, lease,
                     left.ok() ? "expired" : left.status().ToString());
        lease = 0;
      }
      // Otherwise a failed renewal inside the TTL: the lease still holds; try again sooner.
    }
    lock.lock();
    if (stop_) break;
    wake_.wait_for(lock, lease != 0 ? renew : retry, [this] { return stop_; });
  }
  lock.unlock();
  if (lease != 0) {
    // Clean exit: the record goes now, not one TTL later.
    if (Status s = client_.Revoke(lease); !s.ok()) {
      spdlog::warn("kvd {}: could not revoke etcd lease {}: {}", options_.name, lease,
                   s.ToString());
    }
  }
}

Result<std::unique_ptr<Membership>> JoinIfAsked(const std::string& url,
                                                const std::string& lease_seconds,
                                                const Daemon& daemon) {
  if (url.empty()) return std::unique_ptr<Membership>();
  char* end = nullptr;
  const long ttl = std::strtol(lease_seconds.c_str(), &end, 10);
  if (lease_seconds.empty() || *end != '\0' || ttl < 2 || ttl > 3600) {
    return Status::InvalidArgument("--etcd-lease-s '" + lease_seconds + "' is not in [2, 3600]");
  }
  MembershipOptions m;
  m.etcd_url = url;
  m.name = daemon.name();
  m.address = daemon.listen_address();
  m.transports = {daemon.transport_name()};
  m.version = KVD_VERSION;
  m.ttl = std::chrono::seconds(ttl);
  return Membership::Start(std::move(m));
}

}  // namespace kv::daemon::membership
