// kvbench staged: put bandwidth of GPU regions through "ucx" where UCX has no CUDA support (the
// staged decorator: gather into pinned slots, UCX host to host, scatter), beside its ceiling
// measured in the same run: the same runs through UCX host to host, plus one device→host and
// one host→device copy of the same bytes (cudaMemcpyAsync, pinned). Two processes on one GPU.
//
// The target is forked before this process initialises CUDA or UCX. The runs are pages of
// --size bytes (64 KiB: one layer of one 16-token block of Llama-3-8B, 8 KV heads × 128 × 2
// × bf16) to shuffled destination pages, so a 512 MiB request is 8192 runs. Both processes
// derive the same runs from the same flags; the target verifies every byte at the end.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tools/common/cli.h"
#include "tools/testing/child_process.h"
#include "transport/transport.h"

namespace kv::bench {
namespace {

using kv::harness::Channel;
using kv::harness::ChildProcess;
using transport::Clock;
using transport::Transport;
using namespace std::chrono_literals;

struct Config {
  uint64_t slot_bytes = 16 << 20;  // the decorator's default
  uint64_t size = 0;
  int64_t runs = 0;
  int64_t rounds = 0;
  transport::TransportOptions options;
};

uint8_t Pattern(uint64_t i) {
  return static_cast<uint8_t>((i * 2654435761u + 9) >> 7);
}

std::vector<Run> Runs(const Config& c) {
  std::vector<uint64_t> pages(c.runs);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(42));
  std::vector<Run> runs;
  for (int64_t i = 0; i < c.runs; ++i) runs.push_back({i * c.size, pages[i] * c.size, c.size});
  return runs;
}

int Fail(const std::string& m) {
  std::fprintf(stderr, "kvbench staged: %s\n", m.c_str());
  return 1;
}

// Device memory of the whole request, and host memory from the transport for the ceiling.
struct Memory {
  void* device = nullptr;
  std::unique_ptr<transport::MemoryRegistration> cuda;
  std::unique_ptr<transport::MemoryRegistration> host;
  ~Memory() {
    cuda.reset();
    if (device != nullptr) cudaFree(device);
  }
};

Status Prepare(Transport& t, uint64_t bytes, Memory& m) {
  if (cudaMalloc(&m.device, bytes) != cudaSuccess) return Status::IoError("cudaMalloc failed");
  KV_ASSIGN_OR_RETURN(m.cuda, t.register_memory(m.device, bytes, MemoryLocation::Cuda(0)));
  auto host = t.allocate_memory(bytes, MemoryLocation::Host());
  if (!host.ok()) return host.status();
  m.host = std::move(*host);
  return Status::Ok();
}

int TargetMain(Channel& channel, const Config& c) {
  const uint64_t bytes = c.size * c.runs;
  auto t = transport::CreateTransport("ucx", c.options);
  if (!t.ok()) return 2;
  Memory m;
  if (!Prepare(**t, bytes, m).ok()) return 3;
  if (cudaMemset(m.device, 0, bytes) != cudaSuccess) return 3;
  if (!channel.Send((*t)->address()).ok() || !channel.Send(m.cuda->packed_descriptor()).ok() ||
      !channel.Send(m.host->packed_descriptor()).ok())
    return 4;
  auto verify = channel.Receive(Clock::now() + 24h);
  if (!verify.ok() || *verify != "verify") return 0;
  std::vector<uint8_t> got(bytes);
  if (cudaMemcpy(got.data(), m.device, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return 5;
  uint64_t wrong = 0;
  for (const Run& r : Runs(c)) {
    for (uint64_t i = 0; i < r.length; ++i)
      wrong += got[r.dst_offset + i] != Pattern(r.src_offset + i);
  }
  (void)channel.Send(std::to_string(wrong));
  (void)channel.Receive(Clock::now() + 60s);
  return 0;
}

Result<double> TimedPut(Transport& t, const transport::MemoryRegistration& src,
                        const transport::RemoteMemory& dst, const std::vector<Run>& runs) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  const auto start = Clock::now();
  KV_RETURN_IF_ERROR(t.post({transport::Op::kPut, &src, &dst, runs, Clock::now() + 60s},
                            [promise](Status s) { promise->set_value(s); }));
  if (future.wait_for(90s) != std::future_status::ready) return Status::Timeout("no completion");
  KV_RETURN_IF_ERROR(future.get());
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Result<double> TimedCopy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind,
                         cudaStream_t stream) {
  const auto start = Clock::now();
  if (cudaMemcpyAsync(dst, src, bytes, kind, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return Status::IoError("cudaMemcpyAsync failed");
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Bench(const Config& c) {
  const uint64_t bytes = c.size * c.runs;
  auto child = ChildProcess::Start([&](Channel& channel) { return TargetMain(channel, c); });
  if (!child.ok()) return Fail(child.status().ToString());
  Channel& channel = (*child)->channel();
  auto address = channel.Receive(Clock::now() + 60s);
  auto cuda_desc = address.ok() ? channel.Receive(Clock::now() + 60s) : address;
  auto host_desc = cuda_desc.ok() ? channel.Receive(Clock::now() + 60s) : cuda_desc;
  if (!host_desc.ok()) return Fail("target: " + host_desc.status().ToString());

  auto t = transport::CreateTransport("ucx", c.options);
  if (!t.ok()) return Fail(t.status().ToString());
  Memory m;
  if (Status s = Prepare(**t, bytes, m); !s.ok()) return Fail(s.ToString());
  std::vector<uint8_t> fill(bytes);
  for (uint64_t i = 0; i < bytes; ++i) fill[i] = Pattern(i);
  std::memcpy(m.host->base(), fill.data(), bytes);
  if (cudaMemcpy(m.device, fill.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    return Fail("cudaMemcpy failed");
  void* pinned = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return Fail("cudaHostAlloc failed");

  auto peer = (*t)->connect(*address);
  if (!peer.ok()) return Fail(peer.status().ToString());
  auto cuda_remote = (*t)->import_remote(*peer, *cuda_desc);
  auto host_remote = (*t)->import_remote(*peer, *host_desc);
  if (!cuda_remote.ok() || !host_remote.ok()) return Fail("import_remote failed");
  const std::vector<Run> runs = Runs(c);
  // The wire pattern of staging: the same bytes in slot-sized contiguous puts.
  std::vector<Run> slabs;
  for (uint64_t at = 0; at < bytes; at += c.slot_bytes)
    slabs.push_back({at, at, std::min(c.slot_bytes, bytes - at)});

  std::vector<double> staged, host, slab, d2h, h2d;
  for (int64_t round = 0; round <= c.rounds; ++round) {  // round 0 warms up
    auto s = TimedPut(**t, *m.cuda, **cuda_remote, runs);
    auto h = TimedPut(**t, *m.host, **host_remote, runs);
    auto sl = TimedPut(**t, *m.host, **host_remote, slabs);
    auto down = TimedCopy(pinned, m.device, bytes, cudaMemcpyDeviceToHost, stream);
    auto up = TimedCopy(m.device, pinned, bytes, cudaMemcpyHostToDevice, stream);
    for (const Status& st : {s.status(), h.status(), sl.status(), down.status(), up.status()}) {
      if (!st.ok()) return Fail(st.ToString());
    }
    if (round == 0) continue;
    staged.push_back(bytes / *s / 1e9);
    host.push_back(bytes / *h / 1e9);
    slab.push_back(bytes / *sl / 1e9);
    d2h.push_back(bytes / *down / 1e9);
    h2d.push_back(bytes / *up / 1e9);
    std::fprintf(stderr, "round %lld: staged %.2f GB/s, ucx host %.2f, d2h %.2f, h2d %.2f\n",
                 static_cast<long long>(round), staged.back(), host.back(), d2h.back(), h2d.back());
  }
  if (!channel.Send("verify").ok()) return Fail("target gone");
  auto wrong = channel.Receive(Clock::now() + 120s);
  (void)channel.Send("quit");
  (void)(*child)->Wait(Clock::now() + 30s);
  cuda_remote->reset();
  host_remote->reset();
  cudaFreeHost(pinned);
  cudaStreamDestroy(stream);

  const double gbps = Median(staged), hgbps = Median(host), sgbps = Median(slab),
               down = Median(d2h), up = Median(h2d);
  // The ceiling takes the faster of the two host-to-host patterns.
  const double wire = std::max(hgbps, sgbps);
  const double serial = 1 / (1 / wire + 1 / down + 1 / up);
  const double pipelined = std::min({wire, down, up});
  std::printf(
      "staged put, GPU to GPU through ucx, %llu B x %lld runs (%.0f MiB), shuffled pages, "
      "median of %lld rounds\n",
      static_cast<unsigned long long>(c.size), static_cast<long long>(c.runs), bytes / 1048576.0,
      static_cast<long long>(c.rounds));
  std::printf("  staged                 %8.2f GB/s   bytes wrong at the target: %s\n", gbps,
              wrong.ok() ? wrong->c_str() : wrong.status().ToString().c_str());
  std::printf("  ucx host to host       %8.2f GB/s   (same runs, transport-allocated memory)\n",
              hgbps);
  std::printf("  ucx host to host       %8.2f GB/s   (same bytes in %llu-byte slabs)\n", sgbps,
              static_cast<unsigned long long>(c.slot_bytes));
  std::printf("  device to host         %8.2f GB/s   host to device %8.2f GB/s (one copy each)\n",
              down, up);
  std::printf("  ceiling, serial        %8.2f GB/s   (host + d2h + h2d back to back)  ratio %.3f\n",
              serial, gbps / serial);
  std::printf("  ceiling, pipelined     %8.2f GB/s   (the slowest of the three)      ratio %.3f\n",
              pipelined, gbps / pipelined);
  return wrong.ok() && *wrong == "0" ? 0 : 1;
}

int StagedMain(int argc, char** argv) {
  cli::Flags flags({
      {"size", "bytes per run (default 64K: one Llama-3-8B page of one layer)"},
      {"runs", "runs per request (default 8192: 512 MiB)"},
      {"rounds", "measured rounds; the median is reported (default 5)"},
      {"staging-bytes", "the decorator's slot size (default: its own, 16M)"},
      {"staging-slots", "slots per link (default: its own, 4)"},
      {"tls", "UCX_TLS (default: UCX's choice)"},
      {"transport-opt", "KEY=VALUE (repeatable): a setting of the ucx transport (kvd --help)",
       false, true},
      {"help", "this text", true},
  });
  Status parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) return Fail(parsed.message() + " (--help lists the flags)");
  if (flags.has("help")) {
    std::printf(
        "kvbench staged: GPU regions through ucx and pinned host staging, vs its ceiling\n"
        "\n  kvbench staged --size 64K --runs 8192 --rounds 5\n\nflags:\n%s",
        flags.Help().c_str());
    return 0;
  }
  Config c;
  auto size = flags.bytes("size", 64 << 10);
  auto runs = flags.integer("runs", 8192, 1, 1 << 24);
  auto rounds = flags.integer("rounds", 5, 1, 100);
  for (const Status& s : {size.status(), runs.status(), rounds.status()}) {
    if (!s.ok()) return Fail(s.message());
  }
  if (*size == 0 || *size * *runs > (8ull << 30)) return Fail("--size x --runs must be in (0, 8G]");
  c.size = *size;
  c.runs = *runs;
  c.rounds = *rounds;
  auto slot = flags.bytes("staging-bytes", 0);
  auto slots = flags.integer("staging-slots", 0, 0, 64);
  if (!slot.ok() || !slots.ok()) return Fail("--staging-bytes and --staging-slots: numbers");
  if (*slot != 0) {
    c.slot_bytes = *slot;
    c.options.settings.push_back({"staging_bytes", std::to_string(*slot)});
  }
  if (*slots != 0) c.options.settings.push_back({"staging_slots", std::to_string(*slots)});
  if (flags.has("tls")) c.options.settings.push_back({"UCX_TLS", flags.str("tls")});
  auto opts = flags.key_values("transport-opt");
  if (!opts.ok()) return Fail(opts.status().message());
  c.options.settings.insert(c.options.settings.end(), opts->begin(), opts->end());
  if (Status s = transport::CheckSettings("ucx", c.options); !s.ok()) return Fail(s.message());
  return Bench(c);
}

const bool registered = cli::Register(
    {"staged", "GPU regions through ucx and pinned host staging vs its ceiling", &StagedMain});

}  // namespace
}  // namespace kv::bench
