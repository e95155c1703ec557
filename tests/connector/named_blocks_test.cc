// NamedBlocks: a save leaves its blocks out only when the same ones went out for its request.
#include "connector/named_blocks.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kv::connector {
namespace {

TEST(NamedBlocks, RepeatsOnlyWhatWasSentLastForTheSameRequest) {
  NamedBlocks named;
  const std::vector<int64_t> a = {3, 1, 2}, b = {3, 1};
  EXPECT_FALSE(named.Repeats("r", a));  // first: send them
  EXPECT_TRUE(named.Repeats("r", a));
  EXPECT_FALSE(named.Repeats("s", a));  // another request names its own
  EXPECT_FALSE(named.Repeats("r", b));  // changed: send them (kvd refuses other blocks)
  EXPECT_TRUE(named.Repeats("r", b));
  EXPECT_FALSE(named.Repeats("r", a));  // and back
  named.Forget("r");
  EXPECT_FALSE(named.Repeats("r", a));  // a finished request's id, used again
  EXPECT_TRUE(named.Repeats("s", a));
}

TEST(NamedBlocks, ATableOfRequestsNeverFinishedIsClearedNotGrown) {
  NamedBlocks named;
  const std::vector<int64_t> ids = {7};
  for (size_t i = 0; i < NamedBlocks::kMaxRequests; ++i) {
    ASSERT_FALSE(named.Repeats("r" + std::to_string(i), ids));
  }
  EXPECT_EQ(named.size(), NamedBlocks::kMaxRequests);
  EXPECT_TRUE(named.Repeats("r0", ids));
  EXPECT_FALSE(named.Repeats("one more", ids));
  EXPECT_EQ(named.size(), 1u);
  EXPECT_FALSE(named.Repeats("r0", ids));  // forgotten: sent again, which is always allowed
}

}  // namespace
}  // namespace kv::connector
