// kvbench offload-kvd — the offload pool as an engine reaches it: through the connector and kvd,
// against the same pool driven directly and a plain memcpy, all in the same run.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "connector/connector.h"
#include "daemon/daemon.h"
#include "tools/common/cli.h"
#include "tools/kvbench/offload_bench.h"

namespace kv::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kHelp =
    R"(kvbench offload-kvd — offload store/load through kvd vs the pool itself.

An engine (the connector, host memory) stores --batch blocks into kvd's offload pool and loads
them back into other blocks, waiting on each op's completion, --iters times after one warm-up.
The same shapes are then timed on an OffloadPool driven directly (what `kvbench offload`
measures) and as one memcpy of the same bytes: the ceiling. The report gives GB/s of each,
kvd / ceiling and kvd / pool — the cost of the protocol, the socket and the completion events —
and the time of a lookup of --batch keys.

By default kvd runs inside this process (embedded mode: the same protocol over a socketpair).
With --daemon SOCKET it uses a running kvd started with --offload-bytes large enough for
2 × --batch blocks of this shape, and the pool's block shape must match (the first engine fixes
it).

With --gpu the engine's cache is cudaMalloc'ed on device 0 and registered with
RegisterKvCaches, so kvd reaches it through CUDA IPC; that needs --daemon (a kvd started with
--transport ipc --device 0 --offload-bytes N): CUDA IPC cannot open memory of its own process.
The pool is then driven directly on the same device memory, and the ceilings are one pinned
cudaMemcpyAsync of the same bytes, device to host for a store and back for a load.

Examples: kvbench offload-kvd --order BLNHC --batch 64 --json
          kvbench offload-kvd --gpu --daemon /tmp/kvd.sock --order LBNHC --batch 512

Flags:
)";

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct Figures {
  uint64_t bytes = 0;
  double store_s = 0, load_s = 0, lookup_s = 0;
  uint64_t store_runs = 0, load_runs = 0;
};

// `gpu_cache`: the engine's cache in device memory (--gpu), else a host cache kvd allocates.
Result<Figures> TimeThroughKvd(const OffloadBenchConfig& config, const LayoutSpec& spec,
                               const std::string& socket, uint64_t key_base, void* gpu_cache) {
  connector::ConnectorOptions options;
  options.instance = "kvbench-offload-" + std::to_string(key_base);
  options.timeout = std::chrono::milliseconds(60000);
  std::shared_ptr<daemon::Daemon> embedded;
  if (socket.empty()) {
    daemon::DaemonOptions d;
    d.name = "kvbench";
    d.listen = "";
    d.transport_name = "local";
    KV_ASSIGN_OR_RETURN(KvRegion one, KvRegion::Create(config.Spec(spec.order, 1)));
    d.offload_bytes = 2 * static_cast<uint64_t>(config.batch) * one.span_bytes();
    KV_ASSIGN_OR_RETURN(embedded, daemon::Daemon::Start(std::move(d)));
  }
  KV_ASSIGN_OR_RETURN(auto engine, embedded ? connector::Connector::OpenEmbedded(embedded, options)
                                            : connector::Connector::Open(socket, options));
  if (gpu_cache != nullptr) {
    const connector::KvCacheDesc cache{spec, MemoryLocation::Cuda(0), gpu_cache};
    KV_RETURN_IF_ERROR(engine->RegisterKvCaches({&cache, 1}).status());
  } else {
    KV_ASSIGN_OR_RETURN(auto caches, engine->RegisterKvCaches(connector::HostCaches({&spec, 1})));
    std::memset(caches[0].base, 1, caches[0].bytes);
  }

  Figures f;
  std::vector<double> stores, loads, lookups;
  for (int it = 0; it <= config.iters; ++it) {  // iteration 0 warms up
    std::vector<offload::BlockKey> keys;
    for (int64_t i = 0; i < config.batch; ++i) {
      keys.push_back(offload::BlockKey::FromUint64(key_base + (uint64_t{1} << 32) * it + i));
    }
    auto sources = PickBlocks(config.batch, spec.blocks, config.scattered, 2 * it + 1);
    auto targets = PickBlocks(config.batch, spec.blocks, config.scattered, 2 * it + 2);

    auto start = Clock::now();
    KV_ASSIGN_OR_RETURN(auto stored, engine->OffloadStore(keys, sources));
    KV_RETURN_IF_ERROR(stored.op.Wait().WithContext("store"));
    const double store_s = Seconds(start);

    start = Clock::now();
    KV_ASSIGN_OR_RETURN(size_t hits, engine->OffloadLookup(keys));
    const double lookup_s = Seconds(start);
    if (hits != keys.size()) {
      return Status::Internal("lookup found " + std::to_string(hits) + " of " +
                              std::to_string(keys.size()) + " keys just stored");
    }

    start = Clock::now();
    KV_ASSIGN_OR_RETURN(auto loaded, engine->OffloadLoad(keys, targets, config.per_layer));
    if (config.per_layer) {
      for (int64_t l = 0; l < spec.layers; ++l) {
        KV_RETURN_IF_ERROR(loaded.op.WaitLayer(static_cast<int>(l)).WithContext("load"));
      }
    }
    KV_RETURN_IF_ERROR(loaded.op.Wait().WithContext("load"));
    const double load_s = Seconds(start);
    if (it == 0) continue;
    stores.push_back(store_s);
    loads.push_back(load_s);
    lookups.push_back(lookup_s);
    f.bytes = stored.bytes;
    f.store_runs = stored.runs;
    f.load_runs = loaded.runs;
  }
  f.store_s = Median(stores);
  f.load_s = Median(loads);
  f.lookup_s = Median(lookups);
  return f;
}

double TimeMemcpy(uint64_t bytes, int iters) {
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes);
  std::vector<double> t;
  for (int it = 0; it <= iters; ++it) {
    auto start = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    if (it > 0) t.push_back(Seconds(start));
  }
  return Median(t);
}

int OffloadKvdMain(int argc, char** argv) {
  cli::Flags flags({
      {"daemon", "a running kvd's unix socket (default: an embedded kvd)"},
      {"order", "physical order of the engine's cache (default BLNHC)"},
      {"layers", "layers (default 32)"},
      {"heads", "KV heads (default 8)"},
      {"head-dim", "head size (default 128)"},
      {"block-size", "tokens per block (default 16)"},
      {"batch", "blocks per store and load (default 32)"},
      {"engine-blocks", "blocks in the engine's cache (default 4 × batch)"},
      {"iters", "timed iterations after one warm-up (default 5)"},
      {"consecutive", "engine block ids 0..batch-1 instead of random ones", true},
      {"per-layer", "loads wait layer by layer, as a decode step would", true},
      {"gpu", "the engine's cache in GPU memory (needs --daemon: see above)", true},
      {"json", "print one JSON object", true},
      {"help", "this text", true},
  });
  if (auto exit = flags.ParseOrExit("kvbench offload-kvd", kHelp, argc, argv)) return *exit;
  auto fail = [](const Status& s) { return cli::Fail("kvbench offload-kvd", s); };
  OffloadBenchConfig config;
  auto layers = flags.integer("layers", 32, 1, 1024);
  auto heads = flags.integer("heads", 8, 1, 1024);
  auto head_dim = flags.integer("head-dim", 128, 1, 4096);
  auto block_size = flags.integer("block-size", 16, 1, 4096);
  auto batch = flags.integer("batch", 32, 1, 16384);
  auto iters = flags.integer("iters", 5, 1, 1000);
  for (const Status& s : {layers.status(), heads.status(), head_dim.status(), block_size.status(),
                          batch.status(), iters.status()}) {
    if (!s.ok()) return fail(s);
  }
  config.layers = *layers;
  config.heads = *heads;
  config.head_dim = *head_dim;
  config.block_size = *block_size;
  config.batch = *batch;
  config.iters = static_cast<int>(*iters);
  auto engine_blocks = flags.integer("engine-blocks", 4 * config.batch, config.batch, 1 << 24);
  if (!engine_blocks.ok()) return fail(engine_blocks.status());
  config.engine_blocks = *engine_blocks;
  config.scattered = !flags.has("consecutive");
  config.per_layer = flags.has("per-layer");
  const std::string order = flags.str("order", "BLNHC");
  const LayoutSpec spec = config.Spec(order, config.engine_blocks);
  const bool gpu = flags.has("gpu");
  const GpuMemoryOps* ops = GpuMemoryOpsSlot();
  if (gpu && ops == nullptr) return fail(Status::Unsupported("--gpu: this build has no CUDA"));
  if (gpu && !flags.has("daemon")) {
    return fail(Status::InvalidArgument(
        "--gpu needs --daemon: CUDA IPC cannot open memory of its own process"));
  }
  auto engine = KvRegion::Create(spec);
  if (!engine.ok()) return fail(engine.status());
  // The engine's cache: device memory under --gpu (also what the pool is timed on), else host
  // memory for the pool (kvd allocates the engine's own host cache).
  std::unique_ptr<void, void (*)(void*)> device_cache(nullptr, [](void*) {});
  std::vector<std::byte> host_cache;
  std::byte* base = nullptr;
  if (gpu) {
    auto mem = ops->alloc(engine->span_bytes());
    if (!mem.ok()) return fail(mem.status());
    device_cache = std::unique_ptr<void, void (*)(void*)>(*mem, ops->free);
    base = static_cast<std::byte*>(*mem);
  } else {
    host_cache.assign(engine->span_bytes(), std::byte{1});
    base = host_cache.data();
  }

  const uint64_t key_base = std::random_device{}() | (uint64_t{1} << 63);
  std::fprintf(stderr, "offload-kvd: %s: store/lookup/load of %lld blocks through kvd\n",
               order.c_str(), static_cast<long long>(config.batch));
  auto kvd = TimeThroughKvd(config, spec, flags.str("daemon"), key_base, gpu ? base : nullptr);
  if (!kvd.ok()) return fail(kvd.status());
  std::fprintf(stderr, "offload-kvd: %s: the same on the pool directly\n", order.c_str());
  auto pool =
      TimePool(config, *engine, base, gpu ? MemoryLocation::Cuda(0) : MemoryLocation::Host());
  if (!pool.ok()) return fail(pool.status());
  std::fprintf(stderr, "offload-kvd: ceiling: one %s of %.1f MiB\n",
               gpu ? "pinned cudaMemcpyAsync" : "memcpy", kvd->bytes / 1048576.0);
  double store_ceiling_s = 0, load_ceiling_s = 0;
  if (gpu) {
    auto to_host = ops->pinned_copy_seconds(kvd->bytes, true, config.iters);
    auto to_device = ops->pinned_copy_seconds(kvd->bytes, false, config.iters);
    if (!to_host.ok()) return fail(to_host.status());
    if (!to_device.ok()) return fail(to_device.status());
    store_ceiling_s = *to_host;
    load_ceiling_s = *to_device;
  } else {
    store_ceiling_s = load_ceiling_s = TimeMemcpy(kvd->bytes, config.iters);
  }

  const double ceiling = GbPerSecond(kvd->bytes, store_ceiling_s);
  struct Row {
    const char* op;
    double kvd, pool, ceiling;
    uint64_t runs;
  } rows[2] = {
      {"store", GbPerSecond(kvd->bytes, kvd->store_s),
       GbPerSecond(pool->bytes, pool->store_seconds), GbPerSecond(kvd->bytes, store_ceiling_s),
       kvd->store_runs},
      {"load", GbPerSecond(kvd->bytes, kvd->load_s), GbPerSecond(pool->bytes, pool->load_seconds),
       GbPerSecond(kvd->bytes, load_ceiling_s), kvd->load_runs}};
  if (flags.has("json")) {
    std::printf(
        "{\"order\": \"%s\", \"gpu\": %s, \"bytes\": %llu, \"blocks\": %lld, "
        "\"scattered\": %s, \"per_layer\": %s, \"ceiling_gbps\": %.3f, \"lookup_us\": %.1f, "
        "\"ops\": [",
        order.c_str(), gpu ? "true" : "false", static_cast<unsigned long long>(kvd->bytes),
        static_cast<long long>(config.batch), config.scattered ? "true" : "false",
        config.per_layer ? "true" : "false", ceiling, kvd->lookup_s * 1e6);
    for (int i = 0; i < 2; ++i) {
      std::printf(
          "%s{\"op\": \"%s\", \"runs\": %llu, \"kvd_gbps\": %.3f, \"pool_gbps\": %.3f, "
          "\"ceiling_gbps\": %.3f, \"kvd_over_ceiling\": %.3f, \"kvd_over_pool\": %.3f}",
          i ? ", " : "", rows[i].op, static_cast<unsigned long long>(rows[i].runs), rows[i].kvd,
          rows[i].pool, rows[i].ceiling, rows[i].ceiling > 0 ? rows[i].kvd / rows[i].ceiling : 0,
          rows[i].pool > 0 ? rows[i].kvd / rows[i].pool : 0);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf(
      "kvbench offload-kvd — %s%s, %lld blocks (%.1f MiB) per op, %s block ids, loads %s, "
      "median of %d\n",
      order.c_str(), gpu ? " in GPU memory" : "", static_cast<long long>(config.batch),
      kvd->bytes / 1048576.0, config.scattered ? "scattered" : "consecutive",
      config.per_layer ? "per layer" : "whole", config.iters);
  std::printf("ceiling: one %s of the same bytes; lookup of %lld keys: %.1f us\n",
              gpu ? "pinned cudaMemcpyAsync" : "memcpy", static_cast<long long>(config.batch),
              kvd->lookup_s * 1e6);
  std::printf("%-6s %7s %10s %10s %13s %13s %10s\n", "op", "runs", "kvd GB/s", "pool GB/s",
              "ceiling GB/s", "kvd/ceiling", "kvd/pool");
  for (const Row& r : rows) {
    std::printf("%-6s %7llu %10.2f %10.2f %13.2f %13.2f %10.2f\n", r.op,
                static_cast<unsigned long long>(r.runs), r.kvd, r.pool, r.ceiling,
                r.ceiling > 0 ? r.kvd / r.ceiling : 0, r.pool > 0 ? r.kvd / r.pool : 0);
  }
  return 0;
}

[[maybe_unused]] const bool registered =
    cli::Register({"offload-kvd", "offload store/load through kvd vs the pool directly vs memcpy",
                   &OffloadKvdMain});

}  // namespace
}  // namespace kv::bench
