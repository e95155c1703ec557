// kvbench pd: the P/D demo. A prefill and a decode engine simulator per TP rank move
// deterministic K/V through two kvds (started here on free loopback ports unless sockets are
// given), every decode rank verifies every byte it should hold, and the throughput is printed
// beside its ceiling (host: one thread memcpy'ing the last wave's runs between the caches,
// tools/kvbench/pd/pd_ceiling.h) and `kvbench transport` for the same run size and transport,
// measured right after.
// --memory cuda puts the caches on GPUs (connector/pd_gpu.h) and holds the result to the GPU
// ceilings (gpu_ceiling.h) instead.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "protocol/kvd.pb.h"
#include "tools/common/cli.h"
#include "tools/kvbench/gpu_ceiling.h"
#include "tools/kvbench/pd/pd_gpu.h"
#include "tools/kvbench/pd/pd_sim.h"
#include "tools/testing/kvd_process.h"
#include "transport/transport.h"

namespace kv::bench {
namespace {

using connector::Connector;
using connector::ConnectorOptions;
using connector::PdConfig;

}  // namespace

GpuCeilingFn& GpuCeilingSlot() {
  static GpuCeilingFn fn = nullptr;
  return fn;
}

namespace {

// "; the prefill kvd (SOCKET) does not answer: ..." for each kvd that does not answer a status
// query within 2 s, or "" when both do.
std::string DaemonsGone(const std::string& prefill_socket, const std::string& decode_socket) {
  std::string out;
  for (auto [role, socket] : {std::pair{"prefill", &prefill_socket}, {"decode", &decode_socket}}) {
    auto status = connector::QueryDaemonStatus(*socket, std::chrono::milliseconds(2000));
    if (!status.ok()) {
      out += std::string("; the ") + role + " kvd (" + *socket +
             ") does not answer: " + status.status().ToString();
    }
  }
  return out;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvbench pd: %s\n", message.c_str());
  return 2;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// The reference printed beside the host ceiling (what the transport reaches on this run size,
// not a bound on kvd): `kvbench transport` of the same backend, with the same UCX settings
// (this process's environment, inherited by the child and the kvds alike, and the same
// --transport-opt settings), for runs of the size
// kvd posted on average, on the same kind of memory kvd moves: memory registered with the
// transport (--user-memory), as kvd registers the engines' shared memory, not memory the
// transport allocated itself (a faster path UCX offers only to its own segments); cycling
// through a wave's worth of distinct bytes (--footprint), as kvd does, rather than rewriting one
// batch that stays in the CPU caches; median of 3 rounds.
std::string CeilingCommand(const std::string& backend, uint64_t run_bytes, uint64_t runs_per_batch,
                           uint64_t footprint, const std::vector<std::string>& transport_opts,
                           const std::string& binary = "kvbench") {
  std::string command = binary + " transport --backend " + backend + " --user-memory --size " +
                        std::to_string(run_bytes) + " --runs-per-batch " +
                        std::to_string(std::max<uint64_t>(1, runs_per_batch)) + " --footprint " +
                        std::to_string(footprint) + " --iters 200 --rounds 3";
  for (const std::string& opt : transport_opts) command += " --transport-opt '" + opt + "'";
  return command;
}

// Runs CeilingCommand in a child process. 0 when it could not be measured (reason on stderr).
double MeasureCeiling(const std::string& backend, uint64_t run_bytes, uint64_t runs_per_batch,
                      uint64_t footprint, const std::vector<std::string>& transport_opts) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = CeilingCommand(backend, run_bytes, runs_per_batch, footprint,
                                             transport_opts, "'" + self + "'") +
                              " --no-ceiling --json";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return 0;
  std::string out;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  if (pclose(pipe) != 0) {
    std::fprintf(stderr, "kvbench pd: ceiling run failed: %s\n", command.c_str());
    return 0;
  }
  const size_t at = out.find("\"gbps\":");
  return at == std::string::npos ? 0 : std::atof(out.c_str() + at + 7);
}

// What --memory cuda adds to the report: the streaming tail, the decode attention check and the
// GPU ceilings of one request's bytes, as table lines and as JSON members.
struct GpuFigures {
  double ceiling_gbps = 0;  // of the transport's own ceiling (ipc: peer copy; nccl: ncclSend)
  std::string ceiling_command, table, json;
};

GpuFigures GpuReport(const PdConfig& c, const connector::PdResult& r,
                     const connector::CudaPdEngines& gpu, const std::string& transport,
                     int decode_device, bool measure) {
  GpuFigures f;
  const uint64_t request_bytes = r.verified > 0 ? r.bytes / r.verified : 0;
  GpuCeilings ceilings;
  std::string error;
  if (measure && request_bytes > 0 && GpuCeilingSlot() != nullptr) {
    auto measured = GpuCeilingSlot()(0, decode_device, request_bytes, 10);
    if (measured.ok()) ceilings = *measured;
    if (!measured.ok()) error = measured.status().ToString();
  }
  auto gbs = [&](double seconds) { return seconds > 0 ? request_bytes / seconds / 1e9 : 0.0; };
  const double peer = gbs(ceilings.peer_seconds), nccl = gbs(ceilings.nccl_seconds);
  const double page_kernel = gbs(ceilings.page_kernel_seconds);
  const std::string piece = " of " + std::to_string(request_bytes) + " bytes in one piece";
  if (transport == "nccl" && nccl > 0) {
    f.ceiling_gbps = nccl;
    f.ceiling_command = "one ncclSend/ncclRecv" + piece;
  } else if ((transport == "cuda_ipc" || transport == "ipc") && peer > 0) {
    f.ceiling_gbps = peer;
    f.ceiling_command = "one cudaMemcpyPeerAsync" + piece;
  }
  const double gbps = r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0;
  const double s50 = Percentile(r.stream_ms, 0.5), s99 = Percentile(r.stream_ms, 0.99);
  const auto a = gpu.attention();
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "  streaming: last layer saved -> last layer in place   p50 %.3f ms   p99 %.3f ms"
                "   (forward pass %lld us per layer)\n"
                "  decode attention: %llu values compared with the prefill side's, %llu exact, "
                "max |diff| %.3g\n",
                s50, s99, static_cast<long long>(c.layer_time.count()),
                static_cast<unsigned long long>(a.values), static_cast<unsigned long long>(a.exact),
                a.max_abs_diff);
  f.table = buf;
  if (measure) {
    std::snprintf(buf, sizeof(buf),
                  "  GPU ceilings, GPU 0 -> GPU %d, one request (%.1f MiB) in one piece: "
                  "cudaMemcpyPeerAsync %.1f GB/s, ncclSend/ncclRecv %.1f GB/s; the plan copy "
                  "kernel over random 64 KiB pages %.1f GB/s%s%s\n",
                  decode_device, request_bytes / 1048576.0, peer, nccl, page_kernel,
                  error.empty() ? "" : "; ", error.c_str());
    f.table += buf;
  }
  if (f.ceiling_gbps > 0) {
    std::snprintf(buf, sizeof(buf), "  ratio %.2f of %s\n", gbps / f.ceiling_gbps,
                  f.ceiling_command.c_str());
    f.table += buf;
    // cuda_ipc moves pages smaller than a megabyte with that kernel: the SMs' bound on NVLink.
    if (f.ceiling_command.find("cudaMemcpyPeerAsync") != std::string::npos && page_kernel > 0) {
      std::snprintf(buf, sizeof(buf),
                    "  (%.2f of the plan copy kernel on random 64 KiB pages, the bound of "
                    "cuda_ipc's copies of small pages)\n",
                    gbps / page_kernel);
      f.table += buf;
    }
  }
  std::snprintf(buf, sizeof(buf),
                ", \"memory\": \"cuda\", \"decode_device\": %d, \"layer_us\": %lld, "
                "\"stream_p50_ms\": %.3f, \"stream_p99_ms\": %.3f, \"peer_gbps\": %.4f, "
                "\"nccl_gbps\": %.4f, \"page_kernel_gbps\": %.4f, \"attention_values\": %llu, "
                "\"attention_exact\": %llu, "
                "\"attention_max_abs_diff\": %.6g",
                decode_device, static_cast<long long>(c.layer_time.count()), s50, s99, peer, nccl,
                page_kernel, static_cast<unsigned long long>(a.values),
                static_cast<unsigned long long>(a.exact), a.max_abs_diff);
  f.json = buf;
  return f;
}

int PdMain(int argc, char** argv) {
  cli::Flags flags({
      {"prefill-daemon", "unix socket of a running prefill kvd (default: start one here)"},
      {"decode-daemon",
       "unix socket of a running decode kvd (default: start one here); a comma-separated list "
       "puts decode rank r behind kvd r % n (TP across hosts)"},
      {"memory",
       "where the KV caches live: host (default) or cuda (prefill on GPU 0, decode on GPU 1, "
       "or GPU 0 with one GPU)"},
      {"transport",
       "transport of the kvds started here: auto|ucx|host_ipc|nccl|ipc (default auto; host_ipc: "
       "host memory, one memcpy per run)"},
      {"transport-opt",
       "KEY=VALUE (repeatable): a setting of the kvds' transport, passed to them as kvd "
       "--transport-opt (keys: kvd --help), and to the ucx ceiling run",
       false, true},
      {"requests", "requests to move (default 32)"},
      {"tokens", "prompt tokens per request (default 512)"},
      {"layers", "layers (default 16)"},
      {"heads", "total KV heads of the model (default 8)"},
      {"head-dim", "elements per head, fp16 (default 128)"},
      {"block-size", "tokens per block on both sides (default 16)"},
      {"prefill-block-size", "tokens per block on the prefill side (default --block-size)"},
      {"decode-block-size", "tokens per block on the decode side (default --block-size)"},
      {"prefill-order", "physical order of the prefill cache, e.g. BLHNC, SBNHC (default LBNHC)"},
      {"decode-order", "physical order of the decode cache (default LBNHC)"},
      {"prefill-tp", "prefill tensor-parallel size (default 1)"},
      {"decode-tp", "decode tensor-parallel size (default 1)"},
      {"mla", "MLA cache: one latent head replicated on every rank", true},
      {"mode", "push: stream each layer as it is saved (default); pull: whole request at the end"},
      {"window", "requests in flight per wave (default 8)"},
      {"block-ids",
       "block ids each request gets: contiguous (default) or random (a seeded shuffle per wave, "
       "as an engine's allocator after churn; see --help)"},
      {"prewrite",
       "prefill engines write every layer's K/V before the clock starts and save the layers "
       "back to back; the clock stops when the last layer is in place, decode engines verify "
       "after it: times kvd alone (default: writing and verifying K/V are on the clock)",
       true},
      {"warmup-waves",
       "waves of --window requests moved and verified first but left out of the figures: the "
       "first wave pays the peer session and the opening of the peer's memory, once per peer; "
       "their own GB/s is printed beside (the \"warm-up\" line, warmup_gbps in --json) "
       "(default 1 with --prewrite, else 0)"},
      {"layer-us",
       "the forward pass of one layer on the prefill side before it is written, in "
       "microseconds (default 0)"},
      {"timeout-ms",
       "how long an engine waits for a layer or a release before the request fails (default "
       "20000); the cluster tests shorten it to see faults fail in bounded time"},
      {"no-ceiling", "skip the ceiling and the kvbench transport comparison", true},
      {"host-path",
       "host memory over ucx: auto (default: the chooser, by mean run size), direct (one put "
       "per run) or staged (gather -> one put -> scatter); sets the kvds' stage_runs_below"},
      {"auth-secret-file",
       "the kvds started here authenticate each other with this secret (SECURITY.md) and "
       "require transfer tokens (kvd --transfer-token auto): each request gets a random 128-bit "
       "token that the prefill engines fix before their first save (SetTransferToken) and the "
       "decode engines present, so layers stream while the prefill runs"},
      {"busy-poll",
       "the kvds started here spin instead of sleeping (kvd --busy-poll: lower latency per "
       "message, a core per spinning thread)",
       true},
      {"engine-busy-poll",
       "the engines' connectors spin on their kvd's socket and in their waits instead of "
       "sleeping (ConnectorOptions::busy_poll, kvd_busy_poll in vLLM's extra config): a core per "
       "engine, and the waiting thread's while it waits",
       true},
      {"trace",
       "kvd's per-layer trace with the engines' side (wave start, first save, loads sent, each "
       "layer in place) on stderr, for tools/pd_timeline.py: the kvds started here log at debug "
       "level to the same stderr (`kvbench pd --trace ... 2> t.log; tools/pd_timeline.py t.log`); "
       "kvds of --prefill-daemon/--decode-daemon need --log-level debug",
       true},
      {"keep-going",
       "run every wave even after one failed (default: stop at the first failed wave, name the "
       "kvd that is gone, exit 1)",
       true},
      {"tag",
       "prefix of the engines' instance names and the request ids (TAG-prefill, TAG-req-0): "
       "several runs at once against the same kvds (default: none)"},
      {"peer-by-name",
       "the decode engines name the prefill kvd by its daemon name in their transfer params, "
       "not by its address: the decode kvd resolves it through etcd (kvd --etcd)",
       true},
      {"json", "print one JSON object instead of the table", true},
      {"help", "this text", true},
  });
  Status parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) return Fail(parsed.message() + " (see --help)");
  if (flags.has("help")) {
    std::printf(
        "kvbench pd — prefill/decode disaggregation end to end, every byte verified\n\n"
        "Starts two kvd processes on free loopback ports (or uses --prefill-daemon and\n"
        "--decode-daemon), runs one prefill and one decode engine per TP rank, and moves each\n"
        "request's KV cache layer by layer: the prefill engines write K/V with the token-writing\n"
        "kernel (its CPU reference on host memory) and save each layer; kvd pushes the layer's\n"
        "pages to the decode kvd; the decode engines wait per layer and check every byte.\n"
        "Layouts, TP sizes and block sizes may differ between the sides: the planner converts.\n"
        "Exits non-zero when any request failed or any byte differed.\n\n"
        "Host memory: the ceiling printed beside the result is one thread memcpy'ing every run\n"
        "of the last wave, planned as kvd plans it, from the prefill caches straight into the\n"
        "decode caches (the same pages kvd moved, mapped in this process), after the run with\n"
        "the kvds idle; median of >= 3 rounds. kvd over UCX copies each byte at least once,\n"
        "each copy on one thread (direct: UCX's put; staged: gather, put, scatter, pipelined,\n"
        "each stage touching the same scattered pages), so this bounds it from above on this\n"
        "machine and footprint; a ratio above 1 would mean the bound is wrong. Beside\n"
        "it, for reference (not a bound): `kvbench transport --user-memory` of the same run\n"
        "size, footprint and transport settings, run right after.\n"
        "--host-path direct|staged forces one path of the ucx chooser (one put per run, or\n"
        "gather -> one put -> scatter); run both to compare them on one shape.\n\n"
        "Block ids: by default request j of a wave holds blocks j*n .. j*n+n-1 (n blocks per\n"
        "request), so on an LBNHC cache each layer of a request is one contiguous run (runs per\n"
        "request = layers, TP 1 to TP 1). --block-ids random shuffles each wave's blocks (the\n"
        "prefill and decode sides independently, the same seed on every run), as a real engine's\n"
        "block allocator hands them out after some churn: each layer of a request becomes one run\n"
        "per block (runs per request about layers x n, each run one block of one layer), which\n"
        "exposes kvd's cost per run. Guard blocks past the wave's stay unused and are checked\n"
        "to be zero either way. The default keeps figures comparable with earlier ones.\n\n"
        "Transfer tokens: each request gets a random 128-bit token, as a router that knows the\n"
        "request ahead would mint it; every prefill engine fixes it with SetTransferToken\n"
        "(kv_set_transfer_token) before its first save, and the decode engines present it. So\n"
        "layers stream while the prefill runs also where kvd requires tokens: kvds with a\n"
        "secret (--auth-secret-file here, or your own with --prefill-daemon/--decode-daemon).\n\n"
        "examples:\n"
        "  kvbench pd\n"
        "  kvbench pd --prefill-tp 2 --decode-tp 1 --decode-order BLHNC --decode-block-size 32\n"
        "  kvbench pd --mla --mode pull --json\n"
        "  kvbench pd --prewrite          # kvd alone, against its ceiling\n"
        "  kvbench pd --prewrite --block-ids random   # one run per block and layer\n"
        "  kvbench pd --memory cuda --transport ipc --tokens 4096 --layers 32 --layer-us 1000\n\n"
        "With --memory cuda the prefill engines write K/V with the token-writing kernel on their\n"
        "own streams and save each layer without a host sync; the decode engines check every\n"
        "byte and the decode attention output against the prefill side's on their GPU. It also\n"
        "prints the streaming tail (last layer saved -> last layer in place, p50/p99) and the\n"
        "GPU ceilings: one cudaMemcpyPeerAsync (ipc) and one ncclSend/ncclRecv (nccl) of one\n"
        "request's bytes in one piece, measured after the run.\n\nflags:\n%s",
        flags.Help().c_str());
    return 0;
  }
  const std::string memory = flags.str("memory", "host");
  if (memory != "host" && memory != "cuda") {
    return Fail("--memory is host or cuda, not " + memory);
  }
  const bool cuda = memory == "cuda";
  PdConfig c;
  auto integer = [&](const char* name, int64_t fallback, int64_t lo, int64_t hi, auto* out) {
    auto v = flags.integer(name, fallback, lo, hi);
    if (!v.ok()) return v.status();
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(*v);
    return Status::Ok();
  };
  int64_t block_size = 16, layer_us = 0, timeout_ms = 20000;
  for (Status s :
       {integer("requests", 32, 1, 1 << 20, &c.requests),
        integer("tokens", 512, 1, 1 << 20, &c.tokens), integer("layers", 16, 1, 4096, &c.layers),
        integer("heads", 8, 1, 4096, &c.heads), integer("head-dim", 128, 1, 65536, &c.head_dim),
        integer("block-size", 16, 1, 65536, &block_size),
        integer("prefill-tp", 1, 1, 64, &c.prefill_tp),
        integer("decode-tp", 1, 1, 64, &c.decode_tp), integer("window", 8, 1, 4096, &c.window),
        integer("layer-us", 0, 0, 10000000, &layer_us),
        integer("timeout-ms", 20000, 1, 3600000, &timeout_ms)}) {
    if (!s.ok()) return Fail(s.message());
  }
  for (Status s : {integer("prefill-block-size", block_size, 1, 65536, &c.prefill_block_size),
                   integer("decode-block-size", block_size, 1, 65536, &c.decode_block_size)}) {
    if (!s.ok()) return Fail(s.message());
  }
  c.prefill_order = flags.str("prefill-order", "LBNHC");
  c.decode_order = flags.str("decode-order", "LBNHC");
  c.mla = flags.has("mla");
  c.prewrite = flags.has("prewrite");
  c.trace = flags.has("trace");
  if (Status s = integer("warmup-waves", c.prewrite ? 1 : 0, 0, 64, &c.warmup_waves); !s.ok()) {
    return Fail(s.message());
  }
  c.layer_time = std::chrono::microseconds(layer_us);
  c.timeout = std::chrono::milliseconds(timeout_ms);
  c.copy_ceiling = !cuda && !flags.has("no-ceiling");
  const std::string host_path = flags.str("host-path", "auto");
  if (host_path != "auto" && host_path != "direct" && host_path != "staged")
    return Fail("--host-path is auto, direct or staged, not " + host_path);
  const std::string block_ids = flags.str("block-ids", "contiguous");
  if (block_ids != "contiguous" && block_ids != "random") {
    return Fail("--block-ids is contiguous or random, not " + block_ids);
  }
  c.block_ids =
      block_ids == "random" ? connector::BlockIds::kRandom : connector::BlockIds::kContiguous;
  const std::string mode = flags.str("mode", "push");
  if (mode != "push" && mode != "pull") return Fail("--mode must be push or pull, not " + mode);
  c.mode = mode == "pull" ? connector::Mode::kPull : connector::Mode::kPush;
  c.stop_at_failed_wave = !flags.has("keep-going");
  c.engine_busy_poll = flags.has("engine-busy-poll");
  c.tag = flags.str("tag", "");
  c.peer_by_name = flags.has("peer-by-name");
  for (bool prefill : {true, false}) {
    auto spec = connector::PdLayout(c, prefill, 0);
    if (!spec.ok()) return Fail(spec.status().message());
    auto region = KvRegion::Create(*spec);
    if (!region.ok()) {
      return Fail(std::string(prefill ? "prefill" : "decode") +
                  " layout: " + region.status().message());
    }
  }
  if (flags.has("prefill-daemon") != flags.has("decode-daemon")) {
    return Fail("give both --prefill-daemon and --decode-daemon, or neither");
  }
  const bool json = flags.has("json");
  std::string transport = flags.str("transport", "auto");
  // The two kvds started here are processes, and the local transport moves bytes inside one: it
  // would fail every wave at its timeout, so say so now.
  if (transport == "local" && !flags.has("prefill-daemon")) {
    return Fail(
        "--transport local moves bytes inside one process, and kvbench pd starts two kvd "
        "processes: use ucx (or auto) here; the local transport serves kvd embedded in an "
        "engine (Connector::OpenEmbedded)");
  }

  // GPU engines, before any kvd starts: a build or machine without CUDA fails here, clearly.
  // The host path never initialises CUDA.
  std::unique_ptr<connector::CudaPdEngines> gpu;
  int decode_device = 0;
  if (cuda) {
    decode_device = connector::CudaDeviceCount() > 1 ? 1 : 0;
    auto engines = connector::CudaPdEngines::Create(c, 0, decode_device);
    if (!engines.ok()) return Fail(engines.status().message());
    gpu = std::move(*engines);
  }

  // Our own kvds, unless the user runs theirs. Their guards stop them on every path.
  std::unique_ptr<kv::harness::KvdProcess> prefill_kvd, decode_kvd;
  std::filesystem::path dir;
  std::string prefill_socket = flags.str("prefill-daemon"),
              decode_socket = flags.str("decode-daemon");
  struct DirGuard {
    std::filesystem::path* dir;
    ~DirGuard() {
      std::error_code ec;
      if (!dir->empty()) std::filesystem::remove_all(*dir, ec);
    }
  } dir_guard{&dir};
  // Issue 19: the kvds started here authenticate each other with the secret when given one, and
  // then require transfer tokens (kvd's default, --transfer-token auto). The decode engines here
  // ask before the prefill finished (layer streaming): they present the token the prefill
  // engines fixed before their first save (PdConfig::transfer_tokens).
  std::vector<std::string> security_args, transport_args;
  auto transport_opts = flags.key_values("transport-opt");  // checked by the kvds themselves
  if (!transport_opts.ok()) return Fail(transport_opts.status().message());
  if (!transport_opts->empty() && !prefill_socket.empty())
    return Fail("--transport-opt is for the kvds started here");
  if (host_path != "auto") {
    if (!prefill_socket.empty()) return Fail("--host-path is for the kvds started here");
    if (cuda || (transport != "ucx" && transport != "auto"))
      return Fail("--host-path chooses between the ucx transport's paths for host memory");
    transport_opts->push_back(
        {"stage_runs_below", host_path == "direct" ? "0" : std::to_string(1ull << 30)});
  }
  std::vector<std::string> opt_strings;
  for (const auto& [key, value] : *transport_opts) {
    transport_args.insert(transport_args.end(), {"--transport-opt", key + "=" + value});
    opt_strings.push_back(key + "=" + value);
  }
  if (flags.has("busy-poll")) {
    if (!prefill_socket.empty()) return Fail("--busy-poll is for the kvds started here");
    transport_args.push_back("--busy-poll");
  }
  if (flags.has("auth-secret-file")) {
    if (!prefill_socket.empty()) return Fail("--auth-secret-file is for the kvds started here");
    security_args = {"--auth-secret-file", flags.str("auth-secret-file")};
  }
  if (prefill_socket.empty()) {
    char tmpl[] = "/tmp/kvbench-pd-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return Fail("cannot create a temporary directory");
    dir = tmpl;
    // A transport's side-channel sockets in that directory too, which the guard removes: a kvd
    // that does not stop in time is killed and cannot unlink its own.
    const bool own_dir =
        std::any_of(transport_args.begin(), transport_args.end(),
                    [](const std::string& a) { return a.starts_with("socket_dir="); });
    if (auto info = kv::transport::DescribeTransport(transport);
        !own_dir && info.ok() && info->takes("socket_dir")) {
      transport_args.insert(transport_args.end(),
                            {"--transport-opt", "socket_dir=" + dir.string()});
    }
    kv::harness::KvdProcess::Options o;
    o.binary = kv::harness::KvdBesideSelf();
    o.transport = transport;
    // With --trace their trace lines join the engines' on this process's stderr.
    const std::string level = c.trace ? "debug" : "warn";
    o.extra_args = {"--log-level", level};
    o.name = "prefill";
    o.socket_path = (dir / "prefill.sock").string();
    if (cuda) o.extra_args = {"--log-level", level, "--device", "0"};
    o.extra_args.insert(o.extra_args.end(), security_args.begin(), security_args.end());
    o.extra_args.insert(o.extra_args.end(), transport_args.begin(), transport_args.end());
    auto p = kv::harness::KvdProcess::Start(o);
    if (!p.ok()) return Fail("starting " + o.binary + ": " + p.status().ToString());
    prefill_kvd = std::move(*p);
    o.name = "decode";
    o.socket_path = (dir / "decode.sock").string();
    o.extra_args = {"--log-level", level};  // the prefill's, less what is added below again
    if (cuda) o.extra_args = {"--log-level", level, "--device", std::to_string(decode_device)};
    o.extra_args.insert(o.extra_args.end(), security_args.begin(), security_args.end());
    o.extra_args.insert(o.extra_args.end(), transport_args.begin(), transport_args.end());
    auto d = kv::harness::KvdProcess::Start(o);
    if (!d.ok()) return Fail("starting " + o.binary + ": " + d.status().ToString());
    decode_kvd = std::move(*d);
    prefill_socket = prefill_kvd->socket_path();
    decode_socket = decode_kvd->socket_path();
  }

  // Decode rank r connects to the r % n-th of a list (the decode ranks behind several kvds);
  // figures and health checks read the first.
  std::vector<std::string> decode_sockets;
  for (size_t at = 0; at <= decode_socket.size();) {
    const size_t comma = std::min(decode_socket.find(',', at), decode_socket.size());
    if (comma > at) decode_sockets.push_back(decode_socket.substr(at, comma - at));
    at = comma + 1;
  }
  if (decode_sockets.empty()) return Fail("--decode-daemon names no socket");
  decode_socket = decode_sockets.front();

  if (!json) {
    std::printf(
        "kvbench pd: %d requests x %lld tokens, %lld layers, %lld heads x %lld dim, "
        "%s TP%d bs%lld -> %s TP%d bs%lld%s, %s block ids, %s%s\n",
        c.requests, static_cast<long long>(c.tokens), static_cast<long long>(c.layers),
        static_cast<long long>(c.heads), static_cast<long long>(c.head_dim),
        c.prefill_order.c_str(), c.prefill_tp, static_cast<long long>(c.prefill_block_size),
        c.decode_order.c_str(), c.decode_tp, static_cast<long long>(c.decode_block_size),
        c.mla ? " MLA" : "", block_ids.c_str(),
        (mode + (c.prewrite ? ", K/V written before the clock" : "")).c_str(),
        cuda ? (", GPU 0 -> GPU " + std::to_string(decode_device)).c_str() : "");
    std::fflush(stdout);
  }
  // Sampled while the engines are still registered: the daemons' cost of serving them.
  uint64_t prefill_rss = 0, decode_rss = 0;
  uint32_t engines = 0;
  auto progress = [&](int done, int total) {
    if (!json) std::fprintf(stderr, "\r  %d / %d requests", done, total);
    auto p = connector::QueryDaemonStatus(prefill_socket, std::chrono::milliseconds(2000));
    auto d = connector::QueryDaemonStatus(decode_socket, std::chrono::milliseconds(2000));
    if (p.ok() && d.ok()) {
      prefill_rss = std::max(prefill_rss, p->resident_bytes());
      decode_rss = std::max(decode_rss, d->resident_bytes());
      engines = p->engines() + d->engines();
    }
  };
  auto result = connector::RunPd(
      c, [&](const ConnectorOptions& o) { return Connector::Open(prefill_socket, o); },
      [&](const ConnectorOptions& o) {
        return Connector::Open(decode_sockets[o.tp_rank % decode_sockets.size()], o);
      },
      progress, gpu.get());
  if (!json) std::fprintf(stderr, "\n");
  if (!result.ok())
    return Fail(result.status().ToString() + DaemonsGone(prefill_socket, decode_socket));
  if (result->stopped_early) {
    // Issue 19: a dead kvd made every later wave fail (at once or at the lease): say which one
    // and stop, before any figure is printed.
    std::fprintf(stderr,
                 "kvbench pd: stopped after the first failed wave (%d of %d requests run, %d "
                 "failed; --keep-going runs on): %s%s\n",
                 result->requests, c.requests, result->failed, result->first_error.c_str(),
                 DaemonsGone(prefill_socket, decode_socket).c_str());
    return 1;  // our kvds, if any, are stopped by their guards
  }

  auto status = connector::QueryDaemonStatus(prefill_socket, std::chrono::milliseconds(5000));
  transport = status.ok() ? status->transport() : transport;
  const connector::PdResult& r = *result;
  const uint64_t runs = r.runs;
  const double gbps = r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0;
  const double warmup_gbps = r.warmup_seconds > 0 ? r.warmup_bytes / r.warmup_seconds / 1e9 : 0;
  const double runs_per_request = r.requests > 0 ? static_cast<double>(runs) / r.requests : 0;
  const double posts_per_request = r.requests > 0 ? static_cast<double>(r.posts) / r.requests : 0;
  const double p50 = Percentile(r.latency_ms, 0.5), p99 = Percentile(r.latency_ms, 0.99);
  double ceiling = 0;
  const uint64_t run_bytes = r.bytes / std::max<uint64_t>(runs, 1);
  const uint64_t runs_per_batch = runs / (c.requests * c.layers);
  auto stop_kvds = [&] {
    if (prefill_kvd) {
      (void)prefill_kvd->Stop(std::chrono::milliseconds(5000));
      (void)decode_kvd->Stop(std::chrono::milliseconds(5000));
    }
  };
  std::string ceiling_command, gpu_json, reference_command;
  double reference = 0;  // host: kvbench transport of the mean run size
  if (!cuda && !flags.has("no-ceiling") && transport == "ucx" && runs > 0 && r.verified > 0) {
    // A wave moves distinct pages, more than the CPU caches hold: so does the ceiling.
    const uint64_t wave_bytes = std::min<uint64_t>(
        r.bytes / std::max(r.verified, 1) * std::max(c.window, 1), uint64_t{4} << 30);
    reference = MeasureCeiling(transport, run_bytes, runs_per_batch, wave_bytes, opt_strings);
    reference_command = reference > 0 ? CeilingCommand(transport, run_bytes, runs_per_batch,
                                                       wave_bytes, opt_strings)
                                      : "";
  }
  if (!cuda && r.ceiling.gbps > 0) {
    ceiling = r.ceiling.gbps;
    ceiling_command = "one thread memcpy of the last wave's " + std::to_string(r.ceiling.runs) +
                      " runs (" + std::to_string(r.ceiling.bytes) +
                      " B), prefill caches -> decode caches, median of " +
                      std::to_string(r.ceiling.rounds) + " rounds";
  }
  if (cuda) {
    stop_kvds();  // the ceilings get the GPUs to themselves
    GpuFigures f = GpuReport(c, r, *gpu, transport, decode_device, !flags.has("no-ceiling"));
    ceiling = f.ceiling_gbps;
    ceiling_command = f.ceiling_command;
    gpu_json = f.json;
    if (!json) std::printf("%s", f.table.c_str());
  }
  if (json) {
    std::printf(
        "{\"requests\": %d, \"verified\": %d, \"failed\": %d, \"bytes\": %llu, "
        "\"seconds\": %.4f, \"gbps\": %.4f, \"runs_per_request\": %.1f, "
        "\"posts_per_request\": %.2f, \"p50_ms\": %.3f, "
        "\"p99_ms\": %.3f, \"guard_bytes_written\": %llu, \"transport\": \"%s\", "
        "\"prewrite\": %s, \"block_ids\": \"%s\", \"ceiling_gbps\": %.4f, "
        "\"ceiling_command\": \"%s\", \"ratio\": %.4f, \"host_path\": \"%s\", "
        "\"transport_gbps\": %.4f, \"transport_command\": \"%s\", \"warmup_gbps\": %.4f, "
        "\"prefill_kvd_rss\": %llu, \"decode_kvd_rss\": %llu%s}\n",
        r.requests, r.verified, r.failed, static_cast<unsigned long long>(r.bytes), r.seconds, gbps,
        runs_per_request, posts_per_request, p50, p99,
        static_cast<unsigned long long>(r.guard_bytes_written), transport.c_str(),
        c.prewrite ? "true" : "false", block_ids.c_str(), ceiling, ceiling_command.c_str(),
        ceiling > 0 ? gbps / ceiling : 0.0, host_path.c_str(), reference, reference_command.c_str(),
        warmup_gbps, static_cast<unsigned long long>(prefill_rss),
        static_cast<unsigned long long>(decode_rss), gpu_json.c_str());
  } else {
    std::printf("  requests %d   verified %d   failed %d\n", r.requests, r.verified, r.failed);
    std::printf("  bytes    %.1f MiB in %.3f s   %.3f GB/s over %s\n", r.bytes / 1048576.0,
                r.seconds, gbps, transport.c_str());
    if (r.warmup_seconds > 0) {
      std::printf(
          "  warm-up  %.1f MiB in %.3f s   %.3f GB/s   (left out above: the first wave to a peer "
          "connects and opens its memory, as a user's first requests do)\n",
          r.warmup_bytes / 1048576.0, r.warmup_seconds, warmup_gbps);
    }
    std::printf("  runs per request %.1f in %.2f posts   latency p50 %.2f ms   p99 %.2f ms\n",
                runs_per_request, posts_per_request, p50, p99);
    if (ceiling > 0 && !cuda) {
      std::printf("  ceiling  %.3f GB/s   ratio %.2f   (%s)\n", ceiling, gbps / ceiling,
                  ceiling_command.c_str());
      // The ceiling copies bytes only; without --prewrite the clock also holds the engines'
      // writing and checking every byte of K/V, which a reader must not take for kvd's cost.
      if (!c.prewrite) {
        std::printf(
            "           (the engines write and check K/V on this clock, the ceiling does not: "
            "--prewrite times kvd alone)\n");
      }
    }
    if (reference > 0) {
      std::printf(
          "  for reference, not a bound: %.3f GB/s, ratio %.2f, host path %s\n           (%s: "
          "same run size, footprint, memory kind and transport settings as kvd)\n",
          reference, gbps / reference, host_path.c_str(), reference_command.c_str());
    }
    std::printf(
        "  kvd resident memory: prefill %.1f MiB, decode %.1f MiB (%u engines registered)\n",
        prefill_rss / 1048576.0, decode_rss / 1048576.0, engines);
    if (!r.first_error.empty()) std::printf("  first error: %s\n", r.first_error.c_str());
    if (r.guard_bytes_written > 0) {
      std::printf("  %llu bytes written outside the requests' blocks\n",
                  static_cast<unsigned long long>(r.guard_bytes_written));
    }
  }
  stop_kvds();
  return r.failed == 0 && r.verified == r.requests && r.guard_bytes_written == 0 ? 0 : 1;
}

const bool registered = cli::Register(
    {"pd", "the P/D demo: two kvds, engines per TP rank, every byte verified", &PdMain});

}  // namespace
}  // namespace kv::bench
