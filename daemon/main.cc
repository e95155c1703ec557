// kvd: the KV-cache transfer daemon. See daemon/daemon.h and README.md.
//
// Prints one line "kvd NAME ready listen=HOST:PORT socket=PATH transport=T" on stdout once it
// serves, so that a parent process (kvbench pd, tests) learns the port it picked. SIGTERM or
// SIGINT drains transfers in flight (bounded) and exits 0.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "daemon/daemon.h"
#include "daemon/membership/membership.h"
#include "daemon/peer_auth.h"
#include "transport/transport.h"

namespace {

constexpr const char* kUsage =
    "usage: kvd --name NAME --listen HOST:PORT --socket PATH [--transport "
    "auto|ucx|host_ipc|nccl|ipc|local]\n"
    "           [--device N]\n"
    "           [--offload-bytes N[K|M|G]] [--offload-copy auto|kernel|copy-engine]\n"
    "           [--log-level trace|debug|info|warn|error] [--busy-poll]\n"
    "           [--lease-ms MS] [--heartbeat-ms MS] [--drain-ms MS]\n"
    "           [--auth-secret-file PATH | --insecure] [--transfer-token auto|required|optional]\n"
    "           [--max-peer-connections N] [--max-unauthenticated-peers N]\n"
    "           [--max-peer-connections-per-address N] [--max-source-requests N]\n"
    "           [--max-requests-per-peer N] [--max-registered-bytes N[K|M|G|T]]\n"
    "           [--ucx-net-devices LIST]\n"
    "           [--metrics-listen HOST:PORT] [--etcd http://HOST:PORT [--etcd-lease-s S]]\n"
    "           [--transport-opt KEY=VALUE ...]\n"
    "\n"
    "The KV-cache transfer daemon of one node. Local engines connect to --socket (a unix socket,\n"
    "mode 0600, same user only); peer daemons connect to --listen (port 0 picks a free port; the\n"
    "ready line on stdout names it). Data moves over --transport (auto: the best this build has).\n"
    "--transport ipc is the cuda_ipc backend (GPUs of one host, straight over NVLink / PCIe);\n"
    "  nccl moves GPU memory through NCCL. Both serve engines that register GPU caches.\n"
    "--transport host_ipc: host caches between kvds of one host, one memcpy per run: a peer\n"
    "  kvd maps the engines' memfds (ucx copies twice through its shared-memory FIFO).\n"
    "--device: CUDA ordinal of kvd's own GPU work: the GPU transport's copy stream and GPU\n"
    "  offload (0). Engines' GPU caches are opened on their own devices, matched by UUID, so\n"
    "  CUDA_VISIBLE_DEVICES may differ between kvd and its engines.\n"
    "--lease-ms: how long a source holds a request's blocks waiting for the destination (30000).\n"
    "--heartbeat-ms: peer heartbeat interval; 5 missed declare the peer dead (1000).\n"
    "--drain-ms: on SIGTERM, how long transfers in flight may finish (5000).\n"
    "--busy-poll: kvd's io thread (and the transport's threads, where it has a busy_poll\n"
    "  setting: ipc's posting thread, nccl's three threads per link) spin instead of sleeping,\n"
    "  so a message or batch is picked up within about a microsecond instead of a thread\n"
    "  wake-up (~0.1 ms); costs one core per spinning thread.\n"
    "  For nodes with cores to spare and short requests (benchmarks/pd_gpu.md).\n"
    "--metrics-listen: serve Prometheus metrics at http://HOST:PORT/metrics (none by default).\n"
    "--etcd: register this daemon (name, peer address, transport, version) in etcd under\n"
    "  /kvd/members/NAME, on a lease of --etcd-lease-s seconds (10) kept alive; removed on a\n"
    "  clean exit. `kvctl cluster --etcd URL` lists the live daemons. Optional: static peers\n"
    "  work without it, and an unreachable etcd is logged and retried, never waited for.\n"
    "  Transfer params may then name their source kvd by its --name instead of HOST:PORT: the\n"
    "  name's address comes from etcd (cached; a lost peer's name is looked up again), so a\n"
    "  prefill kvd restarted on another port is found again.\n"
    "--offload-bytes: host memory for the CPU offload pool (0: none). Allocated at start (huge\n"
    "  pages where reserved, pinned with a GPU); the first engine to store, look up or load fixes\n"
    "  the block shape, and the pool keeps its blocks across engine restarts. `kvctl status` and\n"
    "  `kvctl --daemon PATH offload` show its figures.\n"
    "--offload-copy: how GPU pages reach the pool: auto (the copy engine, cudaMemcpyBatchAsync,\n"
    "  which leaves the SMs to the model; the plan-copy kernel for runs under 16 KiB), kernel or\n"
    "  copy-engine (always that one).\n"
    "--auth-secret-file: the peers' shared secret (32+ bytes, mode 0600): every peer connection\n"
    "  starts with a mutual HMAC-SHA256 challenge-response over it. Without it kvd accepts and\n"
    "  dials peers on loopback only; --insecure opens that to any address (trusted networks).\n"
    "  The same secret (and rule) admits peers to nccl's side channel (its unique-id exchange).\n"
    "--transfer-token: whether a peer's WantRequest must present the request's transfer token\n"
    "  (kvd's, returned by the prefill engine's request_finished, or the engine's own, which\n"
    "  the vLLM connector mints into kv_transfer_params). required: a Want without one is\n"
    "  refused; one whose token no prefill rank gave yet waits for it within its lease. Layers\n"
    "  stream to a decode that asks before the prefill finished once the prefill ranks fixed\n"
    "  the token early (set_transfer_token before the first save, as kvbench pd does).\n"
    "  optional: a Want without a token binds the request too; one presented must match.\n"
    "  auto (default): required with --auth-secret-file, optional without.\n"
    "--max-peer-connections (256), --max-unauthenticated-peers (32),\n"
    "  --max-peer-connections-per-address (32), --max-source-requests (65536),\n"
    "  --max-requests-per-peer (16384): limits; see\n"
    "  SECURITY.md and the counters in `kvctl status`.\n"
    "--max-registered-bytes: the KV cache bytes the engines of one instance (all its TP ranks)\n"
    "  may register, host and GPU alike (1T); a registration past it is refused. `kvctl status`\n"
    "  shows each instance's bytes and the refusals.\n"
    "--ucx-net-devices: UCX_NET_DEVICES for --transport ucx (e.g. eth1 or mlx5_0:1): where UCX\n"
    "  listens and sends. Default: lo without --auth-secret-file (and without --insecure), else\n"
    "  UCX's choice (every interface).\n"
    "--transport-opt KEY=VALUE (repeatable): a setting of the transport; the keys of each\n"
    "  backend in this build are listed below. kvd passes --device and --ucx-net-devices itself.\n"
    "  kvd sets NCCL_NVLS_ENABLE=0 in its environment before NCCL starts (NVLink multicast is\n"
    "  not allowed on shared machines; point-to-point never needs it) and removes\n"
    "  NCCL_COMM_SPLIT_SHARE_RESOURCES (nccl's blocking_launch needs the split lanes to share\n"
    "  their connections). UCX still reads its own UCX_* variables; a --transport-opt UCX_*\n"
    "  wins over them.\n";

// Every backend of this build with the settings it takes, for --help.
std::string TransportSettingsHelp() {
  std::string out = "\ntransport settings (--transport-opt KEY=VALUE):\n";
  for (const std::string& name : kv::transport::AvailableTransports()) {
    auto info = kv::transport::DescribeTransport(name);
    if (!info.ok()) continue;
    out += "  " + name + (info->settings.empty() ? ": none\n" : ":\n");
    for (const kv::transport::SettingInfo& s : info->settings) {
      char line[256];
      std::snprintf(line, sizeof line, "    %-20s %s\n", s.key, s.help);
      out += line;
    }
  }
  return out;
}

// "KEY=VALUE" into the daemon's transport settings. The keys kvd derives from its own flags are
// refused here, so that there is one way to say each thing.
bool AddTransportOpt(const std::string& text, kv::daemon::DaemonOptions& options,
                     std::string* error) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    *error = "--transport-opt '" + text + "' is not KEY=VALUE";
    return false;
  }
  const std::string key = text.substr(0, eq);
  if (key == "device") {
    *error = "--transport-opt device: use --device";
    return false;
  }
  if (key == "UCX_NET_DEVICES" || key == "NET_DEVICES") {
    *error = "--transport-opt " + key + ": use --ucx-net-devices";
    return false;
  }
  options.transport_settings.emplace_back(key, text.substr(eq + 1));
  return true;
}

// Peer security flags (SECURITY.md) and their defaults; --insecure is a switch.
const std::map<std::string, std::string> kSecurityFlags = {
    {"auth-secret-file", ""},
    {"insecure", "false"},
    {"transfer-token", "auto"},
    {"max-peer-connections", "256"},
    {"max-unauthenticated-peers", "32"},
    {"max-peer-connections-per-address", "32"},
    {"max-source-requests", "65536"},
    {"max-requests-per-peer", "16384"},
    {"max-registered-bytes", "1T"},
    {"ucx-net-devices", ""}};

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvd: %s\n", message.c_str());
  return 2;
}

bool ParseMs(const std::string& text, std::chrono::milliseconds* out) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v <= 0 || v > 3600 * 1000) return false;
  *out = std::chrono::milliseconds(v);
  return true;
}

// "64G", "512M", "1048576": bytes with an optional binary K/M/G/T suffix.
bool ParseBytes(std::string text, uint64_t* out) {
  uint64_t unit = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        unit = 1ull << 10;
        break;
      case 'M':
      case 'm':
        unit = 1ull << 20;
        break;
      case 'G':
      case 'g':
        unit = 1ull << 30;
        break;
      case 'T':
      case 't':
        unit = 1ull << 40;
        break;
      default:
        break;
    }
    if (unit != 1) text.pop_back();
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || end == text.c_str() || *end != '\0' || errno != 0 ||
      v > (uint64_t{1} << 50) / unit) {
    return false;
  }
  *out = v * unit;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything can start NCCL, which reads these from the environment only
  // (nccl_transport.h): NVLink multicast off, and the lanes' own splitShare not overridden.
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  const bool split_share_set = ::getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES") != nullptr;
  ::unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  kv::daemon::DaemonOptions options;
  std::map<std::string, std::string> flags;
  const std::map<std::string, std::string> known = {
      {"name", "kvd"},        {"listen", "127.0.0.1:0"},
      {"socket", ""},         {"transport", "auto"},
      {"offload-bytes", "0"}, {"log-level", "info"},
      {"lease-ms", "30000"},  {"heartbeat-ms", "1000"},
      {"drain-ms", "5000"},   {"offload-copy", "auto"},
      {"device", "0"},        {"metrics-listen", ""},
      {"etcd", ""},           {"etcd-lease-s", "10"}};
  flags = known;
  flags.insert(kSecurityFlags.begin(), kSecurityFlags.end());
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::fputs(TransportSettingsHelp().c_str(), stdout);
      return 0;
    }
    if (arg.rfind("--", 0) != 0) return Fail("unexpected argument '" + arg + "' (see --help)");
    std::string name = arg.substr(2), value;
    if (name == "busy-poll") {  // a switch: no value
      options.busy_poll = true;
      continue;
    }
    if (name == "insecure") {  // a switch: no value
      flags[name] = "true";
      continue;
    }
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Fail("--" + name + " needs a value");
    }
    if (name == "transport-opt") {  // repeatable
      std::string error;
      if (!AddTransportOpt(value, options, &error)) return Fail(error);
      continue;
    }
    if (!flags.count(name)) return Fail("unknown flag --" + name + " (see --help)");
    flags[name] = value;
  }
  if (flags["socket"].empty()) return Fail("--socket PATH is required (see --help)");
  auto level = spdlog::level::from_str(flags["log-level"]);
  if (level == spdlog::level::off && flags["log-level"] != "off") {
    return Fail("--log-level '" + flags["log-level"] +
                "' is not one of trace|debug|info|warn|error");
  }
  spdlog::set_level(level);
  // Logs go to stderr; stdout carries only the ready line (harnesses read it as the first line).
  auto logger = spdlog::stderr_color_mt("kvd");
  logger->set_level(level);
  spdlog::set_default_logger(std::move(logger));
  if (split_share_set) {
    spdlog::warn(
        "kvd: ignored NCCL_COMM_SPLIT_SHARE_RESOURCES: the nccl backend's lanes set "
        "splitShare themselves (blocking_launch needs it)");
  }

  options.name = flags["name"];
  options.listen = flags["listen"];
  options.socket_path = flags["socket"];
  options.transport_name = flags["transport"];
  std::chrono::milliseconds drain{};
  if (!ParseMs(flags["lease-ms"], &options.lease))
    return Fail("--lease-ms must be in (0, 3600000]");
  if (!ParseMs(flags["heartbeat-ms"], &options.heartbeat_interval)) {
    return Fail("--heartbeat-ms must be in (0, 3600000]");
  }
  if (!ParseMs(flags["drain-ms"], &drain)) return Fail("--drain-ms must be in (0, 3600000]");
  if (!ParseBytes(flags["offload-bytes"], &options.offload_bytes)) {
    return Fail("--offload-bytes '" + flags["offload-bytes"] +
                "' is not a byte count like 65536, 512M or 64G (at most 1 PiB)");
  }
  if (!ParseBytes(flags["max-registered-bytes"], &options.max_registered_bytes) ||
      options.max_registered_bytes == 0) {
    return Fail("--max-registered-bytes '" + flags["max-registered-bytes"] +
                "' is not a byte count like 512G or 1T (at least 1, at most 1 PiB)");
  }
  options.offload_copy = flags["offload-copy"];
  options.metrics_listen = flags["metrics-listen"];
  options.etcd_url = flags["etcd"];  // also resolves daemon names in transfer params
  {
    char* end = nullptr;
    errno = 0;
    long device = std::strtol(flags["device"].c_str(), &end, 10);
    if (flags["device"].empty() || *end != '\0' || errno != 0 || device < 0 || device > 1023) {
      return Fail("--device '" + flags["device"] + "' is not a CUDA ordinal in [0, 1023]");
    }
    options.device = static_cast<int>(device);
  }

  // Peer security (SECURITY.md): the secret is read here, the library takes its bytes.
  if (!flags["auth-secret-file"].empty()) {
    if (flags["insecure"] == "true")
      return Fail("--insecure and --auth-secret-file exclude each other");
    auto secret = kv::daemon::auth::ReadSecretFile(flags["auth-secret-file"]);
    if (!secret.ok()) return Fail(secret.status().message());
    options.auth_secret = std::move(secret).value();
  }
  options.insecure_peers = flags["insecure"] == "true";
  // UCX's tcp interface listens on every interface unless told otherwise: loopback-only kvd
  // keeps it on lo, unless the flag or UCX's own environment variable chose.
  options.ucx_net_devices = flags["ucx-net-devices"];
  if (options.ucx_net_devices.empty() && options.auth_secret.empty() && !options.insecure_peers &&
      std::getenv("UCX_NET_DEVICES") == nullptr) {
    options.ucx_net_devices = "lo";
  }
  // The transport: its settings must be ones it takes (a typo is an error, not a default).
  auto backend = kv::transport::DescribeTransport(options.transport_name);
  if (!backend.ok()) return Fail(backend.status().ToString());
  options.transport_name = backend->name;  // "ipc" is cuda_ipc
  if (backend->capabilities.ucx_config) {
    // The ucx backend turns on UCX's shared-memory peer-failure support through its config, over
    // the environment; a choice made in kvd's environment still wins, passed on as a setting.
    for (const char* name :
         {"UCX_POSIX_ERROR_HANDLING", "UCX_SYSV_ERROR_HANDLING", "UCX_MM_ERROR_HANDLING"}) {
      const bool given =
          std::any_of(options.transport_settings.begin(), options.transport_settings.end(),
                      [&](const auto& s) { return s.first == name || "UCX_" + s.first == name; });
      if (const char* value = std::getenv(name); value != nullptr && !given) {
        options.transport_settings.emplace_back(name, value);
      }
    }
  }
  // --busy-poll reaches the transport's posting thread through its own setting, where it has one.
  if (options.busy_poll && backend->takes("busy_poll")) {
    options.transport_settings.emplace_back("busy_poll", "1");
  }
  if (kv::Status s = kv::transport::CheckSettings(backend->name, {options.transport_settings});
      !s.ok()) {
    return Fail(s.message() + " (see --help)");
  }
  if (flags["transfer-token"] == "required" || flags["transfer-token"] == "optional") {
    options.require_transfer_token = flags["transfer-token"] == "required";
  } else if (flags["transfer-token"] != "auto") {
    return Fail("--transfer-token is auto, required or optional");
  }
  for (auto [flag, out] :
       {std::pair{"max-peer-connections", &options.max_peer_connections},
        {"max-unauthenticated-peers", &options.max_unauthenticated_peers},
        {"max-peer-connections-per-address", &options.max_peer_connections_per_address},
        {"max-source-requests", &options.max_source_requests},
        {"max-requests-per-peer", &options.max_requests_per_peer}}) {
    char* end = nullptr;
    const long v = std::strtol(flags[flag].c_str(), &end, 10);
    if (flags[flag].empty() || *end != '\0' || v < 1 || v > 1000000) {
      return Fail(std::string("--") + flag + " must be in [1, 1000000]");
    }
    *out = static_cast<int>(v);
  }

  // Signals are taken synchronously by this thread; every other thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto daemon = kv::daemon::Daemon::Start(std::move(options));
  if (!daemon.ok()) return Fail(daemon.status().ToString());
  auto membership =
      kv::daemon::membership::JoinIfAsked(flags["etcd"], flags["etcd-lease-s"], **daemon);
  if (!membership.ok()) return Fail(membership.status().ToString());
  std::printf("kvd %s ready listen=%s socket=%s transport=%s\n", (*daemon)->name().c_str(),
              (*daemon)->listen_address().c_str(), flags["socket"].c_str(),
              (*daemon)->transport_name().c_str());
  std::fflush(stdout);

  int signo = 0;
  sigwait(&stop_signals, &signo);
  spdlog::info("kvd {}: {} received, draining for up to {} ms", (*daemon)->name(), strsignal(signo),
               drain.count());
  membership->reset();  // revokes the lease: the record leaves etcd now, not one lease later
  (*daemon)->Shutdown(drain);
  return 0;
}
