// `kvctl plan` and `kvctl explain` end to end, through the same dispatcher kvctl's main uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/common/cli_capture.h"

namespace kv {
namespace {

using Outcome = testing::CliOutcome;

Outcome Kvctl(std::vector<std::string> args) {
  return testing::RunCli("kvctl", std::move(args));
}

std::string Example(const std::string& name) {
  return std::string(KV_EXAMPLES_DIR) + "/" + name;
}

std::vector<std::string> DemoArgs() {
  return {"plan",
          "--src",
          Example("prefill_lbnhc.json"),
          "--dst",
          Example("decode_blhnc.json"),
          "--src-blocks",
          "5,9,2",
          "--dst-blocks",
          "7,3",
          "--tokens",
          "40"};
}

TEST(KvctlPlan, DemoCommandSummarises) {
  Outcome o = Kvctl(DemoArgs());
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("runs        1280"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("bytes       655360"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("bytes/run   512 B"), std::string::npos) << o.out;
  EXPECT_TRUE(o.err.empty()) << o.err;
}

TEST(KvctlPlan, JsonListsEveryRun) {
  auto args = DemoArgs();
  args.push_back("--json");
  Outcome o = Kvctl(args);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out.rfind("{\"runs\": [[", 0), 0u) << o.out.substr(0, 80);
  EXPECT_NE(o.out.find("], \"bytes\": 655360}\n"), std::string::npos);
  // 1280 runs of three numbers each.
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '['), 1281);
}

TEST(KvctlPlan, BadInputIsOneLineOnStderr) {
  const std::vector<std::vector<std::string>> cases = {
      {"plan", "--src", Example("prefill_lbnhc.json")},  // missing flags
      {"plan", "--src", "/nonexistent.json", "--dst", "x", "--src-blocks", "1", "--dst-blocks", "1",
       "--tokens", "1"},    // unreadable file
      {"plan", "--bogus"},  // unknown flag
  };
  for (const auto& args : cases) {
    Outcome o = Kvctl(args);
    EXPECT_NE(o.exit_code, 0) << args.back();
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
    EXPECT_EQ(o.err.rfind("kvctl plan: ", 0), 0u) << o.err;
  }
  auto too_few = DemoArgs();
  too_few[6] = "5,9";  // --src-blocks
  Outcome o = Kvctl(too_few);
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.err.find("too few source blocks"), std::string::npos) << o.err;
}

TEST(KvctlPlan, HelpTeachesTheFileFormat) {
  Outcome o = Kvctl({"plan", "--help"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_NE(o.out.find("--src-blocks"), std::string::npos);
  EXPECT_NE(o.out.find("total_heads"), std::string::npos);
}

TEST(KvctlExplain, DescribesPagesKvAndHeads) {
  Outcome o = Kvctl({"explain", "--layout", Example("decode_tp2_rank1.json")});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("holds global heads [4, 8)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("K = bytes [0, 256)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("contiguous"), std::string::npos) << o.out;
  Outcome bad = Kvctl({"explain"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_EQ(bad.err.rfind("kvctl explain: ", 0), 0u) << bad.err;
}

}  // namespace
}  // namespace kv
