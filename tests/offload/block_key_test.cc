#include "daemon/offload/block_key.h"

#include <gtest/gtest.h>

#include <vector>

namespace kv::offload {
namespace {

TEST(BlockKey, AcceptsSixtyFourToTwoHundredFiftySixBits) {
  std::vector<uint8_t> bytes(33, 0xab);
  EXPECT_EQ(BlockKey::FromBytes({bytes.data(), 7}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(BlockKey::FromBytes({bytes.data(), 33}).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(BlockKey::FromBytes({bytes.data(), 8}).ok());
  auto key = BlockKey::FromBytes({bytes.data(), 32});
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->bytes().size(), 32u);
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += "ab";
  EXPECT_EQ(key->ToHex(), hex);
}

TEST(BlockKey, LengthIsPartOfIdentity) {
  std::vector<uint8_t> zeros(9, 0);
  auto eight = BlockKey::FromBytes({zeros.data(), 8});
  auto nine = BlockKey::FromBytes({zeros.data(), 9});
  ASSERT_TRUE(eight.ok() && nine.ok());
  EXPECT_FALSE(*eight == *nine);
  EXPECT_EQ(*eight, BlockKey::FromUint64(0));
}

TEST(BlockKey, Uint64IsLittleEndian) {
  BlockKey key = BlockKey::FromUint64(0x0102030405060708ULL);
  EXPECT_EQ(key.ToHex(), "0807060504030201");
  EXPECT_NE(key.Hash(), BlockKey::FromUint64(0x0102030405060709ULL).Hash());
}

}  // namespace
}  // namespace kv::offload
