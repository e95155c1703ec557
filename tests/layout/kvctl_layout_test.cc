// `kvctl plan` and `kvctl explain` end to end, through the same dispatcher kvctl's main uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/support/cli_capture.h"

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
  EXPECT_NE(o.out.find("], \"bytes\": 655360, \"pairs\": [[0, 0, 0, 8]]}\n"), std::string::npos);
  // 1280 runs of three numbers each, and one rank pair.
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '['), 1283);
}

TEST(KvctlPlan, PrintsTheRankPairing) {
  Outcome demo = Kvctl(DemoArgs());
  ASSERT_EQ(demo.exit_code, 0) << demo.err;
  EXPECT_NE(demo.out.find("rank pairs  1 for source tp 1 -> destination tp 1"), std::string::npos)
      << demo.out;
  EXPECT_NE(demo.out.find("this pair   source 0 -> destination 0 moves heads [0, 8)"),
            std::string::npos)
      << demo.out;
  // TP 1 -> 2: the one prefill rank feeds each decode rank its half.
  Outcome split = Kvctl({"plan", "--src", Example("prefill_lbnhc.json"), "--dst",
                         Example("decode_tp2_rank1.json"), "--src-blocks", "0-3", "--dst-blocks",
                         "0-3", "--tokens", "64"});
  ASSERT_EQ(split.exit_code, 0) << split.err;
  EXPECT_NE(split.out.find("  source 0 -> destination 0  heads [0, 4)\n"
                           "  source 0 -> destination 1  heads [4, 8)\n"),
            std::string::npos)
      << split.out;
  EXPECT_NE(split.out.find("moves heads [4, 8)"), std::string::npos) << split.out;
  // MLA, TP 4 -> 4: decode rank 0 reads prefill rank 0, so rank 3 sends it nothing.
  Outcome mla =
      Kvctl({"plan", "--src", Example("mla_rank3.json"), "--dst", Example("mla_rank0.json"),
             "--src-blocks", "0", "--dst-blocks", "1", "--tokens", "64"});
  ASSERT_EQ(mla.exit_code, 0) << mla.err;
  EXPECT_NE(mla.out.find("runs        0\n"), std::string::npos) << mla.out;
  EXPECT_NE(mla.out.find("source 3 -> destination 0 moves nothing: destination 0 takes its "
                         "heads from source 0"),
            std::string::npos)
      << mla.out;
  Outcome same =
      Kvctl({"plan", "--src", Example("mla_rank0.json"), "--dst", Example("mla_rank0.json"),
             "--src-blocks", "0", "--dst-blocks", "1", "--tokens", "64", "--json"});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_NE(same.out.find("\"pairs\": [[0, 0, 0, 1], [1, 1, 0, 1], [2, 2, 0, 1], [3, 3, 0, 1]]"),
            std::string::npos)
      << same.out;
  EXPECT_EQ(same.out.find("\"runs\": []"), std::string::npos) << same.out;
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
