// kvctl cluster — the live kvds registered in etcd (kvd --etcd).
#include <algorithm>
#include <cstdio>
#include <string>

#include "daemon/membership/etcd_client.h"
#include "daemon/membership/membership.h"
#include "tools/common/cli.h"

namespace kv {
namespace {

constexpr const char* kHelp = R"(kvctl cluster — list the kvds that are alive, as etcd knows them.

Each kvd started with --etcd URL keeps a record under /kvd/members/NAME on a lease it renews; a
kvd that dies drops out within its lease (kvd --etcd-lease-s), one that exits cleanly at once.
Prints one line per daemon: name, peer address (what transfer params name), transports,
version, host and pid. Read-only; talks to etcd's v3 HTTP/JSON gateway.

Examples:
  kvctl cluster --etcd http://10.0.0.5:2379
  kvctl cluster --etcd http://127.0.0.1:2379 --json

Flags:
)";

int ClusterMain(int argc, char** argv) {
  cli::Flags flags({
      {"etcd", "etcd's client URL, http://HOST:PORT (required)"},
      {"prefix", "key prefix of the records (default /kvd/members/)"},
      {"timeout-ms", "how long to wait for etcd (default 2000)"},
      {"json", "print one JSON array", true},
      {"help", "this text", true},
  });
  if (auto exit = flags.ParseOrExit("kvctl cluster", kHelp, argc, argv)) return *exit;
  auto fail = [](const Status& s) { return cli::Fail("kvctl cluster", s); };
  if (!flags.has("etcd")) return fail(Status::InvalidArgument("--etcd URL is required"));
  auto timeout = flags.integer("timeout-ms", 2000, 1, 600000);
  if (!timeout.ok()) return fail(timeout.status());
  auto client = daemon::membership::EtcdClient::Create(flags.str("etcd"),
                                                       std::chrono::milliseconds(*timeout));
  if (!client.ok()) return fail(client.status());
  auto records = client->Prefix(flags.str("prefix", daemon::membership::kDefaultPrefix));
  if (!records.ok()) {
    std::fprintf(stderr, "kvctl cluster: %s\n", records.status().ToString().c_str());
    return 1;  // etcd unreachable: not a usage error
  }
  std::vector<daemon::membership::Member> members;
  for (const auto& [key, value] : *records) {
    auto m = daemon::membership::ParseMember(value);
    if (!m.ok()) {
      std::fprintf(stderr, "kvctl cluster: %s: %s\n", key.c_str(), m.status().ToString().c_str());
      continue;
    }
    members.push_back(*m);
  }
  std::sort(members.begin(), members.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  if (flags.has("json")) {
    std::string out = "[";
    for (size_t i = 0; i < members.size(); ++i) {
      out += (i ? ", " : "") + daemon::membership::MemberJson(members[i]);
    }
    std::printf("%s]\n", out.c_str());
    return 0;
  }
  std::printf("%-20s %-24s %-12s %-10s %s\n", "NAME", "ADDRESS", "TRANSPORTS", "VERSION",
              "HOST/PID");
  for (const auto& m : members) {
    std::string transports;
    for (const auto& t : m.transports) transports += (transports.empty() ? "" : ",") + t;
    std::printf("%-20s %-24s %-12s %-10s %s/%lld\n", m.name.c_str(), m.address.c_str(),
                transports.c_str(), m.version.c_str(), m.host.c_str(),
                static_cast<long long>(m.pid));
  }
  std::printf("%zu live daemon%s\n", members.size(), members.size() == 1 ? "" : "s");
  return 0;
}

const bool registered =
    cli::Register({"cluster", "the live kvds registered in etcd (--etcd URL)", &ClusterMain});

}  // namespace
}  // namespace kv
