// Waker: a condition variable whose waiters may spin instead of sleeping.
//
// Why: on the H200 host a sleeping thread runs 41-114 µs (p50) after it was notified, after
// 1-50 ms idle (`kvbench wakeup`, benchmarks/pd_gpu.md), and a transfer's first bytes wait
// behind several such hand-offs between threads. `kvd --busy-poll` trades a core per waiting thread
// for those microseconds; Waker lets one wait serve both modes.
//
// Contract: the state that `ready` reads is changed under the caller's mutex, and every change
// a waiter may be waiting for is followed by Notify() (inside or after the lock). Then Await
// returns once `ready` holds, with the lock held, exactly like std::condition_variable::wait
// with a predicate: a spinning waiter reads the notify counter under the lock, so a change made
// after it released the lock bumps the counter it watches.
//
// AwaitUntil is Await with a deadline: it returns `ready()` as it stands at the deadline (lock
// held), so every wait of a caller that promises a bound keeps it in both modes.
//
// Thread-safety: Notify from any thread; Await from any number of threads, each with the lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace kv {

class Waker {
 public:
  explicit Waker(bool spin) : spin_(spin) {}

  bool spins() const { return spin_; }

  void Notify() {
    notifies_.fetch_add(1, std::memory_order_release);
    if (!spin_) cv_.notify_all();
  }

  template <typename Ready>
  void Await(std::unique_lock<std::mutex>& lock, Ready ready) {
    if (!spin_) return cv_.wait(lock, ready);
    while (!ready()) {
      const uint64_t seen = notifies_.load(std::memory_order_acquire);
      lock.unlock();
      while (notifies_.load(std::memory_order_acquire) == seen) Pause();
      lock.lock();
    }
  }

  template <typename Ready>
  bool AwaitUntil(std::unique_lock<std::mutex>& lock,
                  std::chrono::steady_clock::time_point deadline, Ready ready) {
    if (!spin_) return cv_.wait_until(lock, deadline, ready);
    while (!ready()) {
      const uint64_t seen = notifies_.load(std::memory_order_acquire);
      lock.unlock();
      while (notifies_.load(std::memory_order_acquire) == seen) {
        if (std::chrono::steady_clock::now() >= deadline) {
          lock.lock();
          return ready();
        }
        Pause();
      }
      lock.lock();
    }
    return true;
  }

  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }

 private:
  const bool spin_;
  std::atomic<uint64_t> notifies_{0};
  std::condition_variable cv_;
};

}  // namespace kv
