// TP rank pairing (layout/rank_pairs.h): properties over random TP sizes on both sides, split and
// replicated heads and MLA, and the bytes the pairs' plans write, each destination byte once.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "layout/kv_region.h"
#include "layout/plan.h"
#include "layout/rank_pairs.h"

namespace kv {
namespace {

// A small dense cache of one rank of `shape`.
KvRegion Region(const TpShape& shape, int rank) {
  LayoutSpec spec;
  spec.order = "LBNHC";
  spec.layers = 2;
  spec.blocks = 2;
  spec.block_size = 2;
  spec.content_bytes = 4;
  spec.heads = shape.replicated                     ? shape.total_heads
               : shape.total_heads >= shape.tp_size ? shape.total_heads / shape.tp_size
                                                    : 1;
  spec.total_heads = shape.total_heads;
  spec.replicated = shape.replicated;
  spec.tp_rank = rank;
  spec.tp_size = shape.tp_size;
  auto region = KvRegion::Create(spec);
  EXPECT_TRUE(region.ok()) << region.status().ToString();
  return *region;
}

// A valid shape for `total` heads: a TP size that divides it or that it divides, or MLA.
TpShape RandomShape(std::mt19937& rng, int64_t total) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  TpShape s;
  s.total_heads = total;
  if (pick(0, 4) == 0) {
    s.replicated = true;
    s.tp_size = pick(1, 8);
    return s;
  }
  std::vector<int> sizes;
  for (int tp = 1; tp <= 16; ++tp) {
    if (total % tp == 0 || tp % total == 0) sizes.push_back(tp);
  }
  s.tp_size = sizes[pick(0, static_cast<int>(sizes.size()) - 1)];
  return s;
}

std::string Describe(const TpShape& s) {
  return "tp " + std::to_string(s.tp_size) + ", " + std::to_string(s.total_heads) + " heads" +
         (s.replicated ? ", replicated" : "");
}

// The properties of one pairing: every destination head slot is fed by exactly one source rank
// that holds that head; a pair moves exactly the heads its ranks share; PairOf agrees.
void CheckPairing(const TpShape& src, const TpShape& dst) {
  SCOPED_TRACE("source " + Describe(src) + " -> destination " + Describe(dst));
  auto pairs = PairRanks(src, dst);
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  std::vector<KvRegion> s, d;
  for (int r = 0; r < src.tp_size; ++r) s.push_back(Region(src, r));
  for (int r = 0; r < dst.tp_size; ++r) d.push_back(Region(dst, r));

  std::map<std::pair<int, int>, RankPair> by_ranks;
  std::map<std::pair<int, int64_t>, int> feeds;  // (destination rank, global head) -> pairs
  for (const RankPair& p : *pairs) {
    ASSERT_GE(p.src_rank, 0);
    ASSERT_LT(p.src_rank, src.tp_size);
    ASSERT_GE(p.dst_rank, 0);
    ASSERT_LT(p.dst_rank, dst.tp_size);
    EXPECT_GT(p.heads, 0);
    EXPECT_TRUE(by_ranks.emplace(std::pair{p.src_rank, p.dst_rank}, p).second) << "pair twice";
    // The pair moves exactly the heads both ranks hold, so planning it whole is right.
    int64_t shared = 0;
    for (int64_t h = 0; h < s[p.src_rank].size(Axis::kH); ++h) {
      shared += d[p.dst_rank].local_head(s[p.src_rank].global_head(h)) >= 0;
    }
    EXPECT_EQ(p.heads, shared) << p.src_rank << " -> " << p.dst_rank;
    for (int64_t g = p.first_head; g < p.first_head + p.heads; ++g) {
      EXPECT_GE(s[p.src_rank].local_head(g), 0) << "source rank " << p.src_rank << " head " << g;
      EXPECT_GE(d[p.dst_rank].local_head(g), 0)
          << "destination rank " << p.dst_rank << " head " << g;
      ++feeds[{p.dst_rank, g}];
    }
  }
  // Every head slot of every destination rank, exactly once.
  for (int r = 0; r < dst.tp_size; ++r) {
    for (int64_t h = 0; h < d[r].size(Axis::kH); ++h) {
      const int64_t g = d[r].global_head(h);
      EXPECT_EQ((feeds[{r, g}]), 1) << "destination rank " << r << " head " << g;
    }
  }
  // The daemon's per-pair question has the same answers.
  for (int sr = 0; sr < src.tp_size; ++sr) {
    for (int dr = 0; dr < dst.tp_size; ++dr) {
      auto one = PairOf(s[sr], d[dr]);
      ASSERT_TRUE(one.ok()) << one.status().ToString();
      auto it = by_ranks.find({sr, dr});
      ASSERT_EQ(one->has_value(), it != by_ranks.end()) << sr << " -> " << dr;
      if (one->has_value()) {
        EXPECT_EQ(**one, it->second);
      }
    }
  }
  // Copies of a head are read evenly: a source rank feeds at most one destination more than
  // another holder of the same heads does.
  if (src.replicated) {
    std::vector<int> fed(src.tp_size, 0);
    for (const RankPair& p : *pairs) ++fed[p.src_rank];
    const auto [lo, hi] = std::minmax_element(fed.begin(), fed.end());
    EXPECT_LE(*hi - *lo, 1);
  }
}

TEST(RankPairs, RandomShapesFeedEveryDestinationHeadOnce) {
  std::mt19937 rng(20);
  for (int i = 0; i < 3000; ++i) {
    const int64_t total = std::vector<int64_t>{1, 2, 3, 4, 6, 8, 12, 16}[rng() % 8];
    CheckPairing(RandomShape(rng, total), RandomShape(rng, total));
    if (::testing::Test::HasFailure()) return;
  }
}

// The plans of every pair of a request, run on bytes: each destination byte of the request is
// written once, by a source rank holding its head (a source byte says which global head it is).
TEST(RankPairs, PlansOfThePairsWriteEveryDestinationByteOnce) {
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    const int64_t total = std::vector<int64_t>{1, 2, 4, 6, 8}[rng() % 5];
    const TpShape src = RandomShape(rng, total), dst = RandomShape(rng, total);
    SCOPED_TRACE("source " + Describe(src) + " -> destination " + Describe(dst));
    auto pairs = PairRanks(src, dst);
    ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
    std::vector<std::vector<uint8_t>> src_bytes(src.tp_size);
    for (int r = 0; r < src.tp_size; ++r) {
      const KvRegion region = Region(src, r);
      src_bytes[r].assign(region.span_bytes(), 0);
      for (int64_t l = 0; l < 2; ++l)
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t h = 0; h < region.size(Axis::kH); ++h)
            for (int64_t n = 0; n < 2; ++n)
              for (int64_t c = 0; c < 4; ++c)
                src_bytes[r][region.offset(l, b, h, n) + c] =
                    static_cast<uint8_t>(1 + region.global_head(h) * 8 + l * 4 + c);
    }
    const std::vector<int64_t> blocks = {0, 1};
    const TransferSpec spec{blocks, blocks, 4};
    for (int dr = 0; dr < dst.tp_size; ++dr) {
      const KvRegion d = Region(dst, dr);
      std::vector<int> writes(d.span_bytes(), 0);
      std::vector<uint8_t> out(d.span_bytes(), 0);
      for (const RankPair& p : *pairs) {
        if (p.dst_rank != dr) continue;
        auto plan = PlanTransfer(Region(src, p.src_rank), d, spec);
        ASSERT_TRUE(plan.ok()) << plan.status().ToString();
        for (const kv::Run& run : plan->runs) {
          for (uint64_t k = 0; k < run.length; ++k) {
            ++writes[run.dst_offset + k];
            out[run.dst_offset + k] = src_bytes[p.src_rank][run.src_offset + k];
          }
        }
      }
      for (int64_t l = 0; l < 2; ++l)
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t h = 0; h < d.size(Axis::kH); ++h)
            for (int64_t n = 0; n < 2; ++n)
              for (int64_t c = 0; c < 4; ++c) {
                const uint64_t at = d.offset(l, b, h, n) + c;
                ASSERT_EQ(writes[at], 1) << "rank " << dr << " head " << h << " byte " << at;
                ASSERT_EQ(out[at], 1 + d.global_head(h) * 8 + l * 4 + c);
              }
    }
  }
}

TEST(RankPairs, KnownPairings) {
  // TP 2 -> 1: both prefill ranks feed their halves.
  auto two_to_one = PairRanks({2, 8, false}, {1, 8, false});
  ASSERT_TRUE(two_to_one.ok());
  EXPECT_EQ(*two_to_one, (std::vector<RankPair>{{0, 0, 0, 4}, {1, 0, 4, 4}}));
  // TP 1 -> 2: the one prefill rank feeds each decode rank its half.
  auto one_to_two = PairRanks({1, 8, false}, {2, 8, false});
  ASSERT_TRUE(one_to_two.ok());
  EXPECT_EQ(*one_to_two, (std::vector<RankPair>{{0, 0, 0, 4}, {0, 1, 4, 4}}));
  // MLA, 4 -> 2: decode rank d reads prefill rank d mod 4.
  auto mla = PairRanks({4, 1, true}, {2, 1, true});
  ASSERT_TRUE(mla.ok());
  EXPECT_EQ(*mla, (std::vector<RankPair>{{0, 0, 0, 1}, {1, 1, 0, 1}}));
  // Replicated heads, 2 heads on TP 8 -> TP 1: one copy of each head, not four.
  auto replicated = PairRanks({8, 2, false}, {1, 2, false});
  ASSERT_TRUE(replicated.ok());
  EXPECT_EQ(*replicated, (std::vector<RankPair>{{0, 0, 0, 1}, {4, 0, 1, 1}}));
  // ... and to TP 4, whose ranks 0, 1 hold head 0 and 2, 3 head 1: read from different copies.
  auto spread = PairRanks({8, 2, false}, {4, 2, false});
  ASSERT_TRUE(spread.ok());
  EXPECT_EQ(*spread,
            (std::vector<RankPair>{{0, 0, 0, 1}, {1, 1, 0, 1}, {6, 2, 1, 1}, {7, 3, 1, 1}}));
}

TEST(RankPairs, RefusesShapesKvRegionRefuses) {
  EXPECT_EQ(PairRanks({0, 8, false}, {1, 8, false}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PairRanks({3, 8, false}, {1, 8, false}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PairRanks({1, 8, false}, {6, 4, false}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PairRanks({2, 8, false}, {2, 4, false}).status().code(), Code::kIncompatible);
  EXPECT_EQ(PairOf(Region({2, 8, false}, 0), Region({2, 4, false}, 0)).status().code(),
            Code::kIncompatible);
}

}  // namespace
}  // namespace kv
