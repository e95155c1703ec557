// `kvctl offload` sizing through kvctl's dispatcher: the slot of a layout with a K/V axis (S)
// holds the same bytes as the packed layout's, and a scattered block's copies are counted from
// the plan (K and V pages apart cost two runs per layer).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/cli_capture.h"

namespace kv {
namespace {

using Outcome = testing::CliOutcome;

Outcome Kvctl(std::vector<std::string> args) {
  return testing::RunCli("kvctl", std::move(args));
}

Outcome Size(const std::string& order) {
  return Kvctl({"offload", "--order", order, "--offload-bytes", "1G", "--json"});
}

TEST(KvctlOffload, PackedLayoutSlotIsOneBlockOfEveryLayer) {
  Outcome o = Size("LBNHC");  // Llama-3-8B: 32 layers × 8 heads × 16 tokens × 512 B = 2 MiB
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("\"slot_bytes\": 2097152,"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("\"slots\": 512,"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("\"runs_per_scattered_block\": 32}"), std::string::npos) << o.out;
}

TEST(KvctlOffload, KvAxisLayoutIsSizedLikeThePackedOne) {
  for (const char* order : {"LSBNHC", "LBNHSC", "BLSNHC"}) {
    Outcome o = Size(order);
    ASSERT_EQ(o.exit_code, 0) << order << ": " << o.err;
    EXPECT_NE(o.out.find("\"slot_bytes\": 2097152,"), std::string::npos) << order << ": " << o.out;
    EXPECT_NE(o.out.find("\"slots\": 512,"), std::string::npos) << order << ": " << o.out;
  }
  // K and V of a layer lie apart only when S is outside B.
  EXPECT_NE(Size("LSBNHC").out.find("\"runs_per_scattered_block\": 64}"), std::string::npos);
  EXPECT_NE(Size("LBNHSC").out.find("\"runs_per_scattered_block\": 32}"), std::string::npos);
  EXPECT_NE(Size("BLSNHC").out.find("\"runs_per_scattered_block\": 1}"), std::string::npos);
}

TEST(KvctlOffload, ProbedPoolHoldsTheSizedSlots) {
  Outcome o =
      Kvctl({"offload", "--order", "LSBNHC", "--offload-bytes", "64M", "--probe", "--json"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("\"slots\": 32,"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("\"capacity_slots\": 32,"), std::string::npos) << o.out;
}

TEST(KvctlOffload, TextNamesTheLogicalBlockShape) {
  Outcome o = Kvctl({"offload", "--order", "LSBNHC", "--offload-bytes", "1G"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("32 layers × 8 heads × 16 tokens × 512 B"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("holds      512 blocks = 8192 tokens"), std::string::npos) << o.out;
}

}  // namespace
}  // namespace kv
