// kvbench copies: what the staged host path's copies allow on this machine, without UCX or kvd.
// The staged path (transport/staged) moves a batch of small runs as three copies on three
// threads: a gather into a send slot (the sender's worker), the put of the slot into the
// receiver's slot (UCX's progress thread; on one host a shared-memory copy) and a scatter out of
// it (the receiver's progress thread). `kvbench pd` bounds kvd by one thread copying the same
// runs straight (its host ceiling). This measures both on the same runs, in one process: the one
// thread, the three copies pipelined through slots, and two (gather straight into the receive
// slot, scatter), so that "how close can the staged path get" has a figure per machine.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "tools/common/cli.h"

namespace kv::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Piece {
  uint64_t src;
  uint64_t dst;
};

// Slot indices handed from one stage to the next.
class Handoff {
 public:
  void Push(int slot) {
    {
      std::lock_guard lock(mu_);
      slots_.push_back(slot);
    }
    cv_.notify_one();
  }
  int Pop() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !slots_.empty(); });
    const int slot = slots_.front();
    slots_.pop_front();
    return slot;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> slots_;
};

struct Shape {
  uint64_t size = 0;   // bytes per run
  uint64_t runs = 0;   // in all
  uint64_t per = 0;    // runs per chunk
  uint64_t slots = 0;  // per side
};

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Pipelined: gather -> (copy ->) scatter, chunk by chunk, each stage on its own thread.
double Pipelined(const Shape& s, const std::vector<Piece>& pieces, const char* src, char* dst,
                 bool with_copy) {
  std::vector<std::vector<char>> send(s.slots, std::vector<char>(s.per * s.size));
  std::vector<std::vector<char>> recv(s.slots, std::vector<char>(s.per * s.size));
  Handoff free_send, free_recv, to_copy, to_scatter;
  for (uint64_t i = 0; i < s.slots; ++i) {
    free_send.Push(static_cast<int>(i));
    free_recv.Push(static_cast<int>(i));
  }
  const uint64_t chunks = s.runs / s.per;
  const auto start = Clock::now();
  std::thread gather([&] {
    for (uint64_t k = 0; k < chunks; ++k) {
      const int slot = with_copy ? free_send.Pop() : free_recv.Pop();
      char* out = with_copy ? send[slot].data() : recv[slot].data();
      for (uint64_t i = 0; i < s.per; ++i)
        std::memcpy(out + i * s.size, src + pieces[k * s.per + i].src, s.size);
      (with_copy ? to_copy : to_scatter).Push(slot);
    }
  });
  std::thread copy([&] {
    for (uint64_t k = 0; with_copy && k < chunks; ++k) {
      const int from = to_copy.Pop();
      const int to = free_recv.Pop();
      std::memcpy(recv[to].data(), send[from].data(), s.per * s.size);
      free_send.Push(from);
      to_scatter.Push(to);
    }
  });
  std::thread scatter([&] {
    for (uint64_t k = 0; k < chunks; ++k) {
      const int slot = to_scatter.Pop();
      for (uint64_t i = 0; i < s.per; ++i)
        std::memcpy(dst + pieces[k * s.per + i].dst, recv[slot].data() + i * s.size, s.size);
      free_recv.Push(slot);
    }
  });
  gather.join();
  copy.join();
  scatter.join();
  return Seconds(start);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr const char* kUsage =
    "kvbench copies — the staged host path's copies, without UCX or kvd\n"
    "\n"
    "Moves --bytes in runs of --size bytes from one buffer to another, read in order and written\n"
    "as an LBNHC -> BLHNC conversion writes them (the README demo shape): run i is token i / 8,\n"
    "head i % 8, and lands at its head's row of its 32-token block, (t / 32) * 256 + h * 32 +\n"
    "t % 32. Three ways, median of --rounds each, alternated:\n"
    "  one thread    memcpy run by run, source to destination: the ceiling kvbench pd prints\n"
    "  three copies  gather --chunk bytes of runs into a send slot, copy it into a receive slot\n"
    "                (the put), scatter it: three threads, --slots slots a side\n"
    "  two copies    gather straight into the receive slot, scatter: two threads\n"
    "Handoffs are condition variables; nothing else runs. So 'three copies' bounds kvd's staged\n"
    "path on this machine from above, as 'one thread' bounds every path.\n"
    "\n"
    "example:\n"
    "  kvbench copies --size 512 --bytes 64M --chunk 2M\n";

int CopiesMain(int argc, char** argv) {
  cli::Flags flags({{"size", "bytes per run (default 512)"},
                    {"bytes", "bytes moved per round (default 64M)"},
                    {"chunk", "bytes of runs per slot (default 2M: the staged path's)"},
                    {"slots", "slots a side (default 4: the staged path's)"},
                    {"rounds", "rounds of each way; the median is printed (default 5)"},
                    {"help", "this text", true}});
  if (auto code = flags.ParseOrExit("kvbench copies", kUsage, argc, argv)) return *code;
  auto size = flags.bytes("size", 512);
  auto bytes = flags.bytes("bytes", 64 << 20);
  auto chunk = flags.bytes("chunk", 2 << 20);
  auto slots = flags.integer("slots", 4, 1, 64);
  auto rounds = flags.integer("rounds", 5, 1, 1000);
  for (const Status& s :
       {size.status(), bytes.status(), chunk.status(), slots.status(), rounds.status()}) {
    if (!s.ok()) return cli::Fail("kvbench copies", s);
  }
  Shape shape{*size, *bytes / std::max<uint64_t>(*size, 1), *chunk / std::max<uint64_t>(*size, 1),
              static_cast<uint64_t>(*slots)};
  constexpr uint64_t kHeads = 8, kBlock = 32;
  if (*size == 0 || shape.per == 0 || shape.runs % (kHeads * kBlock) != 0 ||
      shape.runs % shape.per != 0)
    return cli::Fail("kvbench copies",
                     Status::InvalidArgument("--bytes must be a multiple of 256 runs and of "
                                             "--chunk, and --chunk at least one run"));
  std::vector<Piece> pieces(shape.runs);
  for (uint64_t i = 0; i < shape.runs; ++i) {
    const uint64_t t = i / kHeads, h = i % kHeads;
    pieces[i] = {i * shape.size,
                 ((t / kBlock) * kHeads * kBlock + h * kBlock + t % kBlock) * shape.size};
  }
  std::vector<char> src(shape.runs * shape.size, 1), dst(shape.runs * shape.size, 0);
  std::vector<double> one, three, two;
  for (int64_t r = 0; r < *rounds; ++r) {
    const auto start = Clock::now();
    for (const Piece& p : pieces) std::memcpy(dst.data() + p.dst, src.data() + p.src, shape.size);
    one.push_back(Seconds(start));
    three.push_back(Pipelined(shape, pieces, src.data(), dst.data(), true));
    two.push_back(Pipelined(shape, pieces, src.data(), dst.data(), false));
  }
  const double gb = static_cast<double>(shape.runs * shape.size) / 1e9;
  const double ceiling = gb / Median(one);
  std::printf(
      "kvbench copies: %lu runs of %lu B (%.1f MiB), chunks of %lu runs, %lu slots a side, "
      "median of %ld rounds\n",
      static_cast<unsigned long>(shape.runs), static_cast<unsigned long>(shape.size),
      static_cast<double>(shape.runs * shape.size) / (1 << 20),
      static_cast<unsigned long>(shape.per), static_cast<unsigned long>(shape.slots),
      static_cast<long>(*rounds));
  std::printf("  one thread, run by run (the ceiling)   %7.2f GB/s\n", ceiling);
  std::printf("  three copies: gather, copy, scatter    %7.2f GB/s   %.2f of the ceiling\n",
              gb / Median(three), gb / Median(three) / ceiling);
  std::printf("  two copies: gather, scatter            %7.2f GB/s   %.2f of the ceiling\n",
              gb / Median(two), gb / Median(two) / ceiling);
  return 0;
}

const bool registered = cli::Register(
    {"copies", "the staged host path's copies pipelined on threads, beside one thread's",
     &CopiesMain});

}  // namespace
}  // namespace kv::bench
