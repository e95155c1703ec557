// kvctl status — what a running kvd is doing: name, uptime, memory, peers, regions, transfers,
// and its CPU offload pool.
#include <cstdio>
#include <string>

#include "connector/connector.h"
#include "protocol/kvd.pb.h"
#include "tools/common/cli.h"
#include "tools/kvctl/human_bytes.h"
#include "tools/kvctl/pool_status.h"

namespace kv {
namespace {

constexpr const char* kHelp = R"(kvctl status — ask a running kvd what it is doing.

Connects to kvd's unix socket (the --socket it was started with; only its own user may) and
prints its name, uptime, resident memory, transport and TCP address, the peer daemons and the
state of each session, the engines and KV regions registered, and the transfers in flight,
done and failed with the bytes moved, and the CPU offload pool (kvd --offload-bytes): its
block shape, capacity and use, lookup hits and misses, evictions and the bytes stored and
loaded. Nothing is changed; it is safe on a busy daemon.

Examples:
  kvctl --daemon /tmp/kvd.sock status
  kvctl status --daemon /tmp/kvd.sock --json

Flags:
)";

using tools::JsonQuoted;

int StatusMain(int argc, char** argv) {
  cli::Flags flags({
      {"daemon", "kvd's unix socket (required)"},
      {"timeout-ms", "how long to wait for kvd's answer (default 5000)"},
      {"json", "print one JSON object", true},
      {"help", "this text", true},
  });
  if (auto exit = flags.ParseOrExit("kvctl status", kHelp, argc, argv)) return *exit;
  auto fail = [](const Status& s) { return cli::Fail("kvctl status", s); };
  if (!flags.has("daemon")) return fail(Status::InvalidArgument("--daemon SOCKET is required"));
  auto timeout = flags.integer("timeout-ms", 5000, 1, 600000);
  if (!timeout.ok()) return fail(timeout.status());
  auto s = connector::QueryDaemonStatus(flags.str("daemon"), std::chrono::milliseconds(*timeout));
  if (!s.ok()) return fail(s.status());

  if (flags.has("json")) {
    std::string peers;
    for (const auto& p : s->peers()) {
      if (!peers.empty()) peers += ", ";
      peers += "{\"name\": " + JsonQuoted(p.name()) + ", \"address\": " + JsonQuoted(p.address()) +
               ", \"state\": " + JsonQuoted(p.state()) + "}";
    }
    std::string instances;
    for (const auto& i : s->instances()) {
      if (!instances.empty()) instances += ", ";
      instances += "{\"instance\": " + JsonQuoted(i.instance()) +
                   ", \"engines\": " + std::to_string(i.engines()) +
                   ", \"registered_bytes\": " + std::to_string(i.registered_bytes()) + "}";
    }
    std::printf(
        "{\"name\": %s, \"uptime_seconds\": %.1f, \"resident_bytes\": %llu, "
        "\"transport\": %s, \"listen\": %s, \"peers\": [%s], \"engines\": %u, "
        "\"regions\": %u, \"region_bytes\": %llu, \"transfers_in_flight\": %u, "
        "\"wants_held\": %u, "
        "\"transfers_done\": %llu, \"transfers_failed\": %llu, \"bytes_sent\": %llu, "
        "\"bytes_received\": %llu, \"runs_sent\": %llu, \"batches_posted\": %llu, "
        "\"peer_auth\": %s, \"peer_connections\": %u, \"unauthenticated_connections\": %u, "
        "\"peers_refused\": %llu, \"auth_failures\": %llu, "
        "\"max_registered_bytes\": %llu, \"registrations_refused\": %llu, \"instances\": [%s], "
        "\"offload\": %s}\n",
        JsonQuoted(s->name()).c_str(), s->uptime_seconds(),
        static_cast<unsigned long long>(s->resident_bytes()), JsonQuoted(s->transport()).c_str(),
        JsonQuoted(s->listen_address()).c_str(), peers.c_str(), s->engines(), s->regions(),
        static_cast<unsigned long long>(s->region_bytes()), s->transfers_in_flight(),
        s->wants_held(), static_cast<unsigned long long>(s->transfers_done()),
        static_cast<unsigned long long>(s->transfers_failed()),
        static_cast<unsigned long long>(s->bytes_sent()),
        static_cast<unsigned long long>(s->bytes_received()),
        static_cast<unsigned long long>(s->runs_sent()),
        static_cast<unsigned long long>(s->batches_posted()), JsonQuoted(s->peer_auth()).c_str(),
        s->peer_connections(), s->unauthenticated_connections(),
        static_cast<unsigned long long>(s->peers_refused()),
        static_cast<unsigned long long>(s->auth_failures()),
        static_cast<unsigned long long>(s->max_registered_bytes()),
        static_cast<unsigned long long>(s->registrations_refused()), instances.c_str(),
        tools::PoolStatusJson(s->offload()).c_str());
    return 0;
  }
  std::printf("kvd %s   up %.1f s   resident %s   transport %s on %s\n", s->name().c_str(),
              s->uptime_seconds(), tools::HumanBytes(s->resident_bytes()).c_str(),
              s->transport().c_str(), s->listen_address().c_str());
  std::printf("engines %u   regions %u (%s)\n", s->engines(), s->regions(),
              tools::HumanBytes(s->region_bytes()).c_str());
  std::printf("transfers in flight %u   done %llu   failed %llu   Wants held for a token %u\n",
              s->transfers_in_flight(), static_cast<unsigned long long>(s->transfers_done()),
              static_cast<unsigned long long>(s->transfers_failed()), s->wants_held());
  std::printf("bytes sent %s   received %s   runs sent %llu in %llu posts\n",
              tools::HumanBytes(s->bytes_sent()).c_str(),
              tools::HumanBytes(s->bytes_received()).c_str(),
              static_cast<unsigned long long>(s->runs_sent()),
              static_cast<unsigned long long>(s->batches_posted()));
  std::printf("%s", tools::PoolStatusText(s->offload()).c_str());
  // Security issue 19: the peer port's authentication mode and limits' counters (SECURITY.md).
  std::printf(
      "peer auth %s   connections %u (%u not authenticated)   refused %llu   auth "
      "failures %llu\n",
      s->peer_auth().c_str(), s->peer_connections(), s->unauthenticated_connections(),
      static_cast<unsigned long long>(s->peers_refused()),
      static_cast<unsigned long long>(s->auth_failures()));
  // Registered bytes per engine instance against --max-registered-bytes (issue 19).
  std::printf("registered per instance (limit %s)   refused %llu\n",
              tools::HumanBytes(s->max_registered_bytes()).c_str(),
              static_cast<unsigned long long>(s->registrations_refused()));
  for (const auto& i : s->instances()) {
    std::printf("  %-20s %u engines   %s\n", i.instance().c_str(), i.engines(),
                tools::HumanBytes(i.registered_bytes()).c_str());
  }
  std::printf("peers %d\n", s->peers_size());
  for (const auto& p : s->peers()) {
    std::printf("  %-20s %-24s %s\n", p.name().empty() ? "?" : p.name().c_str(),
                p.address().c_str(), p.state().c_str());
  }
  return 0;
}

const bool registered =
    cli::Register({"status", "what a running kvd is doing (--daemon SOCKET)", &StatusMain});

}  // namespace
}  // namespace kv
