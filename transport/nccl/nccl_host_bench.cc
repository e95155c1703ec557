// nccl_host_bench: the host work of the nccl backend per batch of small rows, step by step,
// against the time the batch's bytes take on the wire.
//
// The shape is issue 24's: `kvbench pd --memory cuda --transport nccl --tokens 4096 --layers 32
// --heads 8 --head-dim 128 --block-size 16 --block-ids random --decode-order BLHNC --window 32`.
// LBNHC -> BLHNC cuts a layer of a request into 512 B rows, one run group per page and head (16
// rows), which SplitGroups joins into one entry of 8 blocks per page; kvd merges one layer of up
// to `window` requests into a batch (daemon/send_queue.cc). Each case times one step of that
// batch's way, on the thread that runs it:
//   kvd's io thread:  plan (LayerPlan::AppendLayer per request), check (CheckBatch's bounds),
//                     put (what Link::Put copies);
//   sender thread:    split (SplitGroups), encode (EncodeData), frame (the announcement's
//                     trip over loopback TCP to a reader thread that decodes it: the sender
//                     thread waits in SendFrame), chunk (SplitDirect, ChunkRuns,
//                     ChunkGroups), tables (RunTables::Load's host half: LayOutTables,
//                     EncodeTables), and all: those but the frame in a row;
//   receive side:     decode (DecodeData, on the reader thread), check_rows (TotalBytes,
//                     CheckRanges, CheckStrided), chunk and tables for the scatters, and all,
//                     the receive worker's steps in a row.
// Not timed (no GPU here): the NCCL and kernel launches per chunk. LBNHC -> LBNHC (64 KiB
// pages, one range each) is the reference: it reaches 0.97 of the wire.
//
// A Google Benchmark of its own, beside the backend whose internals it calls (as the backend's
// tests are; kvbench may not include them), built where the backend is.
#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "base/framed_socket.h"
#include "layout/plan.h"

#include "transport/nccl/chunk_tables.h"
#include "transport/nccl/wire.h"

namespace kv::transport::nccl {
namespace {

constexpr int64_t kTokens = 4096;
constexpr int64_t kLayers = 32;
constexpr int64_t kBlockSize = 16;
constexpr int kWindow = 32;
constexpr uint64_t kChunkBytes = 32ull << 20;  // LinkOptions::chunk_bytes
constexpr uint64_t kDirectBytes = 8ull << 20;  // LinkOptions::direct_bytes
// What one chunk of 32 MiB takes on the wire at ~360 GB/s, two H200s' ncclSend (pd_gpu.md).
constexpr double kWireGBps = 360;

// PdLayout (tools/kvbench/pd/pd_sim.cc) of the shape: `order` on one side.
KvRegion Region(const std::string& order) {
  LayoutSpec s;
  s.order = order;
  s.layers = kLayers;
  s.block_size = kBlockSize;
  s.blocks = kWindow * (kTokens / kBlockSize) + 2;
  s.heads = 8;
  s.total_heads = 8;
  s.content_bytes = 2 * 128 * 2;  // K and V of 128 bf16
  return KvRegion::Create(s).value();
}

// splitmix64, as pd_sim shuffles its block ids.
uint64_t Mix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<int64_t> Shuffled(uint64_t seed) {
  std::vector<int64_t> ids(kWindow * (kTokens / kBlockSize));
  std::iota(ids.begin(), ids.end(), 0);
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[Mix(seed) % i]);
  return ids;
}

// One batch of `requests` requests' layer 5, as each step finds it.
struct Batch {
  KvRegion src, dst;
  std::vector<LayerPlan> plans;
  Plan plan;     // what kvd posts
  DataMsg sent;  // the announcement, after SplitGroups
  std::vector<Range> gather;
  std::vector<Strided> rows;  // the sender's view of sent.strided
  std::string frame;          // EncodeData(sent)
  uint64_t bytes = 0;
  double chunks = 0;  // of kChunkBytes

  // dst_order "BLHNC_as_groups": BLHNC planned as groups, as kvd did before it planned blocks.
  Batch(int requests, const std::string& dst_order)
      : src(Region("LBNHC")), dst(Region(dst_order.substr(0, 5))) {
    const PlanEntries entries =
        dst_order.size() > 5 ? PlanEntries::kGroups : PlanEntries::kGroupBlocks;
    const auto src_ids = Shuffled(1), dst_ids = Shuffled(2);
    const int64_t blocks = kTokens / kBlockSize;
    for (int q = 0; q < requests; ++q) {
      const TransferSpec spec{std::span(src_ids).subspan(q * blocks, blocks),
                              std::span(dst_ids).subspan(q * blocks, blocks), kTokens};
      plans.push_back(LayerPlan::Create(src, dst, spec, entries).value());
      (void)plans.back().AppendLayer(5, &plan);
    }
    bytes = plan.bytes;
    chunks = static_cast<double>(bytes) / static_cast<double>(kChunkBytes);
    Split(&sent, &gather, &rows);
    frame = EncodeData(sent);
  }

  void Split(DataMsg* msg, std::vector<Range>* g, std::vector<Strided>* r) const {
    msg->chunk_bytes = kChunkBytes;
    msg->direct_bytes = kDirectBytes;
    for (const Run& run : plan.runs) {
      msg->ranges.push_back({run.dst_offset, run.length});
      g->push_back({run.src_offset, run.length});
    }
    SplitGroups(plan.groups, kChunkBytes, msg, g, r);
    SplitBlocks(plan.blocks, kChunkBytes, msg, g, r);
  }
};

const Batch& BatchOf(int requests, const std::string& dst_order) {
  static std::map<std::pair<int, std::string>, std::unique_ptr<Batch>> batches;
  auto& b = batches[{requests, dst_order}];
  if (!b) b = std::make_unique<Batch>(requests, dst_order);
  return *b;
}

enum class Step {
  kPlan,
  kCheck,
  kPut,
  kSplit,
  kEncode,
  kFrame,
  kChunkGather,
  kTablesGather,
  kSender,
  kSenderSameCore,
  kSenderOtherCore,
  kDecode,
  kCheckRows,
  kChunkScatter,
  kTablesScatter,
  kReceiver,
};

struct StepInfo {
  Step step;
  const char* name;
};
constexpr StepInfo kSteps[] = {
    {Step::kPlan, "io/plan"},
    {Step::kCheck, "io/check"},
    {Step::kPut, "io/put"},
    {Step::kSplit, "send/split"},
    {Step::kEncode, "send/encode"},
    {Step::kFrame, "send/frame"},
    {Step::kChunkGather, "send/chunk"},
    {Step::kTablesGather, "send/tables"},
    {Step::kSender, "send/all"},
    {Step::kSenderSameCore, "send/all_fresh"},
    {Step::kSenderOtherCore, "send/all_handed_over"},
    {Step::kDecode, "recv/decode"},
    {Step::kCheckRows, "recv/check_rows"},
    {Step::kChunkScatter, "recv/chunk"},
    {Step::kTablesScatter, "recv/tables"},
    {Step::kReceiver, "recv/all"},
};

// The chunking and table encoding of one direction; `table` is reused as the pinned buffer is.
Status ChunkAndEncode(std::span<const Range> ranges, std::span<const Strided> rows,
                      Direction direction, bool encode, TableLayout* layout,
                      std::vector<unsigned char>* table) {
  const DirectSplit split = SplitDirect(ranges, kDirectBytes, kChunkBytes);
  const Chunks chunks = ChunkRuns(split.staged, kChunkBytes, direction);
  const GroupChunks groups = ChunkGroups(rows, kChunkBytes, direction);
  benchmark::DoNotOptimize(groups.groups.data());
  if (!encode) return Status::Ok();
  LayOutTables(chunks, groups, layout);
  if (table->size() < layout->table_bytes) table->resize(layout->table_bytes);
  KV_RETURN_IF_ERROR(EncodeTables(chunks, groups, *layout, table->data()));
  benchmark::DoNotOptimize(table->data());
  return Status::Ok();
}

// The first error of a case, which then reports it.
void Keep(Status* first, Status s) {
  if (first->ok() && !s.ok()) *first = std::move(s);
}

// Chunking done once outside the clock, for the cases that time the tables alone.
struct Chunked {
  Chunks chunks;
  GroupChunks groups;
};
Chunked ChunkOnce(std::span<const Range> ranges, std::span<const Strided> rows,
                  Direction direction) {
  const DirectSplit split = SplitDirect(ranges, kDirectBytes, kChunkBytes);
  return {ChunkRuns(split.staged, kChunkBytes, direction),
          ChunkGroups(rows, kChunkBytes, direction)};
}

void Report(benchmark::State& state, const Batch& b, double seconds);

// The announcement's trip: the sender thread's SendFrame over loopback TCP to a reader thread
// that reassembles it (FrameReader) and decodes it (DecodeData), as the link's reader does.
// Each iteration sends kFrames frames and waits until the last is decoded: the time per frame
// is the pipe's, both threads running.
void FrameCase(benchmark::State& state, const Batch& b) {
  constexpr int kFrames = 4;
  const auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(10); };
  auto listener = Listener::Listen("tcp:127.0.0.1:0");
  if (!listener.ok()) return state.SkipWithError(listener.status().ToString().c_str());
  auto sender = Socket::Connect(listener->endpoint(), deadline());
  if (!sender.ok()) return state.SkipWithError(sender.status().ToString().c_str());
  Socket receiver;
  for (const auto until = deadline();
       !receiver.valid() && std::chrono::steady_clock::now() < until;) {
    auto accepted = listener->Accept();
    if (accepted.ok()) receiver = std::move(accepted).value();
  }
  if (!receiver.valid()) return state.SkipWithError("no loopback connection");
  std::mutex mu;
  std::condition_variable cv;
  uint64_t decoded = 0;  // guarded by mu
  bool failed = false;   // guarded by mu
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    FrameReader frames;
    while (!stop) {
      if (!WaitReadable(receiver.fd(),
                        std::chrono::steady_clock::now() + std::chrono::milliseconds(10))) {
        continue;
      }
      const Status read = frames.ReadAvailable(receiver.fd());
      while (auto frame = frames.Next()) {
        const bool ok = DecodeData(*frame).ok();
        std::lock_guard lock(mu);
        failed = failed || !ok;
        ++decoded;
        cv.notify_all();
      }
      if (!read.ok()) break;
    }
  });
  uint64_t sent = 0;
  Status status;
  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (int i = 0; i < kFrames; ++i) Keep(&status, sender->SendFrame(b.frame, deadline()));
    sent += kFrames;
    // Sleeps, not spins: the reader needs the core on a small machine.
    std::unique_lock lock(mu);
    cv.wait_until(lock, deadline(), [&] { return decoded >= sent || failed; });
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations() * kFrames);
  stop = true;
  reader.join();
  if (failed || decoded < sent) Keep(&status, Status::Internal("frames lost"));
  if (!status.ok()) return state.SkipWithError(status.ToString().c_str());
  state.counters["frame_KiB"] = static_cast<double>(b.frame.size()) / 1024;
  Report(state, b, seconds);
}

// Pins the calling thread to the `index`th CPU it may run on; false where there is no such CPU.
bool PinTo(size_t index) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != static_cast<int>(index)) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0;
  }
  return false;
}

// send/all as the link meets a batch: Link::Put copies its runs and groups into fresh vectors
// on the io thread, the sender thread splits, encodes, chunks and tables them. A producer thread
// plays the io thread, on this thread's CPU (send/all_fresh) or another (send/all_handed_over:
// the batch reaches the sender from that CPU's cache, as in kvd); only the sender's work is
// timed. On the H200 host kvd's sender spent 4-6 times send/all's time per group
// (benchmarks/pd_gpu.md, "Sixteenth session"); this pair measures what the hand-over costs.
void HandoverCase(benchmark::State& state, const Batch& b, bool other_core) {
  cpu_set_t saved;
  const bool restore = sched_getaffinity(0, sizeof(saved), &saved) == 0;
  if (other_core && !PinTo(1)) return state.SkipWithError("needs two CPUs");
  if (!other_core) PinTo(0);
  struct Handed {
    std::vector<Range> ranges, gather;
    std::vector<RunGroup> groups;
    std::vector<GroupBlocks> blocks;
  };
  std::mutex mu;
  std::condition_variable cv;
  Handed handed;      // guarded by mu
  bool full = false;  // guarded by mu
  bool stop = false;  // guarded by mu
  std::thread io([&] {
    PinTo(0);
    while (true) {
      Handed h;
      for (const Run& r : b.plan.runs) {
        h.ranges.push_back({r.dst_offset, r.length});
        h.gather.push_back({r.src_offset, r.length});
      }
      h.groups.assign(b.plan.groups.begin(), b.plan.groups.end());
      h.blocks.assign(b.plan.blocks.begin(), b.plan.blocks.end());
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !full || stop; });
      if (stop) return;
      handed = std::move(h);
      full = true;
      cv.notify_all();
    }
  });
  TableLayout layout;
  std::vector<unsigned char> table;
  Status status;
  double busy = 0;
  for (auto _ : state) {
    Handed h;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return full; });
      h = std::move(handed);
      full = false;
    }
    cv.notify_all();
    const auto start = std::chrono::steady_clock::now();
    DataMsg msg;
    msg.chunk_bytes = kChunkBytes;
    msg.direct_bytes = kDirectBytes;
    msg.ranges = std::move(h.ranges);
    std::vector<Strided> rows;
    SplitGroups(h.groups, kChunkBytes, &msg, &h.gather, &rows);
    SplitBlocks(h.blocks, kChunkBytes, &msg, &h.gather, &rows);
    std::string frame = EncodeData(msg);
    benchmark::DoNotOptimize(frame.data());
    Keep(&status, ChunkAndEncode(h.gather, rows, Direction::kGather, true, &layout, &table));
    busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  cv.notify_all();
  io.join();
  if (restore) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  if (!status.ok()) return state.SkipWithError(status.ToString().c_str());
  Report(state, b, busy / static_cast<double>(state.iterations()));
}

void StepCase(benchmark::State& state, Step step, int requests, const std::string& dst_order) {
  const Batch& b = BatchOf(requests, dst_order);
  if (step == Step::kFrame) return FrameCase(state, b);
  if (step == Step::kSenderSameCore || step == Step::kSenderOtherCore) {
    return HandoverCase(state, b, step == Step::kSenderOtherCore);
  }
  const uint64_t src_bytes = b.src.span_bytes(), dst_bytes = b.dst.span_bytes();
  Plan plan;  // reused, as the send queue recycles its vectors
  TableLayout layout;
  std::vector<unsigned char> table;
  const Chunked gathers = ChunkOnce(b.gather, b.rows, Direction::kGather);
  const Chunked scatters = ChunkOnce(b.sent.ranges, b.sent.strided, Direction::kScatter);
  Status status;
  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    switch (step) {
      case Step::kPlan:
        plan.runs.clear();
        plan.groups.clear();
        plan.blocks.clear();
        plan.group_rows = plan.bytes = 0;
        for (const LayerPlan& p : b.plans) Keep(&status, p.AppendLayer(5, &plan));
        benchmark::DoNotOptimize(plan.groups.data());
        break;
      case Step::kCheck:
        Keep(&status, ValidateRuns(b.plan.runs, src_bytes, dst_bytes));
        Keep(&status, ValidateGroups(b.plan.groups, src_bytes, dst_bytes));
        Keep(&status, ValidateBlocks(b.plan.blocks, src_bytes, dst_bytes));
        break;
      case Step::kPut: {
        std::vector<Range> ranges, gather;
        ranges.reserve(b.plan.runs.size());
        gather.reserve(b.plan.runs.size());
        for (const Run& r : b.plan.runs) {
          ranges.push_back({r.dst_offset, r.length});
          gather.push_back({r.src_offset, r.length});
        }
        std::vector<RunGroup> groups(b.plan.groups.begin(), b.plan.groups.end());
        std::vector<GroupBlocks> blocks(b.plan.blocks.begin(), b.plan.blocks.end());
        benchmark::DoNotOptimize(groups.data());
        benchmark::DoNotOptimize(blocks.data());
        break;
      }
      case Step::kSplit: {
        DataMsg msg;
        std::vector<Range> gather;
        std::vector<Strided> rows;
        SplitGroups(b.plan.groups, kChunkBytes, &msg, &gather, &rows);
        SplitBlocks(b.plan.blocks, kChunkBytes, &msg, &gather, &rows);
        benchmark::DoNotOptimize(rows.data());
        break;
      }
      case Step::kEncode: {
        std::string frame = EncodeData(b.sent);
        benchmark::DoNotOptimize(frame.data());
        break;
      }
      case Step::kFrame:
      case Step::kSenderSameCore:
      case Step::kSenderOtherCore:
        break;
      case Step::kChunkGather:
        Keep(&status, ChunkAndEncode(b.gather, b.rows, Direction::kGather, false, &layout, &table));
        break;
      case Step::kTablesGather:
      case Step::kTablesScatter: {
        const Chunked& c = step == Step::kTablesGather ? gathers : scatters;
        LayOutTables(c.chunks, c.groups, &layout);
        if (table.size() < layout.table_bytes) table.resize(layout.table_bytes);
        Keep(&status, EncodeTables(c.chunks, c.groups, layout, table.data()));
        benchmark::DoNotOptimize(table.data());
        break;
      }
      case Step::kSender: {
        // SendData's work: its job holds the ranges (Link::Put made them) and the groups.
        DataMsg msg;
        std::vector<Range> gather;
        std::vector<Strided> rows;
        SplitGroups(b.plan.groups, kChunkBytes, &msg, &gather, &rows);
        SplitBlocks(b.plan.blocks, kChunkBytes, &msg, &gather, &rows);
        std::string frame = EncodeData(b.sent);
        benchmark::DoNotOptimize(frame.data());
        Keep(&status, ChunkAndEncode(b.gather, b.rows, Direction::kGather, true, &layout, &table));
        break;
      }
      case Step::kDecode: {
        auto msg = DecodeData(b.frame);
        Keep(&status, msg.status());
        benchmark::DoNotOptimize(msg);
        break;
      }
      case Step::kCheckRows:
        Keep(&status, TotalBytes(b.sent.ranges, b.sent.strided).status());
        Keep(&status, CheckRanges(b.sent.ranges, dst_bytes));
        Keep(&status, CheckStrided(b.sent.strided, dst_bytes, kChunkBytes));
        break;
      case Step::kChunkScatter:
        Keep(&status, ChunkAndEncode(b.sent.ranges, b.sent.strided, Direction::kScatter, false,
                                     &layout, &table));
        break;
      case Step::kReceiver:
        Keep(&status, TotalBytes(b.sent.ranges, b.sent.strided).status());
        Keep(&status, CheckRanges(b.sent.ranges, dst_bytes));
        Keep(&status, CheckStrided(b.sent.strided, dst_bytes, kChunkBytes));
        Keep(&status, ChunkAndEncode(b.sent.ranges, b.sent.strided, Direction::kScatter, true,
                                     &layout, &table));
        break;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  if (!status.ok()) state.SkipWithError(status.ToString().c_str());
  Report(state, b, seconds);
}

void Report(benchmark::State& state, const Batch& b, double seconds) {
  const double descriptors =
      static_cast<double>(b.plan.runs.size() + b.plan.groups.size() + b.plan.blocks.size());
  const double wire_us = static_cast<double>(kChunkBytes) / (kWireGBps * 1e3);
  state.counters["descriptors"] = descriptors;
  state.counters["chunks"] = b.chunks;
  state.counters["ns_per_desc"] = seconds * 1e9 / descriptors;
  state.counters["us_per_chunk"] = seconds * 1e6 / b.chunks;
  state.counters["x_wire"] = seconds * 1e6 / b.chunks / wire_us;
}

void PrintHelp() {
  std::printf(
      "usage: nccl_host_bench [--benchmark_filter=REGEX] [other --benchmark_* flags]\n\n"
      "Times the nccl backend's host work, step by step, for one batch of issue 24's shape:\n"
      "one layer of N requests of `kvbench pd --tokens 4096 --layers 32 --heads 8 --head-dim\n"
      "128 --block-size 16 --block-ids random --decode-order BLHNC` (LBNHC -> BLHNC: 512 B rows,\n"
      "a run group of 16 per page and head, a block entry of 8 such per page), as kvd merges\n"
      "them into one batch.\n\n"
      "Steps: io/plan (LayerPlan::AppendLayer per request), io/check (CheckBatch's bounds),\n"
      "io/put (Link::Put's copies): kvd's io thread; send/split (SplitGroups, SplitBlocks),\n"
      "send/encode "
      "(EncodeData), send/frame (SendFrame to a reader thread that decodes it, loopback TCP),\n"
      "send/chunk (SplitDirect, ChunkRuns, ChunkGroups), send/tables (the host\n"
      "half of RunTables::Load), send/all (its steps but the frame in a row), send/all_fresh\n"
      "and send/all_handed_over (the same on each batch as Link::Put hands it over: copied by\n"
      "an io thread on this CPU, or on another one, whose cache it then comes from); recv/decode\n"
      "(DecodeData, reader thread), recv/check_rows (TotalBytes, CheckRanges, CheckStrided),\n"
      "recv/chunk, recv/tables, recv/all (the receive worker's steps in a row). Not timed: NCCL\n"
      "and kernel launches. LBNHC_to_LBNHC (64 KiB pages, 0.97 of the wire) is the reference.\n\n"
      "LBNHC_to_BLHNC_as_groups plans BLHNC as groups (a page's 8 heads apart), as kvd did before\n"
      "it planned blocks of them (PlanEntries::kGroupBlocks) for nccl.\n\n"
      "Counters: descriptors (the plan's runs + groups + blocks of the batch), chunks (of 32 MiB), "
      "ns_per_desc,\n"
      "us_per_chunk, x_wire (us_per_chunk / the %.0f us a 32 MiB chunk takes at %.0f GB/s).\n",
      static_cast<double>(kChunkBytes) / (kWireGBps * 1e3), kWireGBps);
}

int BenchMain(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      PrintHelp();
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (argc > 1) {
    std::fprintf(stderr, "nccl_host_bench: unknown argument '%s' (nccl_host_bench --help)\n",
                 argv[1]);
    return 2;
  }
  // BLHNC is the shape; LBNHC (64 KiB pages, one range each, no groups: 0.97 of the
  // wire on the H200s) the reference.
  for (const char* order : {"BLHNC", "BLHNC_as_groups", "LBNHC"}) {
    for (int requests : {8, 32}) {
      for (const StepInfo& s : kSteps) {
        const std::string name = std::string("nccl_host/LBNHC_to_") + order + "/" +
                                 std::to_string(requests) + "req/" + s.name;
        benchmark::RegisterBenchmark(name.c_str(), StepCase, s.step, requests, std::string(order))
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace kv::transport::nccl

int main(int argc, char** argv) {
  return kv::transport::nccl::BenchMain(argc, argv);
}
