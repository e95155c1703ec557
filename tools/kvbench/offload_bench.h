// kvbench offload: store and load bandwidth of the offload pool against the ceilings measured in
// the same run. Shared between offload_bench.cc (flags, host path, report) and offload_bench.cu
// (the GPU path, compiled only with CUDA).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layout/kv_region.h"
#include "base/status.h"

namespace kv::bench {

struct OffloadBenchConfig {
  std::vector<std::string> orders;  // "LBNHC", "BLNHC"
  int64_t layers = 32, heads = 8, head_dim = 128, dtype_bytes = 2, block_size = 16;
  int64_t engine_blocks = 0;  // blocks in the engine's cache
  int64_t batch = 0;          // blocks per store / load
  int iters = 5;
  bool busy = true;                  // GPU only: store beside a compute-bound kernel
  bool scattered = true;             // engine block ids drawn at random, as vLLM's are
  bool per_layer = false;            // loads report each layer (per-layer waits), as decode would
  std::string device_copy = "auto";  // GPU copies: offload::ParseDeviceCopy's names
  int dma_slice_runs = 512;          // GPU copy-engine batches (offload::CudaMoverOptions)

  LayoutSpec Spec(const std::string& order, int64_t blocks) const;
};

// One store or load of `bytes`, timed against two references moving the same bytes: one large
// copy between contiguous buffers (the ceiling) and one copy call per page (vLLM's older
// swap_blocks path).
struct OffloadRow {
  std::string order;
  std::string op;  // "store" (engine -> pool) or "load"
  uint64_t bytes = 0;
  uint64_t pages = 0;  // per-page copies the baseline issues
  uint64_t runs = 0;   // runs of the pool's plan
  double pool_gbps = 0;
  double ceiling_gbps = 0;
  double per_page_gbps = 0;
};

// A compute-bound kernel's time alone and while stores run beside it.
struct BusyRow {
  std::string order;
  double alone_ms = 0;
  double beside_store_ms = 0;
  double store_gbps = 0;  // store bandwidth while the kernel ran
};

struct OffloadReport {
  std::string machine;  // "cpu (no CUDA device)", "NVIDIA H200 (cuda:0)"
  std::string path;     // what moved the bytes
  std::string ceiling;  // what the ceiling column measured
  std::vector<OffloadRow> rows;
  std::vector<BusyRow> busy;
};

// The GPU half. Builds with CUDA register it (offload_bench.cu); elsewhere it stays null and
// the benchmark runs the host path. Returns kUnavailable when no device is present.
using GpuOffloadBench = Status (*)(const OffloadBenchConfig&, OffloadReport*);
GpuOffloadBench& GpuOffloadBenchSlot();

// Device memory for `kvbench offload-kvd --gpu`, registered by offload_bench.cu (null in builds
// without CUDA), so that file's C++ stays free of CUDA.
struct GpuMemoryOps {
  Result<void*> (*alloc)(uint64_t bytes);  // cudaMalloc on device 0, every byte 1
  void (*free)(void* ptr);
  // Median over `iters` (after a warm-up) of one pinned cudaMemcpyAsync of `bytes`, device to
  // host (to_host) or back: the ceiling of a store or a load.
  Result<double> (*pinned_copy_seconds)(uint64_t bytes, bool to_host, int iters);
};
const GpuMemoryOps*& GpuMemoryOpsSlot();

// Wall-clock helpers shared by both halves.
double GbPerSecond(uint64_t bytes, double seconds);
double Median(std::vector<double> v);
// `count` distinct block ids in [0, total): a random draw, or 0..count-1 when not scattered.
std::vector<int64_t> PickBlocks(int64_t count, int64_t total, bool scattered, uint32_t seed);
// A line on stderr, so progress never mixes with --json on stdout.
void Progress(const std::string& line);

}  // namespace kv::bench

namespace kv::bench {

// Medians over config.iters of a store of `batch` fresh keys from scattered engine blocks into
// a pool of 2·batch slots (so every store after the first evicts), and of a load of the last
// stored keys into other blocks. The same code times host and GPU engines.
struct PoolTiming {
  double store_seconds = 0;
  double load_seconds = 0;
  uint64_t bytes = 0;
  uint64_t store_runs = 0;
  uint64_t load_runs = 0;
};
Result<PoolTiming> TimePool(const OffloadBenchConfig& config, const KvRegion& engine,
                            std::byte* base, MemoryLocation where);

}  // namespace kv::bench
