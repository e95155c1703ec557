// kvbench gpu-transport: the cuda_ipc and nccl backends moving one Llama-3-8B-shaped request
// between two GPUs, each beside its ceiling measured in the same run on the same bytes:
//   cuda_ipc vs one cudaMemcpyPeerAsync of the request's total bytes in one piece;
//   nccl     vs one ncclSend/ncclRecv of the same bytes in one contiguous buffer.
// Plus per-layer streaming: layers posted --gap-us apart as a prefill would save them, and the
// time from the last layer's post to its completion, p50/p99 over --requests requests.
//
// Processes: this one never touches CUDA; it forks a baseline child (both ceilings), then per
// case one sender child on --src-device and --tp receiver children on --dst-device. Receivers
// verify every byte of the plan after the timed runs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "layout/kv_region.h"
#include "layout/plan.h"
#include "tools/common/cli.h"
#include "tools/kvbench/gpu_ceiling.h"
#include "tools/testing/child_process.h"
#include "transport/transport.h"

namespace kv::bench {
namespace {

using kv::harness::Channel;
using kv::harness::ChildProcess;
using transport::Clock;
using namespace std::chrono_literals;

struct Config {
  int64_t layers = 32, heads = 8, head_dim = 128, block_size = 16, tokens = 4096;
  int64_t cache_blocks = 0;  // blocks per region; 2x the request's by default
  int64_t iters = 20, requests = 100, gap_us = 1000, tp = 1;
  int src_device = 0, dst_device = 1;
  uint64_t staging = 32ull << 20;
  std::string ipc_path = "auto";
  // --transport-opt: given to both backends after the flags' own (each passes over keys it does
  // not take).
  std::vector<std::pair<std::string, std::string>> settings;
};

struct Case {
  std::string backend;
  std::string order;
};

LayoutSpec SpecFor(const Config& c, const std::string& order, int tp_rank) {
  LayoutSpec s;
  s.order = order;
  s.layers = c.layers;
  s.blocks = c.cache_blocks;
  s.heads = c.heads / (tp_rank < 0 ? 1 : c.tp);
  s.block_size = c.block_size;
  s.content_bytes = 2 * c.head_dim * 2;  // K and V, bf16
  if (tp_rank >= 0) {
    s.tp_rank = tp_rank;
    s.tp_size = static_cast<int>(c.tp);
  }
  return s;
}

std::vector<int64_t> RandomBlocks(const Config& c, uint32_t seed) {
  std::vector<int64_t> all(c.cache_blocks);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize((c.tokens + c.block_size - 1) / c.block_size);
  return all;
}

// The request's plan from the prefill region to decode rank `rank`, for layers [begin, end).
Result<Plan> PlanFor(const Config& c, const std::string& order, int rank, int64_t begin,
                     int64_t end) {
  KV_ASSIGN_OR_RETURN(KvRegion src, KvRegion::Create(SpecFor(c, order, -1)));
  KV_ASSIGN_OR_RETURN(KvRegion dst, KvRegion::Create(SpecFor(c, order, rank)));
  auto src_blocks = RandomBlocks(c, 1);
  auto dst_blocks = RandomBlocks(c, 2 + rank);
  TransferSpec t{src_blocks, dst_blocks, c.tokens, begin, end};
  return PlanTransfer(src, dst, t);
}

uint64_t SpanBytes(const Config& c, const std::string& order, int rank) {
  auto r = KvRegion::Create(SpecFor(c, order, rank));
  return r.ok() ? r->span_bytes() : 0;
}

uint8_t Pattern(uint64_t i) {
  return static_cast<uint8_t>((i * 2654435761u) >> 13);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

#define BENCH_CHECK(expr, code)                                                               \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "kvbench gpu-transport: %s: %s\n", #expr, cudaGetErrorString(e_)); \
      return code;                                                                            \
    }                                                                                         \
  } while (0)

// ---- The baseline child: both ceilings on `bytes` in one piece ----------------------------------

// The measurement is gpu_ceiling.h's, shared with `kvbench pd --memory cuda`.
int BaselineMain(Channel& channel, const Config& c, uint64_t bytes) {
  if (GpuCeilingSlot() == nullptr) return 2;
  auto ceilings = GpuCeilingSlot()(c.src_device, c.dst_device, bytes, static_cast<int>(c.iters));
  if (!ceilings.ok()) {
    std::fprintf(stderr, "kvbench gpu-transport: %s\n", ceilings.status().ToString().c_str());
    return 3;
  }
  return channel.Send(std::to_string(ceilings->peer_seconds) + " " +
                      std::to_string(ceilings->nccl_seconds))
                 .ok()
             ? 0
             : 5;
}

// ---- Receiver children: register, wait, verify ----------------------------------------------

transport::TransportOptions Options(const Config& c, int device) {
  transport::TransportOptions options{{{"device", std::to_string(device)},
                                       {"staging_bytes", std::to_string(c.staging)},
                                       {"copy_path", c.ipc_path}}};
  options.settings.insert(options.settings.end(), c.settings.begin(), c.settings.end());
  return options;
}

int ReceiverMain(Channel& channel, const Config& c, const Case& k, int rank) {
  auto fail = [&](const Status& s) {
    (void)channel.Send("error " + s.ToString());
    return 3;
  };
  BENCH_CHECK(cudaSetDevice(c.dst_device), 2);
  const uint64_t bytes = SpanBytes(c, k.order, rank);
  void* memory = nullptr;
  BENCH_CHECK(cudaMalloc(&memory, bytes), 2);
  BENCH_CHECK(cudaMemset(memory, 0, bytes), 2);
  auto t = transport::CreateTransport(k.backend, Options(c, c.dst_device));
  if (!t.ok()) return fail(t.status());
  auto reg = (*t)->register_memory(memory, bytes, MemoryLocation::Cuda(c.dst_device));
  if (!reg.ok()) return fail(reg.status());
  if (!channel.Send((*t)->address()).ok() || !channel.Send((*reg)->packed_descriptor()).ok()) {
    return 4;
  }
  auto verify = channel.Receive(Clock::now() + 600s);  // after the sender's timed runs
  if (!verify.ok()) return 5;
  auto plan = PlanFor(c, k.order, rank, 0, -1);
  if (!plan.ok()) return 6;
  std::vector<uint8_t> host(bytes);
  BENCH_CHECK(cudaMemcpy(host.data(), memory, bytes, cudaMemcpyDeviceToHost), 6);
  uint64_t wrong = 0;
  for (const Run& r : plan->runs) {
    for (uint64_t i = 0; i < r.length; ++i)
      wrong += host[r.dst_offset + i] != Pattern(r.src_offset + i);
  }
  return channel.Send(std::to_string(wrong)).ok() ? 0 : 7;
}

// ---- The sender child: timed transfers and streaming -------------------------------------------

// Posts one batch per receiver and waits for all; returns the wall time of the last completion
// after `posted`, or an error.
class Completions {
 public:
  transport::Completion Add() {
    std::lock_guard lock(mu_);
    ++pending_;
    return [this](Status s) {
      std::lock_guard lock(mu_);
      if (!s.ok() && error_.ok()) error_ = s;
      last_ = Clock::now();
      if (--pending_ == 0) cv_.notify_all();
    };
  }
  Result<Clock::time_point> Wait() {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, 60s, [&] { return pending_ == 0; })) {
      return Status::Timeout("transfers did not complete within 60 s");
    }
    if (!error_.ok()) return error_;
    return last_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
  Status error_;
  Clock::time_point last_;
};

int SenderMain(Channel& channel, const Config& c, const Case& k) {
  auto fail = [&](const std::string& what, const Status& s) {
    (void)channel.Send("error " + what + ": " + s.ToString());
    return 3;
  };
  BENCH_CHECK(cudaSetDevice(c.src_device), 2);
  const uint64_t bytes = SpanBytes(c, k.order, -1);
  std::vector<uint8_t> host(bytes);
  for (uint64_t i = 0; i < bytes; ++i) host[i] = Pattern(i);
  void* memory = nullptr;
  BENCH_CHECK(cudaMalloc(&memory, bytes), 2);
  BENCH_CHECK(cudaMemcpy(memory, host.data(), bytes, cudaMemcpyHostToDevice), 2);
  auto t = transport::CreateTransport(k.backend, Options(c, c.src_device));
  if (!t.ok()) return fail("create", t.status());
  auto reg = (*t)->register_memory(memory, bytes, MemoryLocation::Cuda(c.src_device));
  if (!reg.ok()) return fail("register", reg.status());
  std::vector<std::unique_ptr<transport::RemoteMemory>> remotes;
  std::vector<Plan> whole;
  std::vector<std::vector<Plan>> layers(c.tp);
  for (int rank = 0; rank < c.tp; ++rank) {
    auto address = channel.Receive(Clock::now() + 120s);
    auto descriptor = channel.Receive(Clock::now() + 120s);
    if (!address.ok() || !descriptor.ok()) return 4;
    auto peer = (*t)->connect(*address);
    if (!peer.ok()) return fail("connect", peer.status());
    auto remote = (*t)->import_remote(*peer, *descriptor);
    if (!remote.ok()) return fail("import", remote.status());
    remotes.push_back(std::move(remote).value());
    auto plan = PlanFor(c, k.order, rank, 0, -1);
    if (!plan.ok()) return fail("plan", plan.status());
    whole.push_back(std::move(plan).value());
    for (int64_t l = 0; l < c.layers; ++l) {
      auto layer = PlanFor(c, k.order, rank, l, l + 1);
      if (!layer.ok()) return fail("plan", layer.status());
      layers[rank].push_back(std::move(layer).value());
    }
  }
  auto post_all = [&](const std::vector<Plan>& plans, Completions& done) -> Status {
    for (size_t r = 0; r < plans.size(); ++r) {
      transport::Batch b{transport::Op::kPut, reg->get(), remotes[r].get(), plans[r].runs,
                         Clock::now() + 30s};
      KV_RETURN_IF_ERROR((*t)->post(b, done.Add()));
    }
    return Status::Ok();
  };
  std::vector<double> times;
  for (int64_t i = 0; i < c.iters + 3; ++i) {  // three warm-ups: communicators, page tables
    Completions done;
    auto t0 = Clock::now();
    if (Status s = post_all(whole, done); !s.ok()) return fail("post", s);
    auto end = done.Wait();
    if (!end.ok()) return fail("transfer", end.status());
    if (i >= 3) times.push_back(std::chrono::duration<double>(*end - t0).count());
  }
  std::fprintf(stderr, "  %s %s: whole request done, streaming %lld requests\n", k.backend.c_str(),
               k.order.c_str(), static_cast<long long>(c.requests));
  std::vector<double> tails;
  for (int64_t q = 0; q < c.requests; ++q) {
    Completions last;
    std::vector<std::unique_ptr<Completions>> earlier;
    auto t0 = Clock::now();
    Clock::time_point last_post;
    for (int64_t l = 0; l < c.layers; ++l) {
      std::this_thread::sleep_until(t0 + std::chrono::microseconds(l * c.gap_us));
      std::vector<Plan> per_rank;
      for (int r = 0; r < c.tp; ++r) per_rank.push_back(layers[r][l]);
      Completions* done = &last;
      if (l + 1 < c.layers) done = earlier.emplace_back(std::make_unique<Completions>()).get();
      last_post = Clock::now();
      if (Status s = post_all(per_rank, *done); !s.ok()) return fail("post", s);
    }
    for (auto& e : earlier) {
      if (auto s = e->Wait(); !s.ok()) return fail("layer", s.status());
    }
    auto end = last.Wait();
    if (!end.ok()) return fail("layer", end.status());
    tails.push_back(std::chrono::duration<double>(*end - last_post).count());
  }
  uint64_t runs = 0;
  for (const Plan& p : whole) runs += p.runs.size();
  std::string report = std::to_string(runs) + " " + std::to_string(Median(times)) + " " +
                       std::to_string(Percentile(tails, 0.5)) + " " +
                       std::to_string(Percentile(tails, 0.99));
  if (!channel.Send(report).ok()) return 5;
  (void)channel.Receive(Clock::now() + 600s);  // keep the peers' memory mapped until verified
  return 0;
}

// ---- The parent ---------------------------------------------------------------------------------

struct Figures {
  uint64_t runs = 0;
  double seconds = 0, p50 = 0, p99 = 0;
  uint64_t wrong = 0;
};

Result<Figures> RunCase(const Config& c, const Case& k) {
  std::vector<std::unique_ptr<ChildProcess>> receivers;
  std::vector<std::pair<std::string, std::string>> endpoints;
  for (int rank = 0; rank < c.tp; ++rank) {
    KV_ASSIGN_OR_RETURN(auto child, ChildProcess::Start([&c, &k, rank](Channel& ch) {
                          return ReceiverMain(ch, c, k, rank);
                        }));
    KV_ASSIGN_OR_RETURN(std::string address, child->channel().Receive(Clock::now() + 120s));
    if (address.starts_with("error ")) return Status::Unavailable("receiver: " + address);
    KV_ASSIGN_OR_RETURN(std::string descriptor, child->channel().Receive(Clock::now() + 60s));
    endpoints.emplace_back(address, descriptor);
    receivers.push_back(std::move(child));
  }
  KV_ASSIGN_OR_RETURN(auto sender,
                      ChildProcess::Start([&c, &k](Channel& ch) { return SenderMain(ch, c, k); }));
  for (auto& [address, descriptor] : endpoints) {
    KV_RETURN_IF_ERROR(sender->channel().Send(address));
    KV_RETURN_IF_ERROR(sender->channel().Send(descriptor));
  }
  KV_ASSIGN_OR_RETURN(std::string report, sender->channel().Receive(Clock::now() + 600s));
  if (report.starts_with("error ")) return Status::Unavailable("sender: " + report.substr(6));
  Figures f;
  if (std::sscanf(report.c_str(), "%lu %lf %lf %lf", &f.runs, &f.seconds, &f.p50, &f.p99) != 4) {
    return Status::Internal("bad report from sender: " + report);
  }
  for (auto& r : receivers) {
    KV_RETURN_IF_ERROR(r->channel().Send("verify"));
    KV_ASSIGN_OR_RETURN(std::string wrong, r->channel().Receive(Clock::now() + 300s));
    f.wrong += std::stoull(wrong);
  }
  (void)sender->channel().Send("done");
  return f;
}

int GpuTransportMain(int argc, char** argv) {
  cli::Flags flags({
      {"transport", "ipc, nccl or all (default all)"},
      {"layout", "LBNHC, BLHNC or all (default all): the same order on both sides"},
      {"tokens", "tokens of the request (default 4096)"},
      {"layers", "layers (default 32)"},
      {"heads", "KV heads of the prefill rank (default 8)"},
      {"head-dim", "head size; K and V are bf16 (default 128)"},
      {"block-size", "tokens per block (default 16)"},
      {"tp", "decode ranks fed by the one prefill rank, all on --dst-device (default 1)"},
      {"iters", "timed whole-request transfers; the median is reported (default 20)"},
      {"requests", "requests of per-layer streaming; p50/p99 reported (default 100)"},
      {"gap-us", "time between two layers' saves in streaming (default 1000)"},
      {"staging", "nccl staging slot size (default 32M; two per direction)"},
      {"ipc-path", "cuda_ipc copy path: auto (the kernels' chooser), kernel or engine"},
      {"src-device", "prefill GPU (default 0)"},
      {"dst-device", "decode GPU (default 1)"},
      {"transport-opt",
       "KEY=VALUE (repeatable): a setting of both transports (kvd --help), e.g. lanes=4", false,
       true},
      {"help", "show this help", true},
  });
  if (Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "kvbench gpu-transport: %s\n", s.ToString().c_str());
    return 2;
  }
  if (flags.has("help")) {
    std::printf(
        "kvbench gpu-transport — a KV request between two GPUs through the cuda_ipc and nccl\n"
        "backends, each beside its ceiling measured in the same run on the same bytes:\n"
        "  ipc  vs one cudaMemcpyPeerAsync of the request's bytes in one piece\n"
        "  nccl vs one ncclSend/ncclRecv of the same bytes in one contiguous buffer\n"
        "The request is planned (random block ids both sides) and posted as one batch; then,\n"
        "per-layer streaming: layers posted --gap-us apart, and the time from the last layer's\n"
        "post to its completion, p50/p99. Receivers check every byte afterwards.\n"
        "Default shape: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, bf16, block 16, 4096\n"
        "tokens = 512 MiB). Needs two GPUs (or --src-device = --dst-device for one).\n\n"
        "flags:\n%s",
        flags.Help().c_str());
    return 0;
  }
  Config c;
  auto get = [&](const char* name, int64_t* out, int64_t min, int64_t max) {
    auto v = flags.integer(name, *out, min, max);
    if (v.ok()) *out = *v;
    return v.status();
  };
  int64_t src = 0, dst = 1;
  for (Status s : {get("tokens", &c.tokens, 1, 1 << 20), get("layers", &c.layers, 1, 1024),
                   get("heads", &c.heads, 1, 1024), get("head-dim", &c.head_dim, 1, 4096),
                   get("block-size", &c.block_size, 1, 4096), get("tp", &c.tp, 1, 8),
                   get("iters", &c.iters, 1, 100000), get("requests", &c.requests, 1, 100000),
                   get("gap-us", &c.gap_us, 0, 1000000), get("src-device", &src, 0, 64),
                   get("dst-device", &dst, 0, 64)}) {
    if (!s.ok()) {
      std::fprintf(stderr, "kvbench gpu-transport: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  auto staging = flags.bytes("staging", c.staging);
  if (!staging.ok() || *staging < 4096) {
    std::fprintf(stderr, "kvbench gpu-transport: --staging must be a size of at least 4K\n");
    return 2;
  }
  c.staging = *staging;
  c.ipc_path = flags.str("ipc-path", "auto");
  auto opts = flags.key_values("transport-opt");
  if (!opts.ok()) {
    std::fprintf(stderr, "kvbench gpu-transport: %s\n", opts.status().message().c_str());
    return 2;
  }
  for (const auto& [key, value] : *opts) {
    if (key == "device" || key == "staging_bytes" || key == "copy_path") {
      std::fprintf(stderr, "kvbench gpu-transport: --transport-opt %s: use its own flag\n",
                   key.c_str());
      return 2;
    }
    c.settings.emplace_back(key, value);
  }
  if (c.ipc_path != "auto" && c.ipc_path != "kernel" && c.ipc_path != "engine") {
    std::fprintf(stderr, "kvbench gpu-transport: --ipc-path is auto, kernel or engine\n");
    return 2;
  }
  c.src_device = static_cast<int>(src);
  c.dst_device = static_cast<int>(dst);
  if (c.heads % c.tp != 0) {
    std::fprintf(stderr, "kvbench gpu-transport: --heads %lld is not divisible by --tp %lld\n",
                 static_cast<long long>(c.heads), static_cast<long long>(c.tp));
    return 2;
  }
  c.cache_blocks = 2 * ((c.tokens + c.block_size - 1) / c.block_size);
  std::vector<std::string> backends, orders;
  const std::string which = flags.str("transport", "all");
  if (which == "ipc" || which == "all") backends.push_back("cuda_ipc");
  if (which == "nccl" || which == "all") backends.push_back("nccl");
  const std::string layout = flags.str("layout", "all");
  if (layout == "LBNHC" || layout == "all") orders.push_back("LBNHC");
  if (layout == "BLHNC" || layout == "all") orders.push_back("BLHNC");
  if (backends.empty() || orders.empty()) {
    std::fprintf(stderr,
                 "kvbench gpu-transport: --transport is ipc|nccl|all, --layout is "
                 "LBNHC|BLHNC|all\n");
    return 2;
  }
  auto plan = PlanFor(c, "LBNHC", -1, 0, -1);
  if (!plan.ok()) {
    std::fprintf(stderr, "kvbench gpu-transport: %s\n", plan.status().ToString().c_str());
    return 2;
  }
  const uint64_t bytes = plan->bytes;
  std::printf(
      "request: %lld layers x %lld KV heads x head_dim %lld bf16, block %lld, %lld tokens"
      " = %.1f MiB; GPU %d -> GPU %d, TP 1 -> %lld\n",
      (long long)c.layers, (long long)c.heads, (long long)c.head_dim, (long long)c.block_size,
      (long long)c.tokens, bytes / 1048576.0, c.src_device, c.dst_device, (long long)c.tp);
  std::printf("cuda_ipc copy path: %s; nccl staging: 2 x %.0f MiB per direction\n",
              c.ipc_path.c_str(), c.staging / 1048576.0);
  std::fprintf(stderr, "[1/%zu] ceilings\n", 1 + backends.size() * orders.size());
  auto baseline =
      ChildProcess::Start([&c, bytes](Channel& ch) { return BaselineMain(ch, c, bytes); });
  double peer_s = 0, nccl_s = 0;
  if (baseline.ok()) {
    auto reply = (*baseline)->channel().Receive(Clock::now() + 300s);
    if (reply.ok()) std::sscanf(reply->c_str(), "%lf %lf", &peer_s, &nccl_s);
  }
  if (peer_s <= 0) {
    std::fprintf(stderr,
                 "kvbench gpu-transport: the ceilings could not be measured (CUDA devices "
                 "%d and %d?)\n",
                 c.src_device, c.dst_device);
    return 1;
  }
  auto gbs = [&](double s) { return s > 0 ? bytes / s / 1e9 : 0.0; };
  std::printf("ceiling cudaMemcpyPeerAsync, one piece : %8.3f ms %7.1f GB/s\n", peer_s * 1e3,
              gbs(peer_s));
  std::printf("ceiling ncclSend/ncclRecv, one buffer : %8.3f ms %7.1f GB/s\n", nccl_s * 1e3,
              gbs(nccl_s));
  std::printf("\n%-9s %-6s %6s %9s %8s %8s %6s  %s\n", "transport", "layout", "runs", "ms", "GB/s",
              "ceiling", "ratio", "streaming: last layer saved -> in place");
  int step = 2, status = 0;
  for (const std::string& backend : backends) {
    for (const std::string& order : orders) {
      std::fprintf(stderr, "[%d/%zu] %s %s\n", step++, 1 + backends.size() * orders.size(),
                   backend.c_str(), order.c_str());
      auto f = RunCase(c, {backend, order});
      if (!f.ok()) {
        std::printf("%-9s %-6s failed: %s\n", backend.c_str(), order.c_str(),
                    f.status().ToString().c_str());
        status = 1;
        continue;
      }
      const double ceiling = backend == "nccl" ? nccl_s : peer_s;
      std::printf(
          "%-9s %-6s %6lu %9.3f %8.1f %8.1f %6.2f  p50 %.0f us, p99 %.0f us (%lld req, "
          "gap %lld us)%s\n",
          backend.c_str(), order.c_str(), f->runs, f->seconds * 1e3, gbs(f->seconds), gbs(ceiling),
          f->seconds > 0 ? ceiling / f->seconds : 0, f->p50 * 1e6, f->p99 * 1e6,
          (long long)c.requests, (long long)c.gap_us,
          f->wrong ? "  BYTES WRONG" : "  bytes verified");
      if (f->wrong) status = 1;
    }
  }
  return status;
}

const bool registered = cli::Register(
    {"gpu-transport", "cuda_ipc and nccl moving a KV request between GPUs vs their ceilings",
     &GpuTransportMain});

}  // namespace
}  // namespace kv::bench
