// kvctl plan: prints the byte runs that move a request between two layouts.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "layout/plan.h"
#include "layout/rank_pairs.h"
#include "tools/common/cli.h"
#include "tools/kvctl/human_bytes.h"
#include "tools/kvctl/layout_json.h"

namespace kv::tools {
namespace {

constexpr size_t kRunsShown = 8;
constexpr size_t kPairsShown = 16;

cli::Flags PlanFlags() {
  return {
      {"src", "source layout file (JSON, see below)"},
      {"dst", "destination layout file"},
      {"src-blocks", "source block ids in token order, e.g. 5,9,2 or 0-15"},
      {"dst-blocks", "destination block ids in token order"},
      {"tokens", "tokens of the request; block t/block_size holds token t"},
      {"layers", "layer range FIRST-LAST (inclusive) or one layer; default every layer"},
      {"json",
       "print {\"runs\": [[src_offset, dst_offset, length], ...], \"bytes\": N, \"pairs\": "
       "[[src_rank, dst_rank, first_head, heads], ...]}",
       true},
      {"help", "this text", true},
  };
}

void PrintHelp(const cli::Flags& flags) {
  std::printf(
      "usage: kvctl plan --src SRC.json --dst DST.json --src-blocks 5,9,2 --dst-blocks 7,3 "
      "--tokens 40 [--json]\n\n"
      "Plans the copy of a request's KV cache from one layout to another: for every layer,\n"
      "token and head held by both ranks, each content byte of the source goes to the\n"
      "destination. The plan is a list of runs (src_offset, dst_offset, length) in bytes from\n"
      "each region's base, merged wherever one continues another on both sides, so the run\n"
      "count is the minimum; executors post one descriptor per run.\n\n"
      "The rank pairing of the two TP sizes is printed too: which source rank feeds which\n"
      "destination rank with which global heads (every destination head from exactly one source\n"
      "rank; with MLA or replicated heads, one copy of several). kvd sends the files' two ranks\n"
      "nothing, and the plan is empty, where the pairing gives them no heads.\n\n"
      "flags:\n%s\n%s\n"
      "example:\n"
      "  kvctl plan --src tools/examples/prefill_lbnhc.json --dst "
      "tools/examples/decode_blhnc.json \\\n"
      "             --src-blocks 5,9,2 --dst-blocks 7,3 --tokens 40\n",
      flags.Help().c_str(), LayoutFileHelp());
}

std::string Describe(const KvRegion& r) {
  char text[160];
  std::snprintf(text, sizeof(text),
                "%-6s %lld layers x %lld blocks x %lld heads x %lld tokens x %lld B%s, tp %d/%d",
                r.order().c_str(), static_cast<long long>(r.size(Axis::kL)),
                static_cast<long long>(r.size(Axis::kB)), static_cast<long long>(r.size(Axis::kH)),
                static_cast<long long>(r.size(Axis::kN)), static_cast<long long>(r.size(Axis::kC)),
                r.has_kv_axis() ? " x 2 (K, V)" : "", r.spec().tp_rank, r.spec().tp_size);
  return text;
}

// "3" or "2-5" (inclusive) into [begin, end).
Status ParseLayers(const std::string& text, TransferSpec& spec) {
  std::vector<int64_t> bounds;
  size_t dash = text.find('-');
  for (const std::string& part :
       {text.substr(0, dash), dash == std::string::npos ? text : text.substr(dash + 1)}) {
    char* end = nullptr;
    long long value = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || value < 0)
      return Status::InvalidArgument("--layers: '" + text + "' is not a layer or FIRST-LAST");
    bounds.push_back(value);
  }
  if (bounds[1] < bounds[0])
    return Status::InvalidArgument("--layers: '" + text + "' ends before it begins");
  spec.layer_begin = bounds[0];
  spec.layer_end = bounds[1] + 1;
  return Status::Ok();
}

void PrintJson(const Plan& plan, const std::vector<RankPair>& pairs) {
  std::string out = "{\"runs\": [";
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const Run& r = plan.runs[i];
    if (i > 0) out += ", ";
    out += "[" + std::to_string(r.src_offset) + ", " + std::to_string(r.dst_offset) + ", " +
           std::to_string(r.length) + "]";
  }
  out += "], \"bytes\": " + std::to_string(plan.bytes) + ", \"pairs\": [";
  for (size_t i = 0; i < pairs.size(); ++i) {
    const RankPair& p = pairs[i];
    if (i > 0) out += ", ";
    out += "[" + std::to_string(p.src_rank) + ", " + std::to_string(p.dst_rank) + ", " +
           std::to_string(p.first_head) + ", " + std::to_string(p.heads) + "]";
  }
  out += "]}\n";
  std::fputs(out.c_str(), stdout);
}

std::string HeadRange(int64_t first, int64_t count) {
  return "[" + std::to_string(first) + ", " + std::to_string(first + count) + ")";
}

// The pairing of the two TP sizes, and what it gives the files' two ranks.
void PrintPairs(const KvRegion& src, const KvRegion& dst, const std::vector<RankPair>& pairs,
                const std::optional<RankPair>& mine) {
  std::printf("rank pairs  %zu for source tp %d -> destination tp %d:\n", pairs.size(),
              src.spec().tp_size, dst.spec().tp_size);
  const size_t shown = std::min(pairs.size(), kPairsShown);
  for (size_t i = 0; i < shown; ++i) {
    const RankPair& p = pairs[i];
    std::printf("  source %d -> destination %d  heads %s\n", p.src_rank, p.dst_rank,
                HeadRange(p.first_head, p.heads).c_str());
  }
  if (shown < pairs.size()) std::printf("  ... %zu more\n", pairs.size() - shown);
  const int s = src.spec().tp_rank, d = dst.spec().tp_rank;
  if (mine) {
    std::printf("this pair   source %d -> destination %d moves heads %s\n", s, d,
                HeadRange(mine->first_head, mine->heads).c_str());
    return;
  }
  std::string from;
  for (const RankPair& p : pairs) {
    if (p.dst_rank == d) from += (from.empty() ? "" : ", ") + std::to_string(p.src_rank);
  }
  std::printf(
      "this pair   source %d -> destination %d moves nothing: destination %d takes its "
      "heads from source %s\n",
      s, d, d, from.c_str());
}

void PrintSummary(const KvRegion& src, const KvRegion& dst, const TransferSpec& spec,
                  const Plan& plan) {
  const int64_t layer_end = spec.layer_end == -1 ? src.size(Axis::kL) : spec.layer_end;
  std::printf("request     %lld tokens, layers [%lld, %lld)\n", static_cast<long long>(spec.tokens),
              static_cast<long long>(spec.layer_begin), static_cast<long long>(layer_end));
  std::printf("source      %s\n", Describe(src).c_str());
  std::printf("destination %s\n", Describe(dst).c_str());
  const int64_t head_begin = std::max(src.first_global_head(), dst.first_global_head());
  const int64_t head_end = std::min(src.first_global_head() + src.size(Axis::kH),
                                    dst.first_global_head() + dst.size(Axis::kH));
  std::printf("heads       global [%lld, %lld) of %lld, held by both\n",
              static_cast<long long>(head_begin), static_cast<long long>(head_end),
              static_cast<long long>(src.total_heads()));
  std::printf("runs        %zu\n", plan.runs.size());
  std::printf("bytes       %llu (%s)\n", static_cast<unsigned long long>(plan.bytes),
              HumanBytes(plan.bytes).c_str());
  if (plan.runs.empty()) return;
  std::printf("bytes/run   %s\n", HumanBytes(plan.bytes / plan.runs.size()).c_str());
  const size_t shown = std::min(plan.runs.size(), kRunsShown);
  std::printf("first %zu runs (src_offset -> dst_offset, length):\n", shown);
  for (size_t i = 0; i < shown; ++i) {
    const Run& r = plan.runs[i];
    std::printf("  %14llu -> %14llu  %llu\n", static_cast<unsigned long long>(r.src_offset),
                static_cast<unsigned long long>(r.dst_offset),
                static_cast<unsigned long long>(r.length));
  }
  if (shown < plan.runs.size()) std::printf("  ... %zu more\n", plan.runs.size() - shown);
}

int Fail(const Status& status) {
  return cli::Fail("kvctl plan", status);
}

int PlanMain(int argc, char** argv) {
  cli::Flags flags = PlanFlags();
  if (Status s = flags.Parse(argc, argv); !s.ok()) return Fail(s);
  if (flags.has("help")) {
    PrintHelp(flags);
    return 0;
  }
  if (!flags.positional().empty())
    return Fail(Status::InvalidArgument("unexpected argument '" + flags.positional()[0] + "'"));
  for (const char* required : {"src", "dst", "src-blocks", "dst-blocks", "tokens"}) {
    if (!flags.has(required))
      return Fail(Status::InvalidArgument(std::string("--") + required +
                                          " is required (kvctl plan --help)"));
  }
  auto src = LoadRegion(flags.str("src"));
  if (!src.ok()) return Fail(src.status());
  auto dst = LoadRegion(flags.str("dst"));
  if (!dst.ok()) return Fail(dst.status());
  auto src_blocks = flags.int_list("src-blocks");
  if (!src_blocks.ok()) return Fail(src_blocks.status());
  auto dst_blocks = flags.int_list("dst-blocks");
  if (!dst_blocks.ok()) return Fail(dst_blocks.status());
  auto tokens = flags.integer("tokens", 0, 0);
  if (!tokens.ok()) return Fail(tokens.status());

  TransferSpec spec{*src_blocks, *dst_blocks, *tokens};
  if (flags.has("layers")) {
    if (Status s = ParseLayers(flags.str("layers"), spec); !s.ok()) return Fail(s);
  }
  auto plan = PlanTransfer(*src, *dst, spec);
  if (!plan.ok()) return Fail(plan.status());
  auto pairs = PairRanks(TpShape::Of(*src), TpShape::Of(*dst));
  if (!pairs.ok()) return Fail(pairs.status());
  auto mine = PairOf(*src, *dst);
  if (!mine.ok()) return Fail(mine.status());
  // Ranks the pairing does not pair (another copy feeds the destination): kvd sends nothing.
  if (!mine->has_value()) *plan = Plan{};
  if (flags.has("json")) {
    PrintJson(*plan, *pairs);
  } else {
    PrintSummary(*src, *dst, spec, *plan);
    PrintPairs(*src, *dst, *pairs, *mine);
  }
  return 0;
}

const bool registered = cli::Register(
    {"plan", "print the byte runs that move a request between two layouts", &PlanMain});

}  // namespace
}  // namespace kv::tools
