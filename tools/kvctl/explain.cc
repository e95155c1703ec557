// kvctl explain: what a layout file means: axes, strides, pages, where K and V lie, TP heads.
#include <cstdio>
#include <string>

#include "layout/kv_region.h"
#include "tools/common/cli.h"
#include "tools/kvctl/human_bytes.h"
#include "tools/kvctl/layout_json.h"

namespace kv::tools {
namespace {

using ll = long long;

const char* AxisMeaning(char axis) {
  switch (axis) {
    case 'L':
      return "layer";
    case 'B':
      return "block";
    case 'H':
      return "KV head on this rank";
    case 'N':
      return "token slot in a block";
    case 'S':
      return "K (0) or V (1)";
    default:
      return "content bytes of one head-token";
  }
}

void PrintAxes(const KvRegion& r) {
  std::printf("order     %s (outermost first)\n", r.order().c_str());
  std::printf("  axis %10s %14s  meaning\n", "size", "stride (B)");
  for (char name : r.order()) {
    const Axis axis = *AxisFromName(name);
    std::printf("  %c    %10lld %14lld  %s\n", name, static_cast<ll>(r.size(axis)),
                static_cast<ll>(r.stride(axis)), AxisMeaning(name));
  }
  std::printf("span      %llu bytes (%s)\n", static_cast<unsigned long long>(r.span_bytes()),
              HumanBytes(r.span_bytes()).c_str());
}

void PrintPages(const KvRegion& r) {
  const char* shape =
      r.page_is_contiguous() ? "contiguous" : "scattered: heads or K/V lie outside the block";
  if (r.blocks_first()) {
    std::printf("page      blocks first: block b of every layer at b x %lld, %s, %s\n",
                static_cast<ll>(r.stride(Axis::kB)), HumanBytes(r.page_bytes()).c_str(), shape);
    std::printf("          viewed as (%lld blocks, %llu bytes) with row stride %lld\n",
                static_cast<ll>(r.size(Axis::kB)), static_cast<unsigned long long>(r.page_bytes()),
                static_cast<ll>(r.stride(Axis::kB)));
  } else {
    std::printf("page      per layer: block b of layer l at l x %lld + b x %lld, %s, %s\n",
                static_cast<ll>(r.stride(Axis::kL)), static_cast<ll>(r.stride(Axis::kB)),
                HumanBytes(r.page_bytes()).c_str(), shape);
  }
}

void PrintKv(const KvRegion& r) {
  const KvRegion::KvLocation kv = r.kv(0, 0, 0, 0);
  if (r.spec().replicated && !r.has_kv_axis()) {
    std::printf(
        "K/V       none to split: a replicated (MLA-style) cache holds one latent vector "
        "of %lld bytes per token\n",
        static_cast<ll>(r.size(Axis::kC)));
  } else if (r.has_kv_axis()) {
    std::printf(
        "K/V       on the S axis: K at S = 0, V at S = 1 (%lld bytes apart), %llu bytes "
        "each\n",
        static_cast<ll>(r.stride(Axis::kS)), static_cast<unsigned long long>(kv.bytes));
  } else {
    std::printf("K/V       packed in C: K = bytes [0, %llu), V = [%llu, %llu) of each head-token\n",
                static_cast<unsigned long long>(kv.bytes),
                static_cast<unsigned long long>(kv.bytes),
                static_cast<unsigned long long>(2 * kv.bytes));
  }
}

void PrintHeads(const KvRegion& r) {
  const LayoutSpec& s = r.spec();
  std::printf("TP        rank %d of %d, %lld global heads: ", s.tp_rank, s.tp_size,
              static_cast<ll>(s.total_heads));
  if (s.replicated) {
    std::printf("replicated cache (MLA), every rank holds every head\n");
  } else if (s.total_heads < s.tp_size) {
    std::printf("fewer heads than ranks, holds the one replicated head %lld (on %lld ranks)\n",
                static_cast<ll>(r.first_global_head()), static_cast<ll>(s.tp_size / s.total_heads));
  } else {
    std::printf("holds global heads [%lld, %lld)\n", static_cast<ll>(r.first_global_head()),
                static_cast<ll>(r.first_global_head() + r.size(Axis::kH)));
  }
}

int ExplainMain(int argc, char** argv) {
  cli::Flags flags = {
      {"layout", "layout file (JSON) to explain"},
      {"help", "this text", true},
  };
  auto fail = [](const Status& s) { return cli::Fail("kvctl explain", s); };
  if (Status s = flags.Parse(argc, argv); !s.ok()) return fail(s);
  if (flags.has("help")) {
    std::printf(
        "usage: kvctl explain --layout FILE.json\n\n"
        "Shows what a layout file describes: each axis with its size and byte stride, the\n"
        "bytes the region spans, what a page is (blocks first: one block of every layer;\n"
        "otherwise one block of one layer), where K and V lie, and the global KV heads this\n"
        "tensor-parallel rank holds.\n\nflags:\n%s\n%s",
        flags.Help().c_str(), LayoutFileHelp());
    return 0;
  }
  if (!flags.has("layout")) return fail(Status::InvalidArgument("--layout is required"));
  auto region = LoadRegion(flags.str("layout"));
  if (!region.ok()) return fail(region.status());
  std::printf("layout    %s\n", flags.str("layout").c_str());
  PrintAxes(*region);
  PrintPages(*region);
  PrintKv(*region);
  PrintHeads(*region);
  return 0;
}

const bool registered = cli::Register(
    {"explain", "show what a layout file means: axes, pages, K/V, TP heads", &ExplainMain});

}  // namespace
}  // namespace kv::tools
