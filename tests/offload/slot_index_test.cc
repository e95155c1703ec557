#include "daemon/offload/slot_index.h"

#include <gtest/gtest.h>

namespace kv::offload {
namespace {

PoolKey K(uint64_t v, int64_t shard = 0) {
  return {shard, BlockKey::FromUint64(v)};
}

uint32_t ClaimReady(SlotIndex& index, const PoolKey& key) {
  std::optional<PoolKey> evicted;
  auto slot = index.Claim(key, &evicted);
  EXPECT_TRUE(slot.has_value());
  EXPECT_FALSE(evicted.has_value());
  index.Publish(key);
  return slot.value_or(0);
}

TEST(SlotIndex, HandsOutSlotsInOrderThenEvictsLeastRecentlyUsed) {
  SlotIndex index(3);
  EXPECT_EQ(ClaimReady(index, K(1)), 0u);
  EXPECT_EQ(ClaimReady(index, K(2)), 1u);
  EXPECT_EQ(ClaimReady(index, K(3)), 2u);
  EXPECT_EQ(index.free_slots(), 0u);
  index.Touch(K(1));  // now 2 is the oldest
  std::optional<PoolKey> evicted;
  auto slot = index.Claim(K(4), &evicted);
  ASSERT_TRUE(slot && evicted);
  EXPECT_EQ(*evicted, K(2));
  EXPECT_EQ(*slot, 1u);  // the victim's slot is reused
  EXPECT_EQ(index.Find(K(2)), nullptr);
  EXPECT_EQ(index.Find(K(4))->state, SlotIndex::State::kStoring);
}

TEST(SlotIndex, NeverEvictsPinnedOrStoringSlots) {
  SlotIndex index(2);
  ClaimReady(index, K(1));
  std::optional<PoolKey> evicted;
  ASSERT_TRUE(index.Claim(K(2), &evicted));  // storing: pinned by its claim
  index.Pin(K(1));                           // being loaded
  EXPECT_EQ(index.evictable(), 0u);
  EXPECT_FALSE(index.Claim(K(3), &evicted).has_value());
  index.Unpin(K(1));
  EXPECT_EQ(index.evictable(), 1u);
  auto slot = index.Claim(K(3), &evicted);
  ASSERT_TRUE(slot && evicted);
  EXPECT_EQ(*evicted, K(1));
  EXPECT_NE(index.Find(K(2)), nullptr);
}

TEST(SlotIndex, AbandonReturnsTheSlotAndShardsAreDistinct) {
  SlotIndex index(1);
  std::optional<PoolKey> evicted;
  ASSERT_TRUE(index.Claim(K(7, 0), &evicted));
  index.Abandon(K(7, 0));
  EXPECT_EQ(index.used(), 0u);
  EXPECT_EQ(index.free_slots(), 1u);
  ClaimReady(index, K(7, 4));
  EXPECT_EQ(index.Find(K(7, 0)), nullptr);
  EXPECT_NE(index.Find(K(7, 4)), nullptr);
}

TEST(SlotIndex, RetireForgetsTheKeyButNeverReusesItsSlot) {
  SlotIndex index(2);
  std::optional<PoolKey> evicted;
  ASSERT_EQ(index.Claim(K(1), &evicted), 0u);
  index.Retire(K(1));  // its copy is stuck and may still land in slot 0
  EXPECT_EQ(index.Find(K(1)), nullptr);
  EXPECT_EQ(index.used(), 1u);
  EXPECT_EQ(index.free_slots(), 1u);
  EXPECT_EQ(ClaimReady(index, K(1)), 1u);   // stored afresh, elsewhere
  auto slot = index.Claim(K(2), &evicted);  // no free slot: evicts rather than take slot 0
  ASSERT_TRUE(slot && evicted);
  EXPECT_EQ(*slot, 1u);
  EXPECT_EQ(*evicted, K(1));
}

}  // namespace
}  // namespace kv::offload
