// kvctl offload — the offload pool: the live figures of a running kvd's pool (--daemon), or, for
// planning, how a cache shape fills a pool and (with --probe) what this machine gives it (huge
// pages, pinning).
#include <cstdio>
#include <string>
#include <vector>

#include "connector/connector.h"
#include "daemon/offload/model_shape.h"
#include "daemon/offload/offload_pool.h"
#include "protocol/kvd.pb.h"
#include "layout/plan.h"
#include "tools/common/cli.h"
#include "tools/kvctl/pool_status.h"

namespace kv {
namespace {

constexpr const char* kHelp = R"(kvctl offload — kvd's CPU offload pool: live figures, or sizing.

With --daemon SOCKET it asks that kvd for its pool: the block shape the first engine fixed,
capacity and slots in use (and in flight), lookup hits and misses with the hit rate, evictions,
bytes stored and loaded, failed copies, and whether the memory sits on huge pages and is pinned.

Without --daemon it sizes a pool for a KV cache shape. A slot of the pool holds one block of
every layer, i.e. one block hash the engine stores. This prints how many blocks (and tokens)
--offload-bytes holds, the slot and page sizes, and how many copies (runs) one block costs in
the chosen layout. With --probe it really allocates the pool as kvd would (huge pages when
reserved, pinned when a CUDA device is present) and prints its statistics, so you can check a
machine before starting kvd.

Examples:
  kvctl --daemon /tmp/kvd.sock offload --json
  kvctl offload --offload-bytes 64G --layers 32 --heads 8 --head-dim 128 --probe

Flags:
)";

int LiveMain(const cli::Flags& flags) {
  auto timeout = flags.integer("timeout-ms", 5000, 1, 600000);
  if (!timeout.ok()) return cli::Fail("kvctl offload", timeout.status());
  auto s = connector::QueryDaemonStatus(flags.str("daemon"), std::chrono::milliseconds(*timeout));
  if (!s.ok()) {
    std::fprintf(stderr, "kvctl offload: %s\n", s.status().ToString().c_str());
    return 1;
  }
  if (flags.has("json")) {
    std::printf("%s\n", tools::PoolStatusJson(s->offload()).c_str());
  } else {
    std::printf("kvd %s\n%s", s->name().c_str(), tools::PoolStatusText(s->offload()).c_str());
  }
  return 0;
}

// The copies one block costs on its own (no neighbour to merge with): the plan of engine block 1
// into slot 0 of a pool of the same order.
Result<uint64_t> RunsPerScatteredBlock(LayoutSpec spec) {
  KV_ASSIGN_OR_RETURN(KvRegion pool, KvRegion::Create(spec));
  spec.blocks = 2;
  KV_ASSIGN_OR_RETURN(KvRegion engine, KvRegion::Create(spec));
  const std::vector<int64_t> src = {1}, dst = {0};
  KV_ASSIGN_OR_RETURN(Plan plan,
                      PlanTransfer(engine, pool, TransferSpec{src, dst, spec.block_size}));
  return static_cast<uint64_t>(plan.runs.size());
}

int OffloadMain(int argc, char** argv) {
  cli::Flags flags({
      {"daemon", "a running kvd's unix socket: print its pool's live figures"},
      {"timeout-ms", "with --daemon: how long to wait for kvd's answer (default 5000)"},
      {"offload-bytes", "pool size, e.g. 64G (default 1G)"},
      {"order", "physical order of the engine's cache (default LBNHC)"},
      {"layers", "layers (default 32)"},
      {"heads", "KV heads on this rank (default 8)"},
      {"head-dim", "head size (default 128)"},
      {"dtype-bytes", "bytes per element (default 2: bf16)"},
      {"block-size", "tokens per block (default 16)"},
      {"probe", "allocate the pool now and print what the machine gave it", true},
      {"json", "print one JSON object", true},
      {"help", "this text", true},
  });
  if (auto exit = flags.ParseOrExit("kvctl offload", kHelp, argc, argv)) return *exit;
  auto fail = [](const Status& s) { return cli::Fail("kvctl offload", s); };
  if (flags.has("daemon")) {
    for (const char* sizing : {"offload-bytes", "order", "layers", "heads", "head-dim",
                               "dtype-bytes", "block-size", "probe"}) {
      if (flags.has(sizing)) {
        return fail(Status::InvalidArgument(
            std::string("--") + sizing + " sizes a pool; with --daemon kvd's own pool is shown"));
      }
    }
    return LiveMain(flags);
  }
  auto bytes = flags.bytes("offload-bytes", 1ull << 30);
  auto layers = flags.integer("layers", 32, 1, 4096);
  auto heads = flags.integer("heads", 8, 1, 4096);
  auto head_dim = flags.integer("head-dim", 128, 1, 65536);
  auto dtype = flags.integer("dtype-bytes", 2, 1, 8);
  auto tokens = flags.integer("block-size", 16, 1, 1 << 20);
  for (const Status& s : {bytes.status(), layers.status(), heads.status(), head_dim.status(),
                          dtype.status(), tokens.status()}) {
    if (!s.ok()) return fail(s);
  }
  const LayoutSpec spec = offload::ModelCacheSpec(flags.str("order", "LBNHC"),
                                                  {*layers, *heads, *head_dim, *dtype, *tokens}, 1);
  auto one = KvRegion::Create(spec);
  if (!one.ok()) return fail(one.status());

  // A block's logical bytes: with an S axis C is K alone and S doubles it.
  const uint64_t slot = static_cast<uint64_t>(spec.layers * spec.heads * spec.block_size *
                                              one->logical_content_bytes());
  const uint64_t slots = *bytes / slot;
  if (slots == 0) {
    return fail(Status::InvalidArgument("--offload-bytes " + std::to_string(*bytes) +
                                        " holds no block of " + std::to_string(slot) + " bytes"));
  }
  auto runs = RunsPerScatteredBlock(spec);
  if (!runs.ok()) return fail(runs.status());
  const uint64_t runs_per_block = *runs;
  const bool json = flags.has("json");
  if (json) {
    std::printf(
        "{\"order\": \"%s\", \"slot_bytes\": %llu, \"page_bytes\": %llu, \"slots\": %llu, "
        "\"tokens\": %llu, \"runs_per_scattered_block\": %llu",
        spec.order.c_str(), static_cast<unsigned long long>(slot),
        static_cast<unsigned long long>(one->page_bytes()), static_cast<unsigned long long>(slots),
        static_cast<unsigned long long>(slots * spec.block_size),
        static_cast<unsigned long long>(runs_per_block));
  } else {
    std::printf("shape      %s\n", offload::DescribeShape(*one).c_str());
    std::printf(
        "slot       %llu bytes = one block of every layer (%s pages of %llu bytes)\n",
        static_cast<unsigned long long>(slot),
        one->blocks_first() ? "1 page" : (std::to_string(spec.layers) + " per-layer").c_str(),
        static_cast<unsigned long long>(one->page_bytes()));
    std::printf("holds      %llu blocks = %llu tokens in %llu bytes\n",
                static_cast<unsigned long long>(slots),
                static_cast<unsigned long long>(slots * spec.block_size),
                static_cast<unsigned long long>(slots * slot));
    std::printf(
        "copies     %llu run(s) per block from scattered engine blocks; runs merge where "
        "blocks and slots are both consecutive\n",
        static_cast<unsigned long long>(runs_per_block));
  }
  if (flags.has("probe")) {
    if (!json)
      std::fprintf(stderr, "kvctl offload: allocating %llu bytes...\n",
                   static_cast<unsigned long long>(slots * slot));
    offload::PoolOptions options;
    options.capacity_bytes = *bytes;
    options.slot_layout = spec;
    auto pool = offload::OffloadPool::Create(options);
    if (!pool.ok()) {
      if (json) std::printf("}\n");
      std::fprintf(stderr, "kvctl offload: %s\n", pool.status().ToString().c_str());
      return 1;
    }
    const offload::PoolStats stats = (*pool)->stats();
    if (json) {
      std::printf(", \"probe\": %s", offload::ToJson(stats).c_str());
    } else {
      std::printf("%s", offload::ToText(stats).c_str());
    }
  }
  if (json) std::printf("}\n");
  return 0;
}

[[maybe_unused]] const bool registered = cli::Register(
    {"offload", "kvd's CPU offload pool: live figures (--daemon SOCKET) or sizing for a shape",
     &OffloadMain});

}  // namespace
}  // namespace kv
