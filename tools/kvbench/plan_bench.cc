// kvbench plan: how long PlanTransfer takes for a long request, per request and per run.
//
// The ceiling is the least any planner must spend: writing the same run table (24 bytes a run)
// into a fresh vector. Each case measures it in the same process and reports the ratio.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/plan_copy.h"
#include "layout/plan.h"
#include "tools/common/cli.h"

namespace kv::bench {
namespace {

constexpr int64_t kTokens = 32 * 1024;
constexpr int64_t kLayers = 80;
constexpr int64_t kHeads = 8;
constexpr int64_t kContent = 512;  // K and V of 128 bf16 each
constexpr int64_t kBlocks = 4096;

struct Case {
  std::string name;
  std::string src_order, dst_order;
  int64_t src_block_size = 16, dst_block_size = 16;
  bool scattered = true;  // block ids drawn at random, as a long-running engine's are
  int64_t layer = -1;     // plan one layer only (the per-layer push), or every layer
  int dst_tp = 1;         // the destination is rank 0 of this many (the source has TP 1)
};

KvRegion Region(const std::string& order, int64_t block_size, int tp = 1) {
  LayoutSpec s;
  s.order = order;
  s.layers = kLayers;
  s.blocks = kBlocks;
  s.heads = kHeads / tp;
  s.total_heads = kHeads;
  s.tp_size = tp;
  s.block_size = block_size;
  s.content_bytes = kContent;
  return KvRegion::Create(s).value();
}

std::vector<int64_t> Blocks(int64_t count, bool scattered, uint32_t seed) {
  std::vector<int64_t> ids(kBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  if (scattered) std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  ids.resize(count);
  return ids;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Seconds to write `runs` into a fresh vector, the least cost of producing the plan.
double CeilingSeconds(const std::vector<Run>& runs) {
  int reps = 0;
  auto start = std::chrono::steady_clock::now();
  do {
    std::vector<Run> copy(runs.begin(), runs.end());
    benchmark::DoNotOptimize(copy.data());
    ++reps;
  } while (SecondsSince(start) < 0.05);
  return SecondsSince(start) / reps;
}

void PlanCase(benchmark::State& state, const Case& c) {
  const KvRegion src = Region(c.src_order, c.src_block_size);
  const KvRegion dst = Region(c.dst_order, c.dst_block_size, c.dst_tp);
  const auto src_blocks = Blocks(kTokens / c.src_block_size, c.scattered, 1);
  const auto dst_blocks = Blocks(kTokens / c.dst_block_size, c.scattered, 2);
  TransferSpec spec{src_blocks, dst_blocks, kTokens};
  if (c.layer >= 0) {
    spec.layer_begin = c.layer;
    spec.layer_end = c.layer + 1;
  }
  auto first = PlanTransfer(src, dst, spec);
  if (!first.ok()) {
    state.SkipWithError(first.status().ToString().c_str());
    return;
  }
  const double runs = static_cast<double>(first->runs.size());
  const double ceiling = CeilingSeconds(first->runs);

  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    auto plan = PlanTransfer(src, dst, spec);
    benchmark::DoNotOptimize(plan);
  }
  const double per_request = SecondsSince(start) / static_cast<double>(state.iterations());

  state.counters["runs"] = runs;
  state.counters["MiB"] = static_cast<double>(first->bytes) / (1 << 20);
  state.counters["ns_per_run"] = per_request * 1e9 / runs;
  state.counters["ceiling_us"] = ceiling * 1e6;
  state.counters["x_ceiling"] = per_request / ceiling;
}

// kvd's io-thread work per request when one prefill rank feeds `dst_tp` decode ranks, in the
// shape of `kvbench pd --tokens 4096 --layers 32 --block-ids random --window 8`: a wave of
// kWave requests saves its layers back to back; every (layer, decode rank) gathers the wave's
// runs in one batch (daemon/send_queue.cc), whose vectors are reused from wave to wave; a post
// checks the runs (transport::CheckBatch) and copies them (as the ucx backend does).
// kPlanEachLayer plans every layer with PlanTransfer, as kvd did before LayerPlan; kLayerPlan
// plans layer 0 once per request and decode rank and shifts it to the other layers. The two
// kIpc modes do what the cuda_ipc backend does with the batch instead: check it, then encode
// the copy kernel's table (EncodePlanCopyPrefix), from runs, or from run groups (LayerPlan with
// groups on, EncodePlanCopyGroupPrefix).
enum class PathMode { kPlanEachLayer, kLayerPlan, kIpcRuns, kIpcGroups };
constexpr int kWave = 8;
constexpr int64_t kPathTokens = 4096;
constexpr int64_t kPathLayers = 32;

KvRegion PathRegion(int tp, int rank, const char* order = "LBNHC") {
  LayoutSpec s;
  s.order = order;
  s.layers = kPathLayers;
  s.blocks = 2 * kWave * kPathTokens / 16;
  s.heads = kHeads / tp;
  s.total_heads = kHeads;
  s.tp_size = tp;
  s.tp_rank = rank;
  s.block_size = 16;
  s.content_bytes = kContent;
  return KvRegion::Create(s).value();
}

void RequestPathCase(benchmark::State& state, int dst_tp, PathMode mode) {
  const KvRegion src = PathRegion(1, 0);
  std::vector<KvRegion> dst;
  for (int r = 0; r < dst_tp; ++r) dst.push_back(PathRegion(dst_tp, r));
  const int64_t blocks = kPathTokens / 16;
  std::vector<std::vector<int64_t>> src_ids, dst_ids;
  const auto src_all = Blocks(kWave * blocks, true, 1), dst_all = Blocks(kWave * blocks, true, 2);
  for (int q = 0; q < kWave; ++q) {
    src_ids.emplace_back(src_all.begin() + q * blocks, src_all.begin() + (q + 1) * blocks);
    dst_ids.emplace_back(dst_all.begin() + q * blocks, dst_all.begin() + (q + 1) * blocks);
  }
  const bool per_layer = mode == PathMode::kPlanEachLayer;
  const bool ipc = mode == PathMode::kIpcRuns || mode == PathMode::kIpcGroups;
  std::vector<Plan> groups(kPathLayers * dst_tp);
  std::vector<unsigned char> table;  // the copier's pinned staging buffer, reused
  uint64_t runs = 0, entries = 0;
  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    std::vector<LayerPlan> layer_plans;
    for (int q = 0; q < kWave && !per_layer; ++q) {
      for (int r = 0; r < dst_tp; ++r) {
        layer_plans.push_back(LayerPlan::Create(src, dst[r], {src_ids[q], dst_ids[q], kPathTokens},
                                                mode == PathMode::kIpcGroups)
                                  .value());
      }
    }
    for (int64_t l = 0; l < kPathLayers; ++l) {
      for (int q = 0; q < kWave; ++q) {
        for (int r = 0; r < dst_tp; ++r) {
          Plan& group = groups[l * dst_tp + r];
          const TransferSpec spec{src_ids[q], dst_ids[q], kPathTokens, l, l + 1};
          const Status s = per_layer ? PlanTransfer(src, dst[r], spec, &group)
                                     : layer_plans[q * dst_tp + r].AppendLayer(l, &group);
          if (!s.ok()) state.SkipWithError(s.ToString().c_str());
        }
      }
    }
    runs = entries = 0;
    for (int64_t g = 0; g < kPathLayers * dst_tp; ++g) {
      Plan& group = groups[g];
      const uint64_t dst_bytes = dst[g % dst_tp].span_bytes();
      Status s = ValidateRuns(group.runs, src.span_bytes(), dst_bytes);
      if (s.ok()) s = ValidateGroups(group.groups, src.span_bytes(), dst_bytes);
      if (!s.ok()) state.SkipWithError(s.ToString().c_str());
      if (ipc) {
        // Both tables go through the same buffer, one after the other.
        const uint64_t run_chunks = kernels::PlanCopyChunks(group.runs);
        uint64_t group_chunks = 0;
        for (const RunGroup& rg : group.groups) group_chunks += kernels::PlanCopyGroupChunks(rg);
        const uint64_t bytes = std::max(run_chunks * sizeof(kernels::PlanCopyChunk),
                                        group_chunks * sizeof(kernels::PlanCopyGroupChunk));
        if (table.size() < bytes) table.resize(bytes);
        auto r = kernels::EncodePlanCopyPrefix(group.runs, run_chunks, table.data());
        auto gr = kernels::EncodePlanCopyGroupPrefix(group.groups, group_chunks, table.data());
        if (!r.ok() || !gr.ok()) state.SkipWithError("encoding failed");
        benchmark::DoNotOptimize(table.data());
      } else {
        std::vector<Run> posted(group.runs.begin(), group.runs.end());
        benchmark::DoNotOptimize(posted.data());
      }
      runs += group.run_count();
      entries += group.runs.size() + group.groups.size();
      group.runs.clear();
      group.groups.clear();
      group.group_rows = 0;
      group.bytes = 0;
    }
  }
  const double per_wave = SecondsSince(start) / static_cast<double>(state.iterations());
  state.counters["runs_per_request"] = static_cast<double>(runs) / kWave;
  state.counters["entries_per_request"] = static_cast<double>(entries) / kWave;
  state.counters["us_per_request"] = per_wave * 1e6 / kWave;
  state.counters["ns_per_run"] = per_wave * 1e9 / static_cast<double>(runs);
}

// LayerPlan::Create with groups on, as cuda_ipc's kvd calls it once per request and decode
// rank, against what it did before it planned groups directly (`regrouped`: PlanTransfer's runs
// of layer 0, then GroupRuns), and with blocks of groups (`blocks`, as nccl's kvd plans). The
// ceiling is writing the resulting groups into a fresh vector.
void LayerPlanCase(benchmark::State& state, int dst_tp, bool regrouped, const char* dst_order,
                   bool blocks) {
  const PlanEntries entries = blocks ? PlanEntries::kGroupBlocks : PlanEntries::kGroups;
  const KvRegion src = PathRegion(1, 0), dst = PathRegion(dst_tp, 0, dst_order);
  const auto src_ids = Blocks(kPathTokens / 16, true, 1),
             dst_ids = Blocks(kPathTokens / 16, true, 2);
  const TransferSpec spec{src_ids, dst_ids, kPathTokens, 0, 1};
  auto reference = LayerPlan::Create(src, dst, spec, entries);
  if (!reference.ok()) {
    state.SkipWithError(reference.status().ToString().c_str());
    return;
  }
  Plan layer0;
  if (Status s = reference->AppendLayer(0, &layer0); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (regrouped) {
      auto runs = PlanTransfer(src, dst, spec);
      if (!runs.ok()) {
        state.SkipWithError(runs.status().ToString().c_str());
        return;
      }
      std::vector<RunGroup> groups;
      GroupRuns(runs->runs, &groups);
      benchmark::DoNotOptimize(groups.data());
    } else {
      auto plan = LayerPlan::Create(src, dst, spec, entries);
      benchmark::DoNotOptimize(plan);
    }
  }
  const double per_plan = SecondsSince(start) / static_cast<double>(state.iterations());
  int reps = 0;
  start = std::chrono::steady_clock::now();
  do {
    std::vector<RunGroup> copy(layer0.groups.begin(), layer0.groups.end());
    std::vector<GroupBlocks> copy_blocks(layer0.blocks.begin(), layer0.blocks.end());
    benchmark::DoNotOptimize(copy.data());
    benchmark::DoNotOptimize(copy_blocks.data());
    ++reps;
  } while (SecondsSince(start) < 0.05);
  const double ceiling = SecondsSince(start) / reps;
  state.counters["rows"] = static_cast<double>(reference->runs_per_layer());
  state.counters["entries"] = static_cast<double>(reference->entries_per_layer());
  state.counters["us_per_plan"] = per_plan * 1e6;
  state.counters["ceiling_us"] = ceiling * 1e6;
  state.counters["x_ceiling"] = per_plan / ceiling;
}

// A pulled request's 32 layers in one plan, as kvd's SendLayers plans a pull: PlanTransfer over
// the range (`whole`), or, where the layers do not adjoin, a LayerPlan shifted to every layer
// (`by_layer`; LayerPlan::layers_adjoin). The ceiling is writing the same runs into a fresh
// vector.
void PullPlanCase(benchmark::State& state, const char* order, bool by_layer) {
  const KvRegion src = PathRegion(1, 0, order), dst = PathRegion(1, 0, order);
  const auto src_ids = Blocks(kPathTokens / 16, true, 1),
             dst_ids = Blocks(kPathTokens / 16, true, 2);
  const TransferSpec spec{src_ids, dst_ids, kPathTokens, 0, kPathLayers};
  auto reference = PlanTransfer(src, dst, spec);
  auto layers = LayerPlan::Create(src, dst, spec);
  if (!reference.ok() || !layers.ok()) {
    state.SkipWithError("planning failed");
    return;
  }
  Plan plan;
  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    plan.runs.clear();
    plan.bytes = 0;
    Status s = Status::Ok();
    if (by_layer) {
      auto fresh = LayerPlan::Create(src, dst, spec);  // once per request and destination
      s = fresh.ok() ? fresh->AppendLayers(0, kPathLayers, &plan) : fresh.status();
    } else {
      s = PlanTransfer(src, dst, spec, &plan);
    }
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(plan.runs.data());
  }
  const double per_plan = SecondsSince(start) / static_cast<double>(state.iterations());
  int reps = 0;
  start = std::chrono::steady_clock::now();
  do {
    std::vector<Run> copy(reference->runs.begin(), reference->runs.end());
    benchmark::DoNotOptimize(copy.data());
    ++reps;
  } while (SecondsSince(start) < 0.05);
  const double ceiling = SecondsSince(start) / reps;
  state.counters["runs"] = static_cast<double>(plan.runs.size());
  state.counters["whole_runs"] = static_cast<double>(reference->runs.size());
  state.counters["layers_adjoin"] = layers->layers_adjoin() ? 1 : 0;
  state.counters["us_per_request"] = per_plan * 1e6;
  state.counters["ceiling_us"] = ceiling * 1e6;
  state.counters["x_ceiling"] = per_plan / ceiling;
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"LBNHC/scattered", "LBNHC", "LBNHC"},
      {"BLHNC/scattered", "BLHNC", "BLHNC"},
      {"LBNHC/contiguous", "LBNHC", "LBNHC", 16, 16, false},
      {"BLHNC/contiguous", "BLHNC", "BLHNC", 16, 16, false},
      {"LBNHC/one_layer", "LBNHC", "LBNHC", 16, 16, true, 40},
      {"BLHNC/one_layer", "BLHNC", "BLHNC", 16, 16, true, 40},
      {"LBNHC_16_to_32/scattered", "LBNHC", "LBNHC", 16, 32},
      // What kvd plans per decode rank when one prefill rank feeds two (TP 1 -> 2): a layer's
      // page splits at every token into the rank's heads.
      {"LBNHC_tp1_to_tp2/one_layer", "LBNHC", "LBNHC", 16, 16, true, 40, 2},
  };
  return cases;
}

void PrintHelp() {
  std::printf(
      "usage: kvbench plan [--benchmark_filter=REGEX] [--benchmark_format=console|json]\n"
      "                    [--benchmark_min_time=SECONDS] [other --benchmark_* flags]\n\n"
      "Times PlanTransfer for one %lld-token request over %lld layers and %lld heads\n"
      "(%lld bytes per head-token, blocks of 16 in a %lld-block cache), in LBNHC and BLHNC,\n"
      "with scattered block ids (as a long-running engine hands them out) and contiguous ones,\n"
      "for the whole request and for one layer (the per-layer push), and across block sizes.\n\n"
      "Per case: time per request (Time), runs in the plan, ns_per_run, and the ceiling:\n"
      "ceiling_us is the time to write the same run table into a fresh vector, measured in\n"
      "this run; x_ceiling is plan time / ceiling.\n\n"
      "cases:\n",
      static_cast<long long>(kTokens), static_cast<long long>(kLayers),
      static_cast<long long>(kHeads), static_cast<long long>(kContent),
      static_cast<long long>(kBlocks));
  for (const Case& c : Cases()) std::printf("  plan/%s\n", c.name.c_str());
  std::printf(
      "\nkvd_request/* time kvd's io-thread work per request of `kvbench pd --tokens 4096\n"
      "--layers 32 --block-ids random --window 8` (decode TP 1 or 2): planning each layer, or\n"
      "one LayerPlan per request shifted to every layer; gathering a wave's runs per layer and\n"
      "decode rank; checking and copying them as a post does (ipc_*: checking them and encoding\n"
      "the copy kernel's table as cuda_ipc does, from runs or from run groups). Counters:\n"
      "us_per_request, runs_per_request, entries_per_request (runs + groups), ns_per_run.\n"
      "\nlayer_plan/* time LayerPlan::Create with groups on for one such request and decode rank\n"
      "(`groups`), against planning layer 0's runs and grouping them after (`runs_then_grouped`,\n"
      "what it did before); ceiling_us writes the same groups into a fresh vector.\n"
      "\npull_plan/* time planning one such request's 32 layers at once, TP 1, as kvd plans a\n"
      "pull: PlanTransfer over the range (`whole`) against a LayerPlan shifted to every layer\n"
      "(`by_layer`, what kvd does where layers_adjoin is 0); runs and whole_runs count both\n"
      "plans' runs; ceiling_us writes the same runs into a fresh vector.\n");
}

int PlanBenchMain(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      PrintHelp();
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (argc > 1) {
    std::fprintf(stderr, "kvbench plan: unknown argument '%s' (kvbench plan --help)\n", argv[1]);
    return 2;
  }
  for (const Case& c : Cases()) {
    benchmark::RegisterBenchmark(("plan/" + c.name).c_str(), PlanCase, c)
        ->Unit(benchmark::kMicrosecond);
  }
  const std::pair<PathMode, const char*> modes[] = {{PathMode::kPlanEachLayer, "plan_each_layer"},
                                                    {PathMode::kLayerPlan, "layer_plan"},
                                                    {PathMode::kIpcRuns, "ipc_runs"},
                                                    {PathMode::kIpcGroups, "ipc_groups"}};
  size_t cases = Cases().size();
  for (int tp : {1, 2}) {
    for (const auto& [mode, mode_name] : modes) {
      ++cases;
      const std::string name =
          "kvd_request/LBNHC_tp1_to_tp" + std::to_string(tp) + "/" + std::string(mode_name);
      benchmark::RegisterBenchmark(name.c_str(), RequestPathCase, tp, mode)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // TP 1 -> 1 and 1 -> 2 in LBNHC, and LBNHC -> BLHNC (a page's 8 heads, 16 rows of 512 B each).
  const std::tuple<int, const char*, const char*> shapes[] = {{1, "LBNHC", "LBNHC_tp1_to_tp1"},
                                                              {2, "LBNHC", "LBNHC_tp1_to_tp2"},
                                                              {1, "BLHNC", "LBNHC_to_BLHNC"}};
  const std::pair<const char*, std::pair<bool, bool>> kinds[] = {
      {"groups", {false, false}}, {"runs_then_grouped", {true, false}}, {"blocks", {false, true}}};
  for (const auto& [tp, order, shape] : shapes) {
    for (const auto& [kind, flags] : kinds) {
      ++cases;
      const std::string name = "layer_plan/" + std::string(shape) + "/" + kind;
      benchmark::RegisterBenchmark(name.c_str(), LayerPlanCase, tp, flags.first, order,
                                   flags.second)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const char* order : {"LBNHC", "BLHNC"}) {
    for (bool by_layer : {false, true}) {
      ++cases;
      const std::string name =
          "pull_plan/" + std::string(order) + "/" + (by_layer ? "by_layer" : "whole");
      benchmark::RegisterBenchmark(name.c_str(), PullPlanCase, order, by_layer)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  std::fprintf(stderr, "kvbench plan: %zu cases, about a second each\n", cases);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

const bool registered =
    cli::Register({"plan", "plan time of a 32k-token, 80-layer request, per request and per run",
                   &PlanBenchMain});

}  // namespace
}  // namespace kv::bench
