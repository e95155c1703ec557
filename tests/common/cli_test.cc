#include "tools/common/cli.h"

#include <gtest/gtest.h>

namespace kv::cli {
namespace {

TEST(Flags, ParsesValuesListsAndSizes) {
  Flags f({{"tokens", ""}, {"blocks", ""}, {"size", ""}, {"json", "", true}});
  const char* argv[] = {"plan", "--tokens", "40", "--blocks=5,9,0-2", "--size", "4M", "--json"};
  ASSERT_TRUE(f.Parse(7, const_cast<char**>(argv)).ok());
  EXPECT_EQ(*f.integer("tokens", 0), 40);
  EXPECT_EQ(*f.int_list("blocks"), (std::vector<int64_t>{5, 9, 0, 1, 2}));
  EXPECT_EQ(*f.bytes("size", 0), 4u << 20);
  EXPECT_TRUE(f.has("json"));
}

TEST(Flags, RejectsUnknownAndMalformed) {
  Flags f({{"tokens", ""}});
  const char* bad[] = {"plan", "--nope", "1"};
  EXPECT_EQ(f.Parse(3, const_cast<char**>(bad)).code(), Code::kInvalidArgument);
  Flags g({{"tokens", ""}});
  const char* missing[] = {"plan", "--tokens"};
  EXPECT_FALSE(g.Parse(2, const_cast<char**>(missing)).ok());
  Flags h({{"tokens", ""}});
  const char* word[] = {"plan", "--tokens", "4x"};
  ASSERT_TRUE(h.Parse(3, const_cast<char**>(word)).ok());
  EXPECT_FALSE(h.integer("tokens", 0).ok());
  EXPECT_FALSE(h.integer("tokens", 0, 0, 3).ok());
  Flags huge({{"size", ""}});
  const char* wraps[] = {"pool", "--size", "17179869184G"};  // 2^34 GiB = 2^64 bytes
  ASSERT_TRUE(huge.Parse(3, const_cast<char**>(wraps)).ok());
  EXPECT_EQ(huge.bytes("size", 0).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kv::cli
