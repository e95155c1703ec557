// kvbench transport: put bandwidth of a Transport between two processes on loopback, beside
// ucx_perftest's put bandwidth for the same message size, measured alternately in one run.
//
// The target process is forked before this process initialises UCX; it registers its memory,
// hands over its address and descriptor on a socketpair and waits. The initiator keeps a window
// of batches in flight, each of --runs-per-batch runs of --size bytes to distinct offsets; with
// --footprint, successive batches move on through a buffer of that size, so that the bytes come
// from and go to memory the caches do not hold, as when kvd moves a wave of distinct KV pages.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tools/common/cli.h"
#include "tools/kvbench/transport_perftest.h"
#include "tools/testing/child_process.h"
#include "transport/transport.h"

namespace kv::bench {
namespace {

using kv::harness::Channel;
using kv::harness::ChildProcess;
using transport::Clock;
using transport::Transport;
using transport::TransportOptions;
using namespace std::chrono_literals;

constexpr auto kBatchDeadline = 30s;

struct Config {
  std::string backend;
  uint64_t size = 0;
  int64_t iters = 0;
  int64_t runs_per_batch = 1;
  int64_t window = 0;
  int64_t rounds = 0;
  uint64_t footprint = 0;  // bytes of each side's buffer: a whole number of batches
  bool ceiling = true;
  bool transport_memory = true;
  bool same_offset = false;  // every run to offset 0, as ucx_perftest does: cache-resident  //
                             // allocate_memory() where the backend has it, as ucx_perftest
  bool json = false;
  // --both-paths: a second initiator whose host batches all go staged (gather, one put,
  // scatter), measured in the same rounds; the first then puts every run directly.
  bool both_paths = false;
  TransportOptions options;
  std::vector<std::pair<std::string, std::string>> env;  // the same settings, for ucx_perftest
};

// Memory for one side: from the transport's allocator when asked and available (what
// ucx_perftest measures with), else a plain vector registered with the transport.
struct Buffer {
  std::vector<char> owned;
  std::unique_ptr<transport::MemoryRegistration> registration;
};

Result<Buffer> MakeBuffer(Transport& t, uint64_t bytes, bool transport_memory, char fill) {
  Buffer b;
  if (transport_memory) {
    auto allocated = t.allocate_memory(bytes, MemoryLocation::Host());
    if (allocated.ok()) {
      b.registration = std::move(*allocated);
      std::memset(b.registration->base(), fill, bytes);
      return b;
    }
    if (allocated.status().code() != Code::kUnsupported) return allocated.status();
  }
  b.owned.assign(bytes, fill);
  KV_ASSIGN_OR_RETURN(b.registration,
                      t.register_memory(b.owned.data(), bytes, MemoryLocation::Host()));
  return b;
}

int TargetMain(Channel& channel, const Config& config) {
  auto t = transport::CreateTransport(config.backend, config.options);
  if (!t.ok()) {
    std::fprintf(stderr, "kvbench transport (target): %s\n", t.status().ToString().c_str());
    return 2;
  }
  auto memory = MakeBuffer(**t, config.footprint, config.transport_memory, 0);
  if (!memory.ok()) {
    std::fprintf(stderr, "kvbench transport (target): %s\n", memory.status().ToString().c_str());
    return 3;
  }
  if (!channel.Send((*t)->address()).ok() ||
      !channel.Send(memory->registration->packed_descriptor()).ok())
    return 4;
  // The initiator says "quit" when done; a vanished initiator ends the wait too.
  (void)channel.Receive(Clock::now() + 24h);
  return 0;
}

// Completions arrive on the transport's thread; the poster waits here for window space.
//
// The poster counts what it posted, the transport's thread what completed, each on its own cache
// line, and the poster reads the completed count only when its last reading says it must wait:
// a count both threads wrote on every batch moved between the cores twice per batch.
//
// A full window is waited out until half of it drained: under a real-time policy (`chrt -f`, how
// the benchmark runs on a shared host) spinning first (kPureSpin flat out, with a look at the
// count every few hundred cycles, then yielding the core between looks up to kSpin: a spinner
// sharing the transport thread's core would hold it), then asleep. A sleep alone cost more than
// it saved: with 32 batches of 64 KiB in flight the poster slept until 16 were left, and on the
// VM its wake-up took longer than the transport needed for those 16, so the transport ran dry
// every 16 batches (issue 24). Without a real-time policy the poster only sleeps: sharing the
// cores with other work, a spinning poster took CPU time from the transport's thread (64 KiB,
// load 3: 2.6 us a batch spinning against 1.3-1.4 asleep). The completion takes a lock only to
// wake a sleeping poster or to keep an error.
class InFlight {
 public:
  static constexpr auto kPureSpin = std::chrono::microseconds(5);
  static constexpr auto kSpin = std::chrono::microseconds(50);

  InFlight() : spin_(Spins()) {}
  // Whether a poster on this thread spins for room (a real-time policy).
  static bool Spins() {
    const int policy = ::sched_getscheduler(0);
    return policy == SCHED_FIFO || policy == SCHED_RR;
  }

  transport::Completion Slot() {
    ++posted_;
    return [this](Status s) {
      const int64_t completed = completed_.value.fetch_add(1) + 1;
      if (!s.ok()) {
        std::lock_guard lock(mu_);
        if (error_.ok()) error_ = s;
        failed_.store(true);
        cv_.notify_one();
      } else if (completed >= wake_at_.value.load()) {
        std::lock_guard lock(mu_);  // the poster is between its check and its sleep, or asleep
        cv_.notify_one();
      }
    };
  }
  // Whether more than `level` batches are in flight; reads the completed count only when the
  // last reading says so.
  bool Above(int64_t level) {
    if (posted_ - seen_ <= level) return false;
    seen_ = completed_.value.load();
    return posted_ - seen_ > level;
  }
  // Waits until at most `level` are in flight, spinning for at most kSpin, then asleep; kTimeout
  // past the deadline, or the first error.
  Status WaitForRoom(int64_t level, Clock::time_point deadline) {
    if (!spin_) return WaitFor(level, deadline);
    const auto start = Clock::now();
    bool yielding = false;
    for (uint32_t turn = 1; Above(level); ++turn) {
      if (yielding) {
        std::this_thread::yield();
      } else {
        for (int i = 0; i < 32; ++i) CpuRelax();
      }
      if (turn % 4 != 0) continue;
      const auto spun = Clock::now() - start;
      if (spun > kSpin) return WaitFor(level, deadline);
      yielding = spun > kPureSpin;
    }
    if (!failed_.load()) return Status::Ok();
    std::lock_guard lock(mu_);
    return error_;
  }
  // Waits asleep until at most `level` are in flight; kTimeout past the deadline, or the first
  // error.
  Status WaitFor(int64_t level, Clock::time_point deadline) {
    wake_at_.value.store(posted_ - level);
    std::unique_lock lock(mu_);
    bool done = cv_.wait_until(
        lock, deadline, [&] { return posted_ - completed_.value.load() <= level || !error_.ok(); });
    wake_at_.value.store(kNever);
    seen_ = completed_.value.load();
    if (!done) return Status::Timeout("batches did not complete within their deadline");
    return error_;
  }
  // A slot taken for a batch that was not posted after all.
  void Unslot() { --posted_; }

 private:
  static constexpr int64_t kNever = INT64_MAX;
  static void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  struct alignas(64) Counter {
    std::atomic<int64_t> value;
  };
  int64_t posted_ = 0;  // the poster's
  int64_t seen_ = 0;    // the poster's last reading of completed_
  Counter completed_{0};
  Counter wake_at_{kNever};          // the completed count the sleeping poster waits for
  std::atomic<bool> failed_{false};  // error_ is set
  const bool spin_;                  // the poster runs under a real-time policy
  std::mutex mu_;
  std::condition_variable cv_;
  Status error_;  // guarded by mu_
};

// Seconds for config.iters batches.
Result<double> MeasureOnce(Transport& t, const transport::MemoryRegistration& src,
                           const transport::RemoteMemory& remote, const std::vector<Run>& runs,
                           const Config& config, int64_t iters) {
  InFlight in_flight;
  const uint64_t batch_bytes = config.size * config.runs_per_batch;
  const uint64_t slots = config.footprint / batch_bytes;
  std::vector<Run> moved = runs;
  auto start = Clock::now();
  auto reported = start;
  for (int64_t i = 0; i < iters; ++i) {
    if (i % 256 == 255 && Clock::now() - reported > 1s) {
      reported = Clock::now();
      std::fprintf(stderr, "  %lld/%lld batches posted\n", static_cast<long long>(i),
                   static_cast<long long>(iters));
    }
    if (in_flight.Above(config.window - 1)) {
      KV_RETURN_IF_ERROR(in_flight.WaitForRoom(config.window / 2, Clock::now() + kBatchDeadline));
    }
    const uint64_t shift = (i % slots) * batch_bytes;
    for (size_t r = 0; r < runs.size(); ++r) {
      moved[r].src_offset = runs[r].src_offset + shift;
      moved[r].dst_offset = runs[r].dst_offset + shift;
    }
    transport::Batch batch{transport::Op::kPut, &src, &remote, moved,
                           Clock::now() + kBatchDeadline};
    transport::Completion done = in_flight.Slot();
    Status posted = t.post(batch, std::move(done));
    if (!posted.ok()) {
      in_flight.Unslot();  // post() rejected the batch: `done` never runs
      return posted;
    }
  }
  KV_RETURN_IF_ERROR(in_flight.WaitFor(0, Clock::now() + kBatchDeadline));
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Seconds for `iters` batches copied with memcpy on this thread, from `src` to `dst` (each of
// config.footprint bytes), at the offsets MeasureOnce puts them: what a put over shared memory
// does (UCX copies into its mapping of the target's segment), with no transport around it. Unlike
// ucx_perftest, which puts every message to the same cache-resident buffer, it follows
// --footprint, so it is the like-for-like ceiling when the batches move through more memory than
// the caches hold.
double MeasureCopy(const char* src, char* dst, const std::vector<Run>& runs, const Config& config,
                   int64_t iters) {
  const uint64_t batch_bytes = config.size * config.runs_per_batch;
  const uint64_t slots = config.footprint / batch_bytes;
  auto start = Clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    const uint64_t shift = (i % slots) * batch_bytes;
    for (const Run& run : runs)
      std::memcpy(dst + run.dst_offset + shift, src + run.src_offset + shift, run.length);
  }
  // The copies must not be optimised away.
  asm volatile("" : : "r"(dst) : "memory");
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvbench transport: %s\n", message.c_str());
  return 1;
}

int Bench(const Config& config) {
  auto child = ChildProcess::Start([&](Channel& channel) { return TargetMain(channel, config); });
  if (!child.ok()) return Fail(child.status().ToString());
  auto address = (*child)->channel().Receive(Clock::now() + 30s);
  auto descriptor = address.ok() ? (*child)->channel().Receive(Clock::now() + 30s) : address;
  if (!descriptor.ok()) return Fail("target process: " + descriptor.status().ToString());

  // One initiator: its transport, memory and the target's, imported (destroyed in reverse).
  struct Initiator {
    std::unique_ptr<Transport> t;
    Buffer memory;
    std::unique_ptr<transport::RemoteMemory> remote;
  };
  auto open = [&](const TransportOptions& options) -> Result<Initiator> {
    Initiator side;
    KV_ASSIGN_OR_RETURN(side.t, transport::CreateTransport(config.backend, options));
    KV_ASSIGN_OR_RETURN(side.memory,
                        MakeBuffer(*side.t, config.footprint, config.transport_memory, 1));
    KV_ASSIGN_OR_RETURN(transport::PeerId peer, side.t->connect(*address));
    KV_ASSIGN_OR_RETURN(side.remote, side.t->import_remote(peer, *descriptor));
    return side;
  };
  TransportOptions direct_options = config.options, staged_options = config.options;
  if (config.both_paths) {
    direct_options.settings.push_back({"stage_runs_below", "0"});
    staged_options.settings.push_back({"stage_runs_below", std::to_string(1ull << 30)});
  }
  auto first = open(direct_options);
  if (!first.ok()) return Fail(first.status().ToString());
  Transport* t = first->t.get();
  const transport::MemoryRegistration& src = *first->memory.registration;
  const transport::RemoteMemory* remote = first->remote.get();
  Result<Initiator> second = Status::Unsupported("one path");
  if (config.both_paths) {
    second = open(staged_options);
    if (!second.ok()) return Fail(second.status().ToString());
  }

  std::vector<Run> runs;
  for (int64_t i = 0; i < config.runs_per_batch; ++i) {
    const uint64_t offset = config.same_offset ? 0 : i * config.size;
    runs.push_back({offset, offset, config.size});
  }
  const uint64_t batch_bytes = config.size * config.runs_per_batch;
  const uint64_t messages = config.iters * config.runs_per_batch;

  // Warm-up: wire-up, registration caches, page faults.
  const int64_t warm_iters = std::min<int64_t>(config.iters, 100);
  auto warm = MeasureOnce(*t, src, *remote, runs, config, warm_iters);
  if (warm.ok() && second.ok())
    warm = MeasureOnce(*second->t, *second->memory.registration, *second->remote, runs, config,
                       warm_iters);
  if (!warm.ok()) return Fail(warm.status().ToString());
  // The copy ceiling's destination: memory of the kind the target's is, in this process.
  auto copy_dst = MakeBuffer(*t, config.footprint, config.transport_memory, 0);
  if (!copy_dst.ok()) return Fail(copy_dst.status().ToString());
  const char* copy_from = static_cast<const char*>(src.base());
  char* copy_to = static_cast<char*>(copy_dst->registration->base());
  (void)MeasureCopy(copy_from, copy_to, runs, config, warm_iters);

  std::vector<double> ours, staged, ceiling, ceiling_us, copied;
  for (int64_t round = 1; round <= config.rounds; ++round) {
    auto seconds = MeasureOnce(*t, src, *remote, runs, config, config.iters);
    if (!seconds.ok()) return Fail(seconds.status().ToString());
    ours.push_back(batch_bytes * config.iters / *seconds / 1e9);
    std::string line = "round " + std::to_string(round) + "/" + std::to_string(config.rounds) +
                       ": kvd " + std::to_string(ours.back()) + " GB/s";
    if (second.ok()) {
      auto other = MeasureOnce(*second->t, *second->memory.registration, *second->remote, runs,
                               config, config.iters);
      if (!other.ok()) return Fail(other.status().ToString());
      staged.push_back(batch_bytes * config.iters / *other / 1e9);
      line += " direct, " + std::to_string(staged.back()) + " GB/s staged";
    }
    if (config.ceiling) {
      auto perf = RunUcxPerftest(config.size, messages, config.env, 120);
      if (!perf.ok()) return Fail(perf.status().ToString() + " (--no-ceiling skips it)");
      ceiling.push_back(perf->gbps);
      ceiling_us.push_back(perf->usec_per_message);
      line += ", ucx_perftest " + std::to_string(perf->gbps) + " GB/s";
    }
    copied.push_back(batch_bytes * config.iters /
                     MeasureCopy(copy_from, copy_to, runs, config, config.iters) / 1e9);
    line += ", memcpy " + std::to_string(copied.back()) + " GB/s";
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  (void)(*child)->channel().Send("quit");
  (void)(*child)->Wait(Clock::now() + 10s);
  copy_dst->registration.reset();
  first->remote.reset();
  first->memory.registration.reset();
  if (second.ok()) {
    second->remote.reset();
    second->memory.registration.reset();
  }

  const double gbps = Median(ours);
  const double per_run_us = batch_bytes * config.iters / (gbps * 1e9) / messages * 1e6;
  const double ceiling_gbps = config.ceiling ? Median(ceiling) : 0;
  const double ceiling_per_message = config.ceiling ? Median(ceiling_us) : 0;
  const double staged_gbps = staged.empty() ? 0 : Median(staged);
  const double copy_gbps = Median(copied);
  if (config.json) {
    std::printf(
        "{\"gbps\": %.3f, \"size\": %llu, \"iters\": %lld, \"runs_per_batch\": %lld, "
        "\"per_run_us\": %.3f, \"ceiling_gbps\": %.3f, \"ceiling_per_message_us\": %.3f, "
        "\"ratio\": %.3f, \"staged_gbps\": %.3f, \"staged_ratio\": %.3f, \"footprint\": %llu, "
        "\"copy_gbps\": %.3f, \"copy_ratio\": %.3f}\n",
        gbps, static_cast<unsigned long long>(config.size), static_cast<long long>(config.iters),
        static_cast<long long>(config.runs_per_batch), per_run_us, ceiling_gbps,
        ceiling_per_message, config.ceiling ? gbps / ceiling_gbps : 0.0, staged_gbps,
        config.ceiling ? staged_gbps / ceiling_gbps : 0.0,
        static_cast<unsigned long long>(config.footprint), copy_gbps, gbps / copy_gbps);
    return 0;
  }
  std::printf(
      "transport %s, put, %llu B x %lld runs per batch%s, %lld batches, window %lld (poster "
      "%s), %s memory (%llu B footprint), median of %lld rounds\n",
      config.backend.c_str(), static_cast<unsigned long long>(config.size),
      static_cast<long long>(config.runs_per_batch), config.same_offset ? " (all at offset 0)" : "",
      static_cast<long long>(config.iters), static_cast<long long>(config.window),
      InFlight::Spins() ? "spins, then sleeps" : "sleeps",
      config.transport_memory ? "transport-allocated" : "heap",
      static_cast<unsigned long long>(config.footprint), static_cast<long long>(config.rounds));
  std::printf("  kvd          %8.3f GB/s   %8.3f us per run%s\n", gbps, per_run_us,
              config.both_paths ? "   (direct: one put per run)" : "");
  if (config.both_paths) {
    std::printf("  kvd staged   %8.3f GB/s   %8.3f us per run   (gather -> one put -> scatter)\n",
                staged_gbps, batch_bytes * config.iters / (staged_gbps * 1e9) / messages * 1e6);
  }
  if (config.both_paths && config.ceiling) {
    std::printf("  staged ratio %8.3f\n", staged_gbps / ceiling_gbps);
  }
  if (config.ceiling) {
    std::printf("  ucx_perftest %8.3f GB/s   %8.3f us per message  (ucp_put_bw, same size)\n",
                ceiling_gbps, ceiling_per_message);
    std::printf("  ratio        %8.3f      per-run overhead %+.3f us\n", gbps / ceiling_gbps,
                per_run_us - ceiling_per_message);
  }
  // ucx_perftest puts every message to one cache-resident buffer; memcpy follows --footprint.
  const double copy_us = batch_bytes * config.iters / (copy_gbps * 1e9) / messages * 1e6;
  std::printf(
      "  memcpy       %8.3f GB/s   %8.3f us per run      (same runs and footprint, one "
      "thread)\n",
      copy_gbps, copy_us);
  std::printf("  copy ratio   %8.3f      per-run overhead %+.3f us\n", gbps / copy_gbps,
              per_run_us - copy_us);
  return 0;
}

int TransportMain(int argc, char** argv) {
  cli::Flags flags({
      {"backend", "transport backend: ucx (default)"},
      {"memory", "where the buffers live: host (default); cuda needs a CUDA-aware backend"},
      {"size", "bytes per run, e.g. 4096, 64K, 4M (default 64K)"},
      {"iters", "batches per round (default 1000)"},
      {"runs-per-batch", "runs in each batch, each to its own offset (default 1)"},
      {"window", "batches kept in flight (default 32)"},
      {"rounds", "measurements of each side, alternating; the median is reported (default 3)"},
      {"tls", "UCX_TLS for both kvd and ucx_perftest, e.g. tcp (default: UCX's choice)"},
      {"transport-opt",
       "KEY=VALUE (repeatable): a setting of the transport (keys: kvd --help); UCX_* ones reach "
       "ucx_perftest's environment too",
       false, true},
      {"user-memory", "register plain heap memory instead of the transport's own allocation", true},
      {"footprint",
       "bytes each side's batches cycle through, e.g. 256M (default: one batch): larger than "
       "the CPU caches, it measures memory bandwidth as kvd moving distinct pages sees it"},
      {"same-offset",
       "every run to offset 0, as ucx_perftest does (isolates per-run software "
       "cost from memory bandwidth)",
       true},
      {"no-ceiling", "skip ucx_perftest (the memcpy ceiling still runs)", true},
      {"both-paths",
       "with --user-memory: measure the ucx chooser's two host paths in the same rounds, one put "
       "per run (direct) and gather -> one put -> scatter (staged), beside ucx_perftest",
       true},
      {"json", "print one JSON object instead of the table", true},
      {"help", "this text", true},
  });
  Status parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) return Fail(parsed.message() + " (--help lists the flags)");
  if (flags.has("help")) {
    std::printf(
        "kvbench transport: put bandwidth between two processes on loopback, beside its ceiling.\n"
        "\n"
        "kvbench starts the target process itself. Each round posts --iters batches of\n"
        "--runs-per-batch puts of --size bytes (a window of them in flight), then runs\n"
        "`ucx_perftest -t ucp_put_bw` with the same size and message count, then one thread\n"
        "memcpy'ing the same runs over the same footprint; the three alternate and the medians\n"
        "are compared. ucx_perftest always copies one cache-resident buffer: with a --footprint\n"
        "larger than the caches, the memcpy ratio is the fair one. Small --size with many\n"
        "--runs-per-batch shows the per-run overhead.\n\n"
        "  kvbench transport --backend ucx --memory host --size 4M --iters 200\n"
        "  kvbench transport --size 4K --runs-per-batch 1000 --iters 50 --json\n"
        "  kvbench transport --user-memory --both-paths --size 512 --runs-per-batch 2048 "
        "--footprint 64M --iters 50\n\nflags:\n%s",
        flags.Help().c_str());
    return 0;
  }
  Config c;
  c.backend = flags.str("backend", "ucx");
  if (c.backend != "ucx")
    return Fail("--backend " + c.backend + ": only ucx moves bytes between processes here");
  std::string memory = flags.str("memory", "host");
  if (memory != "host")
    return Fail("--memory " + memory +
                ": this command measures host memory; `kvbench staged` "
                "measures GPU regions through ucx");
  auto size = flags.bytes("size", 64 << 10);
  auto iters = flags.integer("iters", 1000, 1, 100'000'000);
  auto runs = flags.integer("runs-per-batch", 1, 1, 1'000'000);
  auto window = flags.integer("window", 32, 1, 4096);
  auto rounds = flags.integer("rounds", 3, 1, 100);
  auto footprint = flags.bytes("footprint", 0);
  for (const Status& s : {size.status(), iters.status(), runs.status(), window.status(),
                          rounds.status(), footprint.status()}) {
    if (!s.ok()) return Fail(s.message());
  }
  if (*size == 0 || *size > (1ull << 30)) return Fail("--size must be in [1, 1G]");
  if (*size * *runs > (4ull << 30)) return Fail("--size x --runs-per-batch must stay within 4G");
  if (*footprint > (4ull << 30)) return Fail("--footprint must stay within 4G");
  if (flags.has("same-offset") && *footprint > 0)
    return Fail("--same-offset and --footprint contradict each other");
  // Whole batches: the last one must not run past the buffer.
  const uint64_t batch_bytes = *size * *runs;
  c.footprint = std::max<uint64_t>(1, *footprint / batch_bytes) * batch_bytes;
  c.size = *size;
  c.iters = *iters;
  c.runs_per_batch = *runs;
  c.window = *window;
  c.rounds = *rounds;
  c.ceiling = !flags.has("no-ceiling");
  c.transport_memory = !flags.has("user-memory");
  c.same_offset = flags.has("same-offset");
  c.json = flags.has("json");
  c.both_paths = flags.has("both-paths");
  if (c.both_paths && c.transport_memory)
    return Fail("--both-paths needs --user-memory: memory the transport allocated goes direct");
  if (flags.has("tls")) {
    c.options.settings.push_back({"UCX_TLS", flags.str("tls")});
    c.env.push_back({"UCX_TLS", flags.str("tls")});
  }
  auto opts = flags.key_values("transport-opt");
  if (!opts.ok()) return Fail(opts.status().message());
  for (const auto& [key, value] : *opts) {
    c.options.settings.push_back({key, value});
    if (key.rfind("UCX_", 0) == 0) c.env.push_back({key, value});
  }
  if (Status s = transport::CheckSettings(c.backend, c.options); !s.ok()) return Fail(s.message());
  return Bench(c);
}

const bool registered = cli::Register(
    {"transport", "put bandwidth between two processes vs ucx_perftest", &TransportMain});

}  // namespace
}  // namespace kv::bench
