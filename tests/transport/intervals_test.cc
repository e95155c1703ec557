// SortAndMerge and Contains (transport/intervals.h): the write grants' interval sets. Input in
// order takes the one-pass path, input out of order the sort; both must give the same set.
#include "transport/intervals.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace kv::transport {
namespace {

TEST(Intervals, UnsortedInputIsSortedAndOverlapsAndTouchesMerge) {
  std::vector<Interval> v = {{50, 60}, {10, 20}, {15, 30}, {30, 35}, {70, 80}, {0, 5}};
  SortAndMerge(v);
  const std::vector<Interval> want = {{0, 5}, {10, 35}, {50, 60}, {70, 80}};
  EXPECT_EQ(v, want);
  EXPECT_TRUE(Contains(v, 10, 25));
  EXPECT_FALSE(Contains(v, 34, 2));  // runs past 35
  EXPECT_FALSE(Contains(v, 5, 1));   // the gap between 5 and 10
}

TEST(Intervals, SortedInputMergesTheSameAsShuffled) {
  std::mt19937_64 rng(7);
  std::vector<Interval> spans;
  for (uint64_t at = 0; spans.size() < 500; at += rng() % 64) {
    spans.emplace_back(at, at + 1 + rng() % 48);  // some overlap the next, some touch, some not
  }
  std::sort(spans.begin(), spans.end());
  std::vector<Interval> in_order = spans;
  std::vector<Interval> shuffled = spans;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  SortAndMerge(in_order);
  SortAndMerge(shuffled);
  EXPECT_EQ(in_order, shuffled);
  ASSERT_LT(in_order.size(), spans.size());  // the case merges something
  for (size_t i = 1; i < in_order.size(); ++i) {
    EXPECT_GT(in_order[i].first, in_order[i - 1].second) << "left touching or overlapping";
  }
  // Every input span lies inside the merged set.
  for (const auto& [first, end] : spans) EXPECT_TRUE(Contains(in_order, first, end - first));
}

}  // namespace
}  // namespace kv::transport
