#include "base/waker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace kv {
namespace {

// Producers each add `per` items under the lock and notify; one consumer takes them as they
// come. Whether the consumer sleeps or spins, it sees every item and returns with the lock held.
void ConsumesEveryItem(bool spin) {
  Waker waker(spin);
  std::mutex mu;
  int queued = 0, taken = 0;  // guarded by mu
  constexpr int kProducers = 3, kPer = 2000;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&] {
      for (int i = 0; i < kPer; ++i) {
        {
          std::lock_guard lock(mu);
          ++queued;
        }
        waker.Notify();
      }
    });
  }
  std::unique_lock lock(mu);
  while (taken < kProducers * kPer) {
    waker.Await(lock, [&] { return queued > taken; });
    EXPECT_TRUE(lock.owns_lock());
    EXPECT_GT(queued, taken);
    taken = queued;
  }
  lock.unlock();
  for (auto& t : producers) t.join();
  EXPECT_EQ(taken, kProducers * kPer);
}

TEST(WakerTest, ASleepingWaiterSeesEveryNotifiedChange) {
  ConsumesEveryItem(false);
}
TEST(WakerTest, ASpinningWaiterSeesEveryNotifiedChange) {
  ConsumesEveryItem(true);
}

// A change made while the waiter is between its check and its wait still wakes it: the
// notification comes after the waiter let go of the lock.
TEST(WakerTest, AwaitReturnsAtOnceWhenAlreadyReadyAndOtherwiseOnlyAfterTheChange) {
  for (bool spin : {false, true}) {
    Waker waker(spin);
    EXPECT_EQ(waker.spins(), spin);
    std::mutex mu;
    bool ready = true;
    {
      std::unique_lock lock(mu);
      waker.Await(lock, [&] { return ready; });  // no notification needed
      ready = false;
    }
    std::atomic<bool> returned{false};
    std::thread waiter([&] {
      std::unique_lock lock(mu);
      waker.Await(lock, [&] { return ready; });
      returned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(returned.load()) << "returned without the change, spin=" << spin;
    {
      std::lock_guard lock(mu);
      ready = true;
    }
    waker.Notify();
    waiter.join();
    EXPECT_TRUE(returned.load());
  }
}

// AwaitUntil keeps its deadline in both modes: with nothing changing it returns false (the lock
// held) no earlier than the deadline; a change notified before it returns true at once.
TEST(WakerTest, AwaitUntilReturnsAtItsDeadlineOrWithTheChange) {
  using namespace std::chrono_literals;
  for (bool spin : {false, true}) {
    Waker waker(spin);
    std::mutex mu;
    bool ready = false;
    std::unique_lock lock(mu);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(waker.AwaitUntil(lock, start + 50ms, [&] { return ready; })) << spin;
    EXPECT_TRUE(lock.owns_lock());
    EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms) << spin;
    lock.unlock();

    std::thread changer([&] {
      std::this_thread::sleep_for(20ms);
      {
        std::lock_guard guard(mu);
        ready = true;
      }
      waker.Notify();
    });
    lock.lock();
    const auto again = std::chrono::steady_clock::now();
    EXPECT_TRUE(waker.AwaitUntil(lock, again + 10s, [&] { return ready; })) << spin;
    EXPECT_TRUE(lock.owns_lock());
    EXPECT_LT(std::chrono::steady_clock::now() - again, 5s) << spin;
    lock.unlock();
    changer.join();
  }
}

}  // namespace
}  // namespace kv
