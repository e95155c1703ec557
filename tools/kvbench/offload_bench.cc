// kvbench offload — see offload_bench.h. This file: flags, the host path, the report.
#include "tools/kvbench/offload_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <numeric>
#include <random>

#include "daemon/offload/model_shape.h"
#include "daemon/offload/offload_pool.h"
#include "tools/common/cli.h"

namespace kv::bench {

using Clock = std::chrono::steady_clock;

LayoutSpec OffloadBenchConfig::Spec(const std::string& order, int64_t blocks) const {
  return offload::ModelCacheSpec(order, {layers, heads, head_dim, dtype_bytes, block_size}, blocks);
}

GpuOffloadBench& GpuOffloadBenchSlot() {
  static GpuOffloadBench bench = nullptr;
  return bench;
}

const GpuMemoryOps*& GpuMemoryOpsSlot() {
  static const GpuMemoryOps* ops = nullptr;
  return ops;
}

double GbPerSecond(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int64_t> PickBlocks(int64_t count, int64_t total, bool scattered, uint32_t seed) {
  std::vector<int64_t> all(static_cast<size_t>(total));
  std::iota(all.begin(), all.end(), 0);
  if (scattered) std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize(static_cast<size_t>(count));
  return all;
}

void Progress(const std::string& line) {
  std::fprintf(stderr, "offload: %s\n", line.c_str());
}

namespace {

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

Status WaitFor(std::future<Status> done) {
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    return Status::Timeout("offload copy did not finish within 60 s");
  }
  return done.get();
}

}  // namespace

Result<PoolTiming> TimePool(const OffloadBenchConfig& config, const KvRegion& engine,
                            std::byte* base, MemoryLocation where) {
  offload::PoolOptions options;
  options.slot_layout = engine.spec();
  const uint64_t block_bytes =
      static_cast<uint64_t>(engine.size(Axis::kL) * engine.size(Axis::kH) * engine.size(Axis::kN)) *
      engine.logical_content_bytes();
  options.capacity_bytes = 2 * config.batch * block_bytes;
  KV_ASSIGN_OR_RETURN(options.gpu.how, offload::ParseDeviceCopy(config.device_copy));
  options.gpu.dma_slice_runs = config.dma_slice_runs;
  KV_ASSIGN_OR_RETURN(auto pool, offload::OffloadPool::Create(options));

  PoolTiming timing;
  std::vector<double> stores, loads;
  for (int it = 0; it <= config.iters; ++it) {  // iteration 0 warms up
    std::vector<offload::BlockKey> keys;
    for (int64_t i = 0; i < config.batch; ++i) {
      keys.push_back(offload::BlockKey::FromUint64((uint64_t{1} << 40) * (it + 1) + i));
    }
    auto sources = PickBlocks(config.batch, engine.size(Axis::kB), config.scattered, 2 * it + 1);
    auto targets = PickBlocks(config.batch, engine.size(Axis::kB), config.scattered, 2 * it + 2);

    std::promise<Status> stored;
    auto start = Clock::now();
    auto ticket = pool->Store({&engine, base, keys, sources, nullptr, where},
                              [&](Status s) { stored.set_value(std::move(s)); });
    if (!ticket.ok()) return ticket.status().WithContext("store");
    KV_RETURN_IF_ERROR(WaitFor(stored.get_future()));
    const double store_s = Seconds(start);

    std::promise<Status> loaded;
    start = Clock::now();
    offload::LayerDone on_layer;
    if (config.per_layer) on_layer = [](int64_t) {};
    auto load = pool->Load({&engine, base, keys, targets, nullptr, where}, on_layer,
                           [&](Status s) { loaded.set_value(std::move(s)); });
    if (!load.ok()) return load.status().WithContext("load");
    KV_RETURN_IF_ERROR(WaitFor(loaded.get_future()));
    const double load_s = Seconds(start);

    if (it == 0) continue;
    stores.push_back(store_s);
    loads.push_back(load_s);
    timing.bytes = ticket->bytes;
    timing.store_runs = ticket->runs;
    timing.load_runs = load->runs;
  }
  timing.store_seconds = Median(stores);
  timing.load_seconds = Median(loads);
  return timing;
}

namespace {

// The host path: engine pages in ordinary memory, references by memcpy.
Status RunHost(const OffloadBenchConfig& config, OffloadReport* report) {
  report->machine = "cpu (no CUDA device)";
  report->path = "memcpy on kvd's copy thread";
  report->ceiling = "one memcpy";
  for (const auto& order : config.orders) {
    KV_ASSIGN_OR_RETURN(KvRegion engine,
                        KvRegion::Create(config.Spec(order, config.engine_blocks)));
    std::vector<std::byte> cache(engine.span_bytes(), std::byte{1});
    Progress(order + ": pool store/load of " + std::to_string(config.batch) + " blocks");
    KV_ASSIGN_OR_RETURN(PoolTiming pool,
                        TimePool(config, engine, cache.data(), MemoryLocation::Host()));

    Progress(order + ": references (one memcpy; one memcpy per page)");
    std::vector<std::byte> flat(pool.bytes);
    const int64_t page_layers = engine.blocks_first() ? 1 : engine.size(Axis::kL);
    const uint64_t page = engine.page_bytes();
    auto blocks = PickBlocks(config.batch, config.engine_blocks, config.scattered, 1);
    std::vector<double> one[2], per_page[2];
    for (int it = 0; it <= config.iters; ++it) {
      for (int dir = 0; dir < 2; ++dir) {  // 0: engine -> pool, 1: pool -> engine
        auto start = Clock::now();
        if (dir == 0) {
          std::memcpy(flat.data(), cache.data(), pool.bytes);
        } else {
          std::memcpy(cache.data(), flat.data(), pool.bytes);
        }
        const double one_s = Seconds(start);
        start = Clock::now();
        uint64_t at = 0;
        for (int64_t b : blocks) {
          for (int64_t l = 0; l < page_layers; ++l, at += page) {
            std::byte* p = cache.data() + engine.page_offset(l, b);
            if (dir == 0) {
              std::memcpy(flat.data() + at, p, page);
            } else {
              std::memcpy(p, flat.data() + at, page);
            }
          }
        }
        if (it == 0) continue;
        one[dir].push_back(one_s);
        per_page[dir].push_back(Seconds(start));
      }
    }
    const uint64_t pages = static_cast<uint64_t>(config.batch * page_layers);
    report->rows.push_back({order, "store", pool.bytes, pages, pool.store_runs,
                            GbPerSecond(pool.bytes, pool.store_seconds),
                            GbPerSecond(pool.bytes, Median(one[0])),
                            GbPerSecond(pool.bytes, Median(per_page[0]))});
    report->rows.push_back({order, "load", pool.bytes, pages, pool.load_runs,
                            GbPerSecond(pool.bytes, pool.load_seconds),
                            GbPerSecond(pool.bytes, Median(one[1])),
                            GbPerSecond(pool.bytes, Median(per_page[1]))});
  }
  return Status::Ok();
}

void PrintText(const OffloadBenchConfig& config, const OffloadReport& r) {
  std::printf("kvbench offload — %s; copies by %s\n", r.machine.c_str(), r.path.c_str());
  std::printf(
      "cache: %lld layers × %lld KV heads × head_dim %lld × %lld B, %lld tokens/block; "
      "%lld blocks per op, %s block ids, loads %s, median of %d\n",
      static_cast<long long>(config.layers), static_cast<long long>(config.heads),
      static_cast<long long>(config.head_dim), static_cast<long long>(config.dtype_bytes),
      static_cast<long long>(config.block_size), static_cast<long long>(config.batch),
      config.scattered ? "scattered" : "consecutive", config.per_layer ? "per layer" : "whole",
      config.iters);
  std::printf("%-6s %-5s %10s %7s %7s %10s %12s %7s %11s %8s\n", "layout", "op", "MiB", "pages",
              "runs", "pool GB/s", "ceiling GB/s", "ratio", "per-page GB/s", "speed-up");
  for (const auto& row : r.rows) {
    std::printf("%-6s %-5s %10.1f %7llu %7llu %10.2f %12.2f %7.2f %13.2f %8.2f\n",
                row.order.c_str(), row.op.c_str(), row.bytes / 1048576.0,
                static_cast<unsigned long long>(row.pages),
                static_cast<unsigned long long>(row.runs), row.pool_gbps, row.ceiling_gbps,
                row.ceiling_gbps > 0 ? row.pool_gbps / row.ceiling_gbps : 0, row.per_page_gbps,
                row.per_page_gbps > 0 ? row.pool_gbps / row.per_page_gbps : 0);
  }
  std::printf(
      "ceiling: %s of the same bytes between contiguous buffers; per-page: one copy "
      "call per page (vLLM's swap_blocks)\n",
      r.ceiling.c_str());
  for (const auto& b : r.busy) {
    std::printf(
        "busy GPU, %s: 1000 compute-bound kernels take %.2f ms alone, %.2f ms beside stores "
        "(%.1f%% "
        "slower); store %.2f GB/s meanwhile\n",
        b.order.c_str(), b.alone_ms, b.beside_store_ms,
        b.alone_ms > 0 ? 100.0 * (b.beside_store_ms / b.alone_ms - 1) : 0, b.store_gbps);
  }
}

void PrintJson(const OffloadBenchConfig& config, const OffloadReport& r) {
  std::printf(
      "{\"machine\": \"%s\", \"path\": \"%s\", \"layers\": %lld, \"heads\": %lld, "
      "\"head_dim\": %lld, \"dtype_bytes\": %lld, \"block_size\": %lld, \"batch\": %lld, "
      "\"iters\": %d, \"scattered\": %s, \"per_layer\": %s, \"device_copy\": \"%s\", "
      "\"dma_slice_runs\": %d, \"rows\": [",
      r.machine.c_str(), r.path.c_str(), static_cast<long long>(config.layers),
      static_cast<long long>(config.heads), static_cast<long long>(config.head_dim),
      static_cast<long long>(config.dtype_bytes), static_cast<long long>(config.block_size),
      static_cast<long long>(config.batch), config.iters, config.scattered ? "true" : "false",
      config.per_layer ? "true" : "false", config.device_copy.c_str(), config.dma_slice_runs);
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const auto& row = r.rows[i];
    std::printf(
        "%s{\"layout\": \"%s\", \"op\": \"%s\", \"bytes\": %llu, \"pages\": %llu, "
        "\"runs\": %llu, \"pool_gbps\": %.3f, \"ceiling_gbps\": %.3f, "
        "\"per_page_gbps\": %.3f}",
        i ? ", " : "", row.order.c_str(), row.op.c_str(),
        static_cast<unsigned long long>(row.bytes), static_cast<unsigned long long>(row.pages),
        static_cast<unsigned long long>(row.runs), row.pool_gbps, row.ceiling_gbps,
        row.per_page_gbps);
  }
  std::printf("], \"busy\": [");
  for (size_t i = 0; i < r.busy.size(); ++i) {
    const auto& b = r.busy[i];
    std::printf(
        "%s{\"layout\": \"%s\", \"alone_ms\": %.3f, \"beside_store_ms\": %.3f, "
        "\"store_gbps\": %.3f}",
        i ? ", " : "", b.order.c_str(), b.alone_ms, b.beside_store_ms, b.store_gbps);
  }
  std::printf("]}\n");
}

constexpr const char* kHelp =
    R"(kvbench offload — how fast the offload pool moves KV blocks between an
engine's cache and kvd's pinned host pool, next to the ceilings measured in the same run.

For each layout it stores --batch blocks (fresh keys, engine blocks drawn at random as vLLM
allocates them) into a pool of 2·batch slots, then loads them back into other blocks, and times:
  pool      OffloadPool::Store / Load, from the call to the completion;
  ceiling   one copy of the same bytes between contiguous buffers (on a GPU: one pinned
            cudaMemcpyAsync; the goal is pool ≥ 0.9 × ceiling);
  per-page  one copy call per page, as vLLM's older swap_blocks did (the speed-up column).
LBNHC pages are one layer of one block (16 tokens: 64 KiB for Llama-3-8B); BLNHC pages are a
whole block of every layer (2 MiB). On a GPU it also runs stores beside a busy compute stream
(1000 short compute-bound kernels, every SM full) and reports how much they slow down. Without
a CUDA device it runs the host path and says so. Defaults: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, bf16), 16 tokens per block.

Flags:
)";

int OffloadMain(int argc, char** argv) {
  cli::Flags flags({
      {"layouts", "comma-separated physical orders to run (default LBNHC,BLNHC)"},
      {"layers", "layers (default 32)"},
      {"heads", "KV heads on this rank (default 8)"},
      {"head-dim", "head size (default 128)"},
      {"dtype-bytes", "bytes per element (default 2: bf16)"},
      {"block-size", "tokens per block (default 16)"},
      {"blocks", "blocks in the engine's cache (default 4096 on a GPU, 512 on the host)"},
      {"batch", "blocks per store and per load (default 512 on a GPU, 64 on the host)"},
      {"iters", "timed iterations; the median is reported (default 5)"},
      {"consecutive", "use engine blocks 0..batch-1 instead of random ones", true},
      {"per-layer", "loads wait per layer (one phase per layer for layer-first layouts)", true},
      {"copy-path", "GPU copies: auto (the pool's choice), kernel or copy-engine"},
      {"dma-slice",
       "GPU copy-engine copies go to the driver in batches of this many runs "
       "(default 512)"},
      {"no-busy", "skip the busy-GPU measurement", true},
      {"host", "run the host path even when a GPU is present", true},
      {"json", "print one JSON object instead of the table", true},
      {"help", "this text", true},
  });
  if (auto exit = flags.ParseOrExit("kvbench offload", kHelp, argc, argv)) return *exit;
  OffloadBenchConfig config;
  const bool want_gpu = GpuOffloadBenchSlot() != nullptr && !flags.has("host");
  auto get = [&](const char* name, int64_t fallback, int64_t max) -> Result<int64_t> {
    return flags.integer(name, fallback, 1, max);
  };
  Status bad;
  auto take = [&](Result<int64_t> r, int64_t* into) {
    if (!r.ok() && bad.ok()) bad = r.status();
    if (r.ok()) *into = *r;
  };
  take(get("layers", 32, 1024), &config.layers);
  take(get("heads", 8, 1024), &config.heads);
  take(get("head-dim", 128, 4096), &config.head_dim);
  take(get("dtype-bytes", 2, 8), &config.dtype_bytes);
  take(get("block-size", 16, 4096), &config.block_size);
  take(get("blocks", want_gpu ? 4096 : 512, 1 << 24), &config.engine_blocks);
  take(get("batch", want_gpu ? 512 : 64, 1 << 20), &config.batch);
  int64_t iters = 5, slice = 512;
  take(get("iters", 5, 1000), &iters);
  take(get("dma-slice", 512, 1 << 20), &slice);
  config.iters = static_cast<int>(iters);
  config.dma_slice_runs = static_cast<int>(slice);
  if (bad.ok() && config.batch > config.engine_blocks) {
    bad = Status::InvalidArgument("--batch " + std::to_string(config.batch) + " exceeds --blocks " +
                                  std::to_string(config.engine_blocks));
  }
  std::string layouts = flags.str("layouts", "LBNHC,BLNHC");
  for (size_t pos = 0; pos <= layouts.size();) {
    size_t comma = std::min(layouts.find(',', pos), layouts.size());
    std::string order = layouts.substr(pos, comma - pos);
    auto check = KvRegion::Create(config.Spec(order, 1));
    if (!check.ok() && bad.ok()) bad = check.status().WithContext("--layouts " + order);
    config.orders.push_back(order);
    pos = comma + 1;
  }
  if (!bad.ok()) {
    std::fprintf(stderr, "kvbench offload: %s (see --help)\n", bad.ToString().c_str());
    return 2;
  }
  config.scattered = !flags.has("consecutive");
  config.per_layer = flags.has("per-layer");
  config.device_copy = flags.str("copy-path", "auto");
  if (auto how = offload::ParseDeviceCopy(config.device_copy); !how.ok()) {
    std::fprintf(stderr, "kvbench offload: --copy-path: %s (see --help)\n",
                 how.status().ToString().c_str());
    return 2;
  }
  config.busy = !flags.has("no-busy");

  OffloadReport report;
  Status status = want_gpu ? GpuOffloadBenchSlot()(config, &report) : Status::Unavailable("");
  if (status.code() == Code::kUnavailable) {
    if (want_gpu) Progress("no usable CUDA device (" + status.message() + "): host path");
    report = {};
    status = RunHost(config, &report);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "kvbench offload: %s\n", status.ToString().c_str());
    return 1;
  }
  if (flags.has("json")) {
    PrintJson(config, report);
  } else {
    PrintText(config, report);
  }
  return 0;
}

const bool registered = cli::Register(
    {"offload", "offload pool store/load vs one pinned memcpy and per-page copies", &OffloadMain});

}  // namespace
}  // namespace kv::bench
