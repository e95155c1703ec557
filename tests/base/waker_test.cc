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

}  // namespace
}  // namespace kv
