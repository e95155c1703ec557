// kvbench wakeup: what one hand-off between two threads costs on this host after the receiving
// thread idled, the floor under every hop of a P/D wave's start (engine -> kvd -> peer kvd ->
// transport thread -> GPU).
//
// A waiter thread sleeps the way kvd's threads do: on a condition variable (the transports'
// worker threads, base/waker.h), or in poll() on a socket (kvd's io thread and nccl's reader);
// the main thread idles for a while, then notifies (or writes one byte) and the waiter stamps the
// time it woke. The ceiling is the same hand-off to a spinning waiter (`kvd --busy-poll`),
// measured in the same run. On the H200 host a sleeping thread ran 41-114 µs (p50) after the
// notify, after 1-50 ms idle (benchmarks/pd_gpu.md, nineteenth session).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/waker.h"
#include "tools/common/cli.h"

namespace kv::bench {
namespace {

using Clock = std::chrono::steady_clock;

enum class Mode { kSpin, kCondvar, kSocket };
const char* Name(Mode m) {
  return m == Mode::kSpin ? "spin" : m == Mode::kCondvar ? "condvar" : "socket";
}

// One waiter thread and its hand-offs; Round() returns one hand-off's latency in µs.
class HandOff {
 public:
  explicit HandOff(Mode mode) : mode_(mode), waker_(mode == Mode::kSpin) {
    if (mode_ == Mode::kSocket && ::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_) != 0) {
      fds_[0] = fds_[1] = -1;
    }
    thread_ = std::thread([this] { Wait(); });
  }
  ~HandOff() {
    stop_ = true;
    Signal();
    thread_.join();
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  bool ok() const { return mode_ != Mode::kSocket || fds_[0] >= 0; }

  // The hand-off's latency in µs; kTimeout where the waiter did not run within a second.
  Result<double> Round(std::chrono::microseconds idle) {
    std::this_thread::sleep_for(idle);
    const uint64_t before = woken_.load(std::memory_order_acquire);
    const auto sent = Clock::now();
    Signal();
    while (woken_.load(std::memory_order_acquire) == before) {
      if (Clock::now() - sent > std::chrono::seconds(1)) {
        return Status::Timeout(std::string(Name(mode_)) + " waiter did not run within 1 s");
      }
      Waker::Pause();
    }
    return std::chrono::duration<double, std::micro>(Clock::time_point(Clock::duration(woke_ns_)) -
                                                     sent)
        .count();
  }

 private:
  void Signal() {
    if (mode_ == Mode::kSocket) {
      const char byte = 1;
      [[maybe_unused]] ssize_t n = ::write(fds_[1], &byte, 1);
      return;
    }
    {
      std::lock_guard lock(mu_);
      ++signals_;
    }
    waker_.Notify();
  }

  void Wait() {
    uint64_t seen = 0;
    while (!stop_) {
      if (mode_ == Mode::kSocket) {
        pollfd fd{fds_[0], POLLIN, 0};
        if (::poll(&fd, 1, 1000) <= 0) continue;
        char buf[64];
        if (::read(fds_[0], buf, sizeof(buf)) <= 0) return;
      } else {
        std::unique_lock lock(mu_);
        waker_.Await(lock, [&] { return signals_ != seen; });
        seen = signals_;
      }
      woke_ns_ = Clock::now().time_since_epoch().count();
      woken_.fetch_add(1, std::memory_order_release);
    }
  }

  const Mode mode_;
  int fds_[2] = {-1, -1};
  std::mutex mu_;
  uint64_t signals_ = 0;  // guarded by mu_
  Waker waker_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> woke_ns_{0};
  std::atomic<uint64_t> woken_{0};
  std::thread thread_;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

int WakeupMain(int argc, char** argv) {
  cli::Flags flags({
      {"idle-us", "how long the waiter idles before each hand-off, a list (20,1000,10000,50000)"},
      {"rounds", "hand-offs per idle time and mode (40)"},
  });
  if (auto exit = flags.ParseOrExit(
          "kvbench wakeup",
          "usage: kvbench wakeup [--idle-us 20,1000,10000,50000] [--rounds 40]\n\n"
          "Latency of one hand-off to a thread that idled for --idle-us: to a spinning waiter\n"
          "(the ceiling, kvd --busy-poll), one sleeping on a condition variable, and one in\n"
          "poll() on a socket. A P/D wave's first copy waits behind several such hand-offs.\n",
          argc, argv)) {
    return *exit;
  }
  auto rounds = flags.integer("rounds", 40, 1, 100000);
  if (!rounds.ok()) return cli::Fail("kvbench wakeup", rounds.status());
  std::vector<int64_t> idles = {20, 1000, 10000, 50000};
  if (flags.has("idle-us")) {
    auto list = flags.int_list("idle-us");
    if (!list.ok()) return cli::Fail("kvbench wakeup", list.status());
    idles = *list;
    for (int64_t idle : idles) {
      if (idle < 0 || idle > 10'000'000) {
        return cli::Fail("kvbench wakeup",
                         Status::InvalidArgument("--idle-us values must be 0 to 10000000"));
      }
    }
  }
  std::printf("kvbench wakeup: %lld hand-offs per cell, µs from notify to the waiter running\n",
              static_cast<long long>(*rounds));
  std::printf("%10s  %-8s %8s %8s %8s  %s\n", "idle µs", "waiter", "p50", "p90", "max",
              "p50 over the spinning ceiling");
  for (int64_t idle : idles) {
    double ceiling = 0;
    for (Mode mode : {Mode::kSpin, Mode::kCondvar, Mode::kSocket}) {
      HandOff hand_off(mode);
      if (!hand_off.ok()) return cli::Fail("kvbench wakeup", Status::IoError("socketpair failed"));
      if (auto up = hand_off.Round(std::chrono::microseconds(0)); !up.ok()) {  // the thread is up
        return cli::Fail("kvbench wakeup", up.status());
      }
      std::vector<double> us;
      for (int64_t r = 0; r < *rounds; ++r) {
        auto one = hand_off.Round(std::chrono::microseconds(idle));
        if (!one.ok()) return cli::Fail("kvbench wakeup", one.status());
        us.push_back(*one);
      }
      const double p50 = Percentile(us, 0.5);
      if (mode == Mode::kSpin) ceiling = p50;
      std::printf("%10lld  %-8s %8.1f %8.1f %8.1f  %+.1f\n", static_cast<long long>(idle),
                  Name(mode), p50, Percentile(us, 0.9), *std::max_element(us.begin(), us.end()),
                  p50 - ceiling);
    }
  }
  return 0;
}

const bool registered = cli::Register(
    {"wakeup", "a thread hand-off's latency after idling, sleeping against spinning", &WakeupMain});

}  // namespace
}  // namespace kv::bench
