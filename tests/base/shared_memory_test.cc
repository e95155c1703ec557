// SharedMemory: what an engine writes before handing its memfd over is what kvd sees (populating
// kvd's mapping must not change a byte), and writes through either mapping reach the other.
#include "base/shared_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

namespace kv {
namespace {

TEST(SharedMemory, AdoptedMappingSharesTheEnginesBytesBothWays) {
  const uint64_t bytes = 3 << 20;
  auto engine = SharedMemory::Create(bytes, "engine");
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto* mine = static_cast<unsigned char*>(engine->data());
  for (uint64_t i = 0; i < bytes / 2; ++i) mine[i] = static_cast<unsigned char>(i * 7 + 1);

  auto kvd = SharedMemory::Adopt(dup(engine->fd()), bytes);
  ASSERT_TRUE(kvd.ok()) << kvd.status().ToString();
  ASSERT_EQ(kvd->size(), bytes);
  auto* theirs = static_cast<unsigned char*>(kvd->data());
  EXPECT_EQ(0, std::memcmp(mine, theirs, bytes));  // the second half still zero on both sides
  EXPECT_EQ(theirs[bytes - 1], 0);

  for (uint64_t i = bytes / 2; i < bytes; ++i) theirs[i] = static_cast<unsigned char>(i * 3 + 2);
  EXPECT_EQ(0, std::memcmp(mine, theirs, bytes));
}

TEST(SharedMemory, AdoptRefusesAnObjectSmallerThanClaimed) {
  auto engine = SharedMemory::Create(4096, "small");
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ(SharedMemory::Adopt(dup(engine->fd()), 8192).status().code(), Code::kOutOfRange);
  EXPECT_EQ(SharedMemory::Adopt(dup(engine->fd()), 0).status().code(), Code::kOutOfRange);
}

}  // namespace
}  // namespace kv
