// kvctl's layout files: the shipped examples load and plan; malformed files fail naming the
// file and the key.
#include "tools/kvctl/layout_json.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "layout/plan.h"

namespace kv::tools {
namespace {

std::string Example(const std::string& name) {
  return std::string(KV_EXAMPLES_DIR) + "/" + name;
}

// Writes `text` to a fresh file under the test's temporary directory.
std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(LayoutJson, EveryExampleLoads) {
  for (const char* name :
       {"prefill_lbnhc.json", "decode_blhnc.json", "legacy_sbnhc.json", "decode_tp2_rank0.json",
        "decode_tp2_rank1.json", "mla_rank0.json", "mla_rank3.json", "padded_lbnhc.json"}) {
    auto region = LoadRegion(Example(name));
    EXPECT_TRUE(region.ok()) << name << ": " << region.status().ToString();
  }
}

TEST(LayoutJson, DemoRequestPlans) {
  // The request tools/demo.sh runs: LBNHC blocks of 16 into BLHNC blocks of 32.
  auto src = LoadRegion(Example("prefill_lbnhc.json"));
  auto dst = LoadRegion(Example("decode_blhnc.json"));
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<int64_t> src_blocks = {5, 9, 2}, dst_blocks = {7, 3};
  auto plan = PlanTransfer(*src, *dst, {src_blocks, dst_blocks, 40});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->bytes, 4u * 40 * 8 * 512);
  EXPECT_EQ(plan->runs.size(), 4u * 40 * 8);
}

TEST(LayoutJson, ReadsOptionalKeys) {
  auto spec = ReadLayoutFile(WriteFile("full.json", R"({"order": "BSNHC", "layers": 2,
      "blocks": 8, "heads": 2, "block_size": 4, "content_bytes": 64,
      "strides": {"B": 4096, "S": 1024}, "tp_rank": 1, "tp_size": 4, "total_heads": 8,
      "replicated": false, "region_bytes": 1000000})"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->order, "BSNHC");
  EXPECT_EQ(spec->strides[static_cast<int>(Axis::kB)], 4096);
  EXPECT_EQ(spec->strides[static_cast<int>(Axis::kS)], 1024);
  EXPECT_EQ(spec->tp_rank, 1);
  EXPECT_EQ(spec->total_heads, 8);
  EXPECT_EQ(spec->region_bytes, 1000000);
}

TEST(LayoutJson, TotalHeadsDefaultsToHeadsTimesRanks) {
  auto region = LoadRegion(Example("decode_tp2_rank1.json"));
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(region->total_heads(), 8);
  EXPECT_EQ(region->global_head(0), 4);
}

struct BadFile {
  const char* keys;      // written before the valid keys
  const char* expected;  // a part of the message
};

TEST(LayoutJson, RejectsBadFilesNamingFileAndKey) {
  const std::string base =
      R"("order": "LBNHC", "blocks": 8, "heads": 2, "block_size": 4, "content_bytes": 64)";
  const BadFile cases[] = {
      {"", "missing required key 'layers'"},
      {R"("layers": 2, "colour": 3, )", "unknown key 'colour'"},
      {R"("layers": 2.5, )", "'layers' must be an integer, got '2.5'"},
      {R"("layers": "two", )", "'layers' must be an integer"},
      {R"("layers": 2, "replicated": 1, )", "'replicated' must be true or false"},
      {R"("layers": 2, "strides": {"X": 4}, )", "unknown axis 'strides.X'"},
      {R"("layers": 2, "strides": {"B": -4}, )", "must not be negative"},
      {R"("layers": 2, "tp_size": 99999999999, )", "'tp_size' is out of range"},
      {R"("layers": 2, "layers": 3, )", "'layers' appears twice"},
  };
  int i = 0;
  for (const BadFile& bad : cases) {
    const std::string path =
        WriteFile("bad" + std::to_string(i++) + ".json", "{" + std::string(bad.keys) + base + "}");
    auto region = LoadRegion(path);
    ASSERT_FALSE(region.ok()) << bad.keys;
    const std::string message = region.status().message();
    EXPECT_NE(message.find(bad.expected), std::string::npos) << message;
    EXPECT_NE(message.find(path), std::string::npos) << message;
  }
}

TEST(LayoutJson, RejectsInvalidJson) {
  auto region = LoadRegion(WriteFile("truncated.json", R"({"order": "LBNHC", "layers": )"));
  ASSERT_FALSE(region.ok());
  EXPECT_NE(region.status().message().find("not valid JSON"), std::string::npos);
}

TEST(LayoutJson, MissingFileIsNotFound) {
  auto region = LoadRegion(::testing::TempDir() + "/no_such_layout.json");
  ASSERT_FALSE(region.ok());
  EXPECT_EQ(region.status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace kv::tools
