// kvbench kernels: the local GPU data path on one device, each figure beside its ceiling measured
// in the same run.
//
//  - plan copy device→device of 64 KiB and 16 KiB pages between random block ids, against one
//    cudaMemcpyAsync device→device of the same total bytes;
//  - device→pinned host and back (pages as above) through the chosen path, against one large
//    pinned cudaMemcpyAsync of the same bytes, and the speed-up over one cudaMemcpyAsync a page;
//  - paged decode attention (bf16, 32 query heads over 8 KV heads, head_dim 128), K/V bytes read
//    per second against the device copy bandwidth counted as bytes read + written per second;
//  - with two GPUs, GPU 0 → GPU 1: the plan copy kernel pushing and pulling random 64 KiB pages
//    (several grids), the kernel beside the copy engines, and larger pages through kvd's
//    RunCopier forced to either path, against one cudaMemcpyPeerAsync.
// What is timed: every figure is the median over --iters samples (after two warm-up runs) of
// kBackToBack runs issued back to back between two CUDA events, divided by kBackToBack. Each
// sample is led in by one more run that is not timed, so the start event fires when the stream
// is already busy: the window holds the GPU's work of kBackToBack runs and whatever host time
// the GPU had to wait for. For the plan copier, whose Copy() encodes the run table on the host
// and uploads it on a stream of its own, that means the encoding and upload of run i+1 overlap
// run i, as in a pipeline of transfers; if the host were slower than the GPU, the figure would
// show it. The kernel alone is also timed over a table uploaded once beforehand, and the host's
// encoding time is printed beside the GPU time it has to hide behind. Copy-engine references
// and the loop of one cudaMemcpyAsync a page, slow and host-bound by themselves, take fewer
// samples, one run each.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/run_copier.h"
#include "kernels/decode_attention.h"
#include "kernels/plan_copy.h"
#include "kernels/strided_kv.h"
#include "tools/common/cli.h"

namespace kv::bench {
namespace {

using kernels::CopyDirection;
using kernels::CopyPath;

#define BENCH_CUDA(call)                                                                \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "kvbench kernels: %s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "kvbench kernels: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Owning device / pinned allocations for the duration of one case.
struct DeviceMemory {
  void* p = nullptr;
  explicit DeviceMemory(size_t n) { BENCH_CUDA(cudaMalloc(&p, n)); }
  ~DeviceMemory() { cudaFree(p); }
  unsigned char* get() const { return static_cast<unsigned char*>(p); }
};
struct PinnedMemory {
  void* p = nullptr;
  explicit PinnedMemory(size_t n) { BENCH_CUDA(cudaMallocHost(&p, n)); }
  ~PinnedMemory() { cudaFreeHost(p); }
  unsigned char* get() const { return static_cast<unsigned char*>(p); }
};

// bf16 values in [-1, 1) from a hash of the index: never time on zeros.
__global__ void FillRandom(uint16_t* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float f = (h & 0xffffff) / 8388608.0f - 1.0f;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    p[i] = static_cast<uint16_t>(bits >> 16);
  }
}

void Fill(void* p, uint64_t bytes, uint32_t seed) {
  FillRandom<<<1024, 256>>>(static_cast<uint16_t*>(p), bytes / 2, seed);
  BENCH_CUDA(cudaGetLastError());
}

constexpr int kBackToBack = 4;
constexpr int kReferenceIters = 3;

struct Timer {
  cudaStream_t stream;
  int iters;
  template <typename Fn>
  double MedianSeconds(Fn&& fn, int back_to_back = kBackToBack, int samples = 0) {
    if (samples <= 0) samples = iters;
    cudaEvent_t start, stop;
    BENCH_CUDA(cudaEventCreate(&start));
    BENCH_CUDA(cudaEventCreate(&stop));
    for (int i = 0; i < 2; ++i) fn();
    std::vector<float> ms;
    for (int i = 0; i < samples; ++i) {
      fn();  // the lead-in: keeps the GPU busy while the timed runs are prepared
      BENCH_CUDA(cudaEventRecord(start, stream));
      for (int k = 0; k < back_to_back; ++k) fn();
      BENCH_CUDA(cudaEventRecord(stop, stream));
      BENCH_CUDA(cudaEventSynchronize(stop));
      float t = 0;
      BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t / back_to_back);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return ms[ms.size() / 2] / 1e3;
  }
};

// Median host time of encoding `runs` into a pinned table, as PlanCopier::Copy does per copy.
double EncodeSeconds(std::span<const Run> runs, void* table, uint64_t table_bytes, int iters) {
  std::vector<double> seconds;
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Check(kernels::EncodePlanCopyTable(runs, table, table_bytes).status(), "encode");
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return seconds[seconds.size() / 2];
}

// One page-sized run per block, source and destination blocks both drawn at random.
std::vector<Run> PageRuns(uint64_t total, uint64_t page, uint32_t seed) {
  const uint64_t pages = total / page;
  std::vector<uint64_t> src(pages), dst(pages);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<Run> runs(pages);
  for (uint64_t i = 0; i < pages; ++i) runs[i] = {src[i] * page, dst[i] * page, page};
  return runs;
}

struct Report {
  std::vector<std::string> json;
  void Add(const std::string& name, double value, double ceiling, const char* unit) {
    const double ratio = value / ceiling;
    std::printf("  %-44s %9.1f %s   ceiling %9.1f %s   ratio %.3f\n", name.c_str(), value, unit,
                ceiling, unit, ratio);
    std::fflush(stdout);
    char line[512];
    std::snprintf(line, sizeof line,
                  "{\"name\": \"%s\", \"value\": %.3f, \"ceiling\": %.3f, \"unit\": \"%s\", "
                  "\"ratio\": %.4f}",
                  name.c_str(), value, ceiling, unit, ratio);
    json.push_back(line);
  }
};

double GBs(uint64_t bytes, double seconds) {
  return bytes / seconds / 1e9;
}

// Device→device: plan copy kernel (and copy engine for reference) against one memcpy.
double DeviceCopies(Timer& timer, uint64_t total, const kernels::PlanCopyOptions& options,
                    Report& report) {
  DeviceMemory src(total), dst(total);
  Fill(src.get(), total, 1);
  const double one = timer.MedianSeconds([&] {
    BENCH_CUDA(
        cudaMemcpyAsync(dst.get(), src.get(), total, cudaMemcpyDeviceToDevice, timer.stream));
  });
  const double ceiling = GBs(2 * total, one);  // bytes read + written
  std::printf("device copy ceiling: cudaMemcpyAsync d2d of %.2f GiB: %.1f GB/s (read + write)\n",
              total / 1073741824.0, ceiling);
  auto copier = kernels::PlanCopier::Create(options);
  Check(copier.status(), "plan copier");
  for (uint64_t page : {uint64_t{64} << 10, uint64_t{16} << 10}) {
    const auto runs = PageRuns(total, page, static_cast<uint32_t>(page));
    const std::string tag = std::to_string(page >> 10) + "KiB pages d2d";
    // The kernel alone, over a table put on the device beforehand.
    const uint64_t chunks = kernels::PlanCopyChunks(runs);
    const uint64_t table_bytes = kernels::PlanCopyTableBytes(runs.size(), chunks);
    PinnedMemory host_table(table_bytes);
    DeviceMemory device_table(table_bytes);
    const double encode = EncodeSeconds(runs, host_table.get(), table_bytes, timer.iters);
    BENCH_CUDA(
        cudaMemcpy(device_table.get(), host_table.get(), table_bytes, cudaMemcpyHostToDevice));
    const double kernel = timer.MedianSeconds([&] {
      Check(kernels::LaunchPlanCopy(src.get(), dst.get(), device_table.get(), runs.size(), chunks,
                                    options, timer.stream),
            "plan copy kernel");
    });
    report.Add("plan copy kernel, " + tag, GBs(2 * total, kernel), ceiling, "GB/s");
    // The same table in launches of 1024 chunks back to back: kvd's most common launch at
    // TP 1 -> 2 (four coalesced batches of 256 half pages), few chunks for the grid to share.
    const uint64_t per_launch = 1024;
    const double launches = timer.MedianSeconds([&] {
      const auto* table = static_cast<const kernels::PlanCopyChunk*>(device_table.p);
      for (uint64_t at = 0; at < chunks; at += per_launch) {
        Check(kernels::LaunchPlanCopy(src.get(), dst.get(), table + at, 0,
                                      std::min(per_launch, chunks - at), options, timer.stream),
              "plan copy kernel");
      }
    });
    report.Add("plan copy kernel, launches of 1024 chunks, " + tag, GBs(2 * total, launches),
               ceiling, "GB/s");
    // What a pipeline of transfers sees: encode, upload and launch per copy.
    const double copier_seconds = timer.MedianSeconds(
        [&] { Check((*copier)->Copy(src.get(), dst.get(), runs, timer.stream), "plan copy"); });
    report.Add("plan copier (table per copy), " + tag, GBs(2 * total, copier_seconds), ceiling,
               "GB/s");
    std::printf("  host encodes %llu runs (%.2f MiB table) in %.1f us; the kernel runs %.1f us\n",
                static_cast<unsigned long long>(runs.size()), table_bytes / 1048576.0, encode * 1e6,
                kernel * 1e6);
    const double engine = timer.MedianSeconds(
        [&] {
          Check(kernels::LaunchBatchCopy(src.get(), dst.get(), runs, timer.stream), "batch copy");
        },
        1, kReferenceIters);
    report.Add("copy engine batch, " + tag, GBs(2 * total, engine), ceiling, "GB/s");
  }
  return ceiling;
}

// The group kernel on nccl's gather of LBNHC → BLHNC pages (benchmarks/pd_gpu.md, fifteenth
// session): per random 64 KiB page, one group per head of 16 rows of 512 B, 4 KiB apart in the
// page, packed into a contiguous staging buffer; nccl's default grid (16 CTAs) and all SMs.
void GroupCopies(Timer& timer, uint64_t total, double ceiling, Report& report) {
  constexpr uint64_t kPage = 64 << 10, kRow = 512, kRows = 16, kHeads = 8;
  const auto pages = PageRuns(total, kPage, 7);  // random source pages
  std::vector<RunGroup> groups;
  groups.reserve(pages.size() * kHeads);
  uint64_t at = 0;
  for (const Run& page : pages) {
    for (uint64_t h = 0; h < kHeads; ++h, at += kRow * kRows) {
      groups.push_back({page.src_offset + h * kRow, at, kRow, kRows, 4096, kRow});
    }
  }
  DeviceMemory src(total), dst(total);
  Fill(src.get(), total, 5);
  const uint64_t max_chunks = groups.size();
  PinnedMemory host_table(max_chunks * sizeof(kernels::PlanCopyGroupChunk));
  auto prefix = kernels::EncodePlanCopyGroupPrefix(groups, max_chunks, host_table.get());
  Check(prefix.status(), "group table");
  DeviceMemory device_table(max_chunks * sizeof(kernels::PlanCopyGroupChunk));
  BENCH_CUDA(cudaMemcpy(device_table.get(), host_table.get(),
                        prefix->chunks * sizeof(kernels::PlanCopyGroupChunk),
                        cudaMemcpyHostToDevice));
  for (int ctas : {16, 32, 0}) {
    const kernels::PlanCopyOptions options{ctas};
    const double seconds = timer.MedianSeconds([&] {
      Check(kernels::LaunchPlanCopyGroups(src.get(), dst.get(), device_table.get(), prefix->chunks,
                                          options, timer.stream),
            "group kernel");
    });
    report.Add("group kernel, 16 x 512 B rows 4 KiB apart -> packed, ctas " +
                   (ctas ? std::to_string(ctas) : std::string("all")),
               GBs(2 * at, seconds), ceiling, "GB/s");
  }
}

// GPU 0 → GPU 1 over NVLink (peer access on): the plan copy kernel over random 64 KiB pages,
// pushed (launched on GPU 0, storing into GPU 1) and pulled (launched on GPU 1, loading from
// GPU 0), for several grids, against one cudaMemcpyPeerAsync of the same bytes: the ceiling
// kvbench pd --transport ipc compares against. Figures count bytes moved once.
void PeerCopies(int iters, uint64_t total, Report& report) {
  int access = 0;
  BENCH_CUDA(cudaDeviceCanAccessPeer(&access, 0, 1));
  if (!access) {
    std::printf("  skipped: GPU 0 cannot access GPU 1\n");
    return;
  }
  cudaStream_t streams[2];
  for (int d : {0, 1}) {
    BENCH_CUDA(cudaSetDevice(d));
    const cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) BENCH_CUDA(e);
    (void)cudaGetLastError();
    BENCH_CUDA(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
  }
  BENCH_CUDA(cudaSetDevice(1));
  DeviceMemory dst(total);
  BENCH_CUDA(cudaSetDevice(0));
  DeviceMemory src(total);
  Fill(src.get(), total, 3);
  BENCH_CUDA(cudaDeviceSynchronize());
  Timer push{streams[0], iters}, pull{streams[1], iters};
  const double one = push.MedianSeconds(
      [&] { BENCH_CUDA(cudaMemcpyPeerAsync(dst.get(), 1, src.get(), 0, total, push.stream)); });
  const double ceiling = GBs(total, one);
  std::printf("peer copy ceiling: cudaMemcpyPeerAsync GPU 0 -> 1 of %.2f GiB: %.1f GB/s\n",
              total / 1073741824.0, ceiling);
  const auto runs = PageRuns(total, 64 << 10, 64);
  const Run whole{0, 0, total};
  for (bool random : {true, false}) {
    const std::span<const Run> table_runs =
        random ? std::span<const Run>(runs) : std::span<const Run>(&whole, 1);
    const uint64_t chunks = kernels::PlanCopyChunks(table_runs);
    const uint64_t table_bytes = kernels::PlanCopyTableBytes(table_runs.size(), chunks);
    PinnedMemory host_table(table_bytes);
    Check(kernels::EncodePlanCopyTable(table_runs, host_table.get(), table_bytes).status(),
          "encode");
    for (int d : {0, 1}) {
      BENCH_CUDA(cudaSetDevice(d));
      DeviceMemory device_table(table_bytes);
      BENCH_CUDA(
          cudaMemcpy(device_table.get(), host_table.get(), table_bytes, cudaMemcpyHostToDevice));
      Timer& timer = d == 0 ? push : pull;
      for (int ctas : {0, 96, 64, 32}) {
        const kernels::PlanCopyOptions options{ctas};
        const double seconds = timer.MedianSeconds([&] {
          Check(kernels::LaunchPlanCopy(src.get(), dst.get(), device_table.get(), 0, chunks,
                                        options, timer.stream),
                "plan copy kernel");
        });
        report.Add(std::string("peer kernel ") + (d == 0 ? "push" : "pull") + ", " +
                       (random ? "random 64KiB pages" : "one run") + ", ctas " +
                       (ctas ? std::to_string(ctas) : std::string("all")),
                   GBs(total, seconds), ceiling, "GB/s");
      }
    }
  }
  // Larger pages, through kvd's own RunCopier (the path cuda_ipc posts on) forced to each path:
  // the kernel pushed and pulled, and the copy engine (2 MiB pieces over four streams) pushed.
  // Its chooser takes the engine from a mean run of kCopyEngineMinMeanRun: is that right here?
  for (uint64_t page :
       {uint64_t{256} << 10, uint64_t{1} << 20, uint64_t{2} << 20, uint64_t{8} << 20}) {
    const auto page_runs = PageRuns(total, page, static_cast<uint32_t>(page >> 10));
    const std::string tag = ", random " + std::to_string(page >> 10) + "KiB pages";
    for (int d : {0, 1}) {
      for (CopyPath path : {CopyPath::kKernel, CopyPath::kCopyEngine}) {
        if (d == 1 && path == CopyPath::kCopyEngine) continue;
        BENCH_CUDA(cudaSetDevice(d));
        auto copier = gpu::RunCopier::Create(d, path);
        Check(copier.status(), "run copier");
        Timer& timer = d == 0 ? push : pull;
        const double seconds = timer.MedianSeconds([&] {
          Check(
              (*copier)->Copy(src.get(), dst.get(), page_runs, CopyDirection::kPeer, timer.stream),
              "run copier copy");
        });
        report.Add(
            std::string("peer ") + kernels::CopyPathName(path) + (d == 0 ? " push" : " pull") + tag,
            GBs(total, seconds), ceiling, "GB/s");
      }
    }
  }
  // Both at once: 1/k of the pages through the copy engines on a second stream, the rest by the
  // kernel (push). The engines move 64 KiB pages slowly alone, but they use NVLink the SMs leave
  // idle: does the sum pass the one-piece ceiling?
  BENCH_CUDA(cudaSetDevice(0));
  cudaStream_t engine_stream;
  cudaEvent_t fork, join;
  BENCH_CUDA(cudaStreamCreateWithFlags(&engine_stream, cudaStreamNonBlocking));
  BENCH_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  BENCH_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  for (size_t k : {size_t{16}, size_t{8}, size_t{4}}) {
    const size_t split = runs.size() / k;
    const std::span<const Run> engine_runs(runs.data(), split);
    const std::span<const Run> kernel_runs(runs.data() + split, runs.size() - split);
    const uint64_t chunks = kernels::PlanCopyChunks(kernel_runs);
    const uint64_t table_bytes = kernels::PlanCopyTableBytes(kernel_runs.size(), chunks);
    PinnedMemory host_table(table_bytes);
    Check(kernels::EncodePlanCopyTable(kernel_runs, host_table.get(), table_bytes).status(),
          "encode");
    DeviceMemory device_table(table_bytes);
    BENCH_CUDA(
        cudaMemcpy(device_table.get(), host_table.get(), table_bytes, cudaMemcpyHostToDevice));
    const double seconds = push.MedianSeconds([&] {
      BENCH_CUDA(cudaEventRecord(fork, push.stream));
      BENCH_CUDA(cudaStreamWaitEvent(engine_stream, fork, 0));
      Check(kernels::LaunchBatchCopy(src.get(), dst.get(), engine_runs, engine_stream),
            "batch copy");
      Check(kernels::LaunchPlanCopy(src.get(), dst.get(), device_table.get(), 0, chunks, {},
                                    push.stream),
            "plan copy kernel");
      BENCH_CUDA(cudaEventRecord(join, engine_stream));
      BENCH_CUDA(cudaStreamWaitEvent(push.stream, join, 0));
    });
    report.Add("peer kernel push + engines 1/" + std::to_string(k) + ", random 64KiB pages",
               GBs(total, seconds), ceiling, "GB/s");
  }
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(engine_stream);
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

// Device↔pinned host: the chosen path, against one big pinned memcpy and one memcpy a page.
void HostCopies(Timer& timer, uint64_t total, const kernels::PlanCopyOptions& options,
                Report& report) {
  DeviceMemory dev(total);
  PinnedMemory host(total);
  Fill(dev.get(), total, 2);
  auto copier = kernels::PlanCopier::Create(options);
  Check(copier.status(), "plan copier");
  for (bool to_host : {true, false}) {
    const char* way = to_host ? "d2h" : "h2d";
    const CopyDirection direction =
        to_host ? CopyDirection::kDeviceToHost : CopyDirection::kHostToDevice;
    unsigned char* src = to_host ? dev.get() : host.get();
    unsigned char* dst = to_host ? host.get() : dev.get();
    const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    const double one = timer.MedianSeconds(
        [&] { BENCH_CUDA(cudaMemcpyAsync(dst, src, total, kind, timer.stream)); });
    const double ceiling = GBs(total, one);
    std::printf("%s ceiling: one pinned cudaMemcpyAsync of %.2f GiB: %.1f GB/s\n", way,
                total / 1073741824.0, ceiling);
    for (uint64_t page : {uint64_t{64} << 10, uint64_t{16} << 10}) {
      const auto runs = PageRuns(total, page, static_cast<uint32_t>(page) + 7);
      const CopyPath path = kernels::ChooseCopyPath(runs, direction, timer.stream);
      const double kernel = timer.MedianSeconds(
          [&] { Check((*copier)->Copy(src, dst, runs, timer.stream), "plan copy"); });
      const double engine = timer.MedianSeconds(
          [&] { Check(kernels::LaunchBatchCopy(src, dst, runs, timer.stream), "batch copy"); }, 1,
          kReferenceIters);
      const double per_page = timer.MedianSeconds(
          [&] {
            for (const Run& r : runs) {
              BENCH_CUDA(cudaMemcpyAsync(dst + r.dst_offset, src + r.src_offset, r.length, kind,
                                         timer.stream));
            }
          },
          1, kReferenceIters);
      const double chosen = path == CopyPath::kKernel ? kernel : engine;
      const std::string tag = std::string(way) + " " + std::to_string(page >> 10) + "KiB pages";
      report.Add("plan copy kernel, " + tag, GBs(total, kernel), ceiling, "GB/s");
      report.Add("copy engine batch, " + tag, GBs(total, engine), ceiling, "GB/s");
      report.Add("one cudaMemcpyAsync a page, " + tag, GBs(total, per_page), ceiling, "GB/s");
      std::printf("  chosen path for %s: %s, %.2fx the per-page memcpy loop\n", tag.c_str(),
                  kernels::CopyPathName(path), per_page / chosen);
    }
  }
}

void Attention(Timer& timer, int64_t batch, int64_t context, double copy_ceiling, Report& report) {
  constexpr int64_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;
  const int64_t blocks_per_seq = context / kBlockSize;
  kernels::StridedKv kv;  // one layer of LBNHC, K and V packed in C
  kv.layers = 1;
  kv.blocks = batch * blocks_per_seq;
  kv.heads = kKvHeads;
  kv.block_size = kBlockSize;
  kv.content_bytes = 2 * kHeadDim * 2;
  kv.head_stride = kv.content_bytes;
  kv.token_stride = kv.heads * kv.head_stride;
  kv.block_stride = kv.block_size * kv.token_stride;
  kv.layer_stride = kv.blocks * kv.block_stride;
  kv.span_bytes = kv.layer_stride;
  auto paged = kernels::SplitKv(kv, kHeadDim, kernels::DType::kBFloat16);
  Check(paged.status(), "kv view");
  DeviceMemory cache(kv.span_bytes), query(batch * kQHeads * kHeadDim * 2),
      out(batch * kQHeads * kHeadDim * 2), table(kv.blocks * 4), lens(batch * 4);
  Fill(cache.get(), kv.span_bytes, 3);
  Fill(query.get(), batch * kQHeads * kHeadDim * 2, 4);
  std::vector<int32_t> ids(kv.blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
  const std::vector<int32_t> seq_lens(batch, static_cast<int32_t>(context));
  BENCH_CUDA(cudaMemcpy(table.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(lens.get(), seq_lens.data(), batch * 4, cudaMemcpyHostToDevice));
  kernels::DecodeAttentionArgs args;
  args.query = query.get();
  args.out = out.get();
  args.block_table = reinterpret_cast<int32_t*>(table.get());
  args.block_table_stride = blocks_per_seq;
  args.seq_lens = reinterpret_cast<int32_t*>(lens.get());
  args.num_seqs = batch;
  args.num_q_heads = kQHeads;
  args.max_seq_len = context;
  args.scale = 0.08838834764f;
  const uint64_t ws_bytes = kernels::DecodeAttentionWorkspaceBytes(*paged, args);
  DeviceMemory workspace(ws_bytes);
  const double seconds = timer.MedianSeconds([&] {
    Check(kernels::LaunchDecodeAttention(*paged, cache.get(), args, workspace.get(), ws_bytes,
                                         timer.stream),
          "decode attention");
  });
  const uint64_t kv_bytes = static_cast<uint64_t>(batch) * context * kKvHeads * kHeadDim * 2 * 2;
  report.Add("decode attention bf16 b" + std::to_string(batch) + " ctx " + std::to_string(context) +
                 " (" + std::to_string(seconds * 1e6).substr(0, 7) + " us)",
             GBs(kv_bytes, seconds), copy_ceiling, "GB/s");
}

int KernelsMain(int argc, char** argv) {
  cli::Flags flags({
      {"json", "also print the figures as one JSON object on the last line", true},
      {"bytes", "bytes of each device-to-device copy case (default 1G)"},
      {"host-bytes", "bytes of each pinned host copy case (default 512M)"},
      {"batch", "sequences in the attention cases (default 64)"},
      {"contexts", "attention context lengths, e.g. 1024,8192,32768 (the default)"},
      {"iters", "timed runs per figure; the median is reported (default 20)"},
      {"max-ctas", "grid cap of the plan copy kernel; 0 = one CTA per SM (default)"},
      {"help", "show this help", true},
  });
  if (Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "kvbench kernels: %s\n", s.ToString().c_str());
    return 2;
  }
  if (flags.has("help")) {
    std::printf(
        "kvbench kernels — the GPU kernels of kvd on the current device, each figure beside a\n"
        "ceiling measured in the same run (see benchmarks/kernels.md for recorded figures).\n\n"
        "  plan copy d2d of random 64 KiB / 16 KiB pages vs one cudaMemcpyAsync d2d (read+write):\n"
        "    the kernel over a table already on the device (in one launch, and in launches of\n"
        "    1024 chunks), and PlanCopier::Copy (table encoded and uploaded per copy,\n"
        "    overlapping the previous copy), with the host encoding time\n"
        "  d2h / h2d pinned pages vs one large pinned cudaMemcpyAsync, and vs one memcpy a page\n"
        "  decode attention (bf16, 32 q heads / 8 kv heads, head_dim 128) K/V bytes read per\n"
        "  second vs the d2d copy bandwidth\n"
        "  with two GPUs: plan copy GPU 0 -> GPU 1 of random 64 KiB pages (push and pull, several\n"
        "    grids; kernel and copy engines at once), and of 256 KiB - 8 MiB pages by kvd's\n"
        "    RunCopier forced to the kernel (push, pull) and to the copy engine, vs one\n"
        "    cudaMemcpyPeerAsync\n\nflags:\n%s",
        flags.Help().c_str());
    return 0;
  }
  auto bytes = flags.bytes("bytes", 1ull << 30);
  auto host_bytes = flags.bytes("host-bytes", 512ull << 20);
  auto batch = flags.integer("batch", 64, 1, 4096);
  auto iters = flags.integer("iters", 20, 1, 10000);
  auto max_ctas = flags.integer("max-ctas", 0, 0, 1 << 20);
  std::vector<int64_t> contexts = {1024, 8192, 32768};
  if (flags.has("contexts")) {
    auto list = flags.int_list("contexts");
    if (!list.ok()) {
      std::fprintf(stderr, "kvbench kernels: %s\n", list.status().ToString().c_str());
      return 2;
    }
    contexts = *list;
  }
  for (const Status& s :
       {bytes.status(), host_bytes.status(), batch.status(), iters.status(), max_ctas.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "kvbench kernels: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  for (int64_t c : contexts) {
    if (c < 16 || c % 16 != 0 || c > (1 << 22)) {
      std::fprintf(stderr, "kvbench kernels: context %lld must be a multiple of 16 in [16, 4M]\n",
                   static_cast<long long>(c));
      return 2;
    }
  }
  if (*bytes < (1 << 20) || *host_bytes < (1 << 20)) {
    std::fprintf(stderr, "kvbench kernels: --bytes and --host-bytes must be at least 1M\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "kvbench kernels: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f GiB\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Timer timer{stream, static_cast<int>(*iters)};
  const kernels::PlanCopyOptions options{static_cast<int>(*max_ctas)};
  Report report;
  std::printf("[1/3] device-to-device plan copy\n");
  const double copy_ceiling = DeviceCopies(timer, *bytes & ~((64ull << 10) - 1), options, report);
  GroupCopies(timer, *bytes & ~((64ull << 10) - 1), copy_ceiling, report);
  std::printf("[2/3] pinned host copies\n");
  HostCopies(timer, *host_bytes & ~((64ull << 10) - 1), options, report);
  std::printf("[3/3] decode attention (ceiling: the d2d copy bandwidth above)\n");
  for (int64_t context : contexts) Attention(timer, *batch, context, copy_ceiling, report);
  cudaStreamDestroy(stream);
  if (devices > 1) {
    std::printf("peer copy, GPU 0 -> GPU 1\n");
    PeerCopies(static_cast<int>(*iters), *bytes & ~((64ull << 10) - 1), report);
  }
  if (flags.has("json")) {
    std::string all = "{\"device\": \"" + std::string(prop.name) + "\", \"figures\": [";
    for (size_t i = 0; i < report.json.size(); ++i) all += (i ? ", " : "") + report.json[i];
    std::printf("%s]}\n", all.c_str());
  }
  return 0;
}

const bool registered = cli::Register(
    {"kernels", "GPU kernels: plan copy, host copies, decode attention vs their ceilings",
     &KernelsMain});

}  // namespace
}  // namespace kv::bench
