#include <gtest/gtest.h>

#include <set>
#include <string>

#include "base/hmac.h"

namespace kv::crypto {
namespace {

// Tokens and nonces come from here: each call must give exactly the bytes asked for, and fresh
// ones every time.
TEST(RandomBytes, GivesTheBytesAskedForAndFreshOnesEachCall) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{16}, size_t{32}, size_t{4096}}) {
    auto bytes = RandomBytes(n);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    EXPECT_EQ(bytes->size(), n);
  }
  // 64 tokens of 16 bytes: a repeat, or an all-zero one, has probability ~2^-116.
  std::set<std::string> seen;
  for (int i = 0; i < 64; ++i) {
    auto token = RandomBytes(16);
    ASSERT_TRUE(token.ok());
    EXPECT_NE(*token, std::string(16, '\0'));
    EXPECT_TRUE(seen.insert(*token).second) << "a 16-byte token came twice";
  }
}

// Above 256 bytes getrandom(2) may return fewer than asked when a signal interrupts it: the
// loop must fill the rest, so no tail of a large request stays zero.
TEST(RandomBytes, FillsALargeRequestToItsEnd) {
  auto bytes = RandomBytes(1 << 20);
  ASSERT_TRUE(bytes.ok());
  ASSERT_EQ(bytes->size(), size_t{1} << 20);
  EXPECT_NE(bytes->substr(bytes->size() - 64), std::string(64, '\0'));
}

}  // namespace
}  // namespace kv::crypto
