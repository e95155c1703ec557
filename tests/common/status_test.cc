#include "base/status.h"

#include <gtest/gtest.h>

namespace kv {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status Chain(int x, int* out) {
  KV_ASSIGN_OR_RETURN(int h, Half(x));
  KV_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(Status, OkAndErrorsCarryCodeAndMessage) {
  EXPECT_TRUE(Status().ok());
  Status s = Status::OutOfRange("block 9 outside [0, 8)");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.ToString(), "out_of_range: block 9 outside [0, 8)");
  EXPECT_EQ(s.WithContext("peer b").message(), "peer b: block 9 outside [0, 8)");
}

TEST(Status, ResultPropagatesThroughMacros) {
  int out = 0;
  EXPECT_TRUE(Chain(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Chain(6, &out);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
}

}  // namespace
}  // namespace kv
