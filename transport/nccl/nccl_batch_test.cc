// A batch on its way through the nccl backend, on the host: a get's request naming its rows as
// entries the responder's checks take (kvd-nccl/8), and a large put cut into pieces that move as
// batches of their own and complete it once. Beside the backend, whose internals it tests
// (registered in tests/gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "layout/kv_region.h"
#include "transport/nccl/link_work.h"
#include "transport/nccl/wire.h"
#include "transport/nccl/wire_test_util.h"

namespace kv::transport::nccl {
namespace {

// A get's request names its groups' rows as entries, checked by the responder as a put's receiver
// checks its rows: LBNHC -> BLHNC pulled names a head's 16 rows as one entry (its heads interleave
// in the responder's page, so they stay apart), and the requester's rows, chunked as the reply
// is, land each row where the plan says.
TEST(NcclWireTest, AGetNamesItsRowsAsEntriesTheResponderTakes) {
  const Conversion c(32, 11);
  const KvRegion &src = c.src, &dst = c.dst;
  Plan plan;
  ASSERT_TRUE(c.Append(PlanEntries::kGroupBlocks, 0, 2, &plan).ok());
  ASSERT_FALSE(plan.blocks.empty());
  const std::vector<kv::Run> one_run = {{0, dst.span_bytes() - 4096, 4096}};  // a plain run too

  GetRequestMsg req;
  req.seq = 3;
  req.region_id = 9;
  req.chunk_bytes = 1 << 20;
  std::vector<Range> ranges;
  std::vector<Strided> rows;
  SplitGet(one_run, {}, plan.blocks, &req, &ranges, &rows);
  ASSERT_EQ(req.ranges.size(), 1u);
  EXPECT_EQ(req.ranges[0], (Range{0, 4096}));
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], (Range{dst.span_bytes() - 4096, 4096}));
  ASSERT_EQ(rows.size(), req.strided.size());
  std::vector<kv::Run> expected;
  std::vector<RunGroup> groups;
  ExpandBlocks(plan.blocks, &groups);
  ExpandGroups(groups, &expected);
  EXPECT_EQ(req.strided.size(), groups.size());  // a head's rows in one entry, not one per row
  EXPECT_LT(req.strided.size() * 16, expected.size() + 1);
  const std::vector<kv::Run> asked = RowsOf(req.strided, true), landed = RowsOf(rows, false);
  ASSERT_EQ(asked.size(), expected.size());
  ASSERT_EQ(landed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(asked[i].src_offset, expected[i].src_offset) << i;
    ASSERT_EQ(landed[i].dst_offset, expected[i].dst_offset) << i;
    ASSERT_EQ(asked[i].length, expected[i].length) << i;
  }
  EXPECT_TRUE(CheckStrided(req.strided, src.span_bytes(), req.chunk_bytes).ok());
  EXPECT_EQ(*TotalBytes(req.ranges, req.strided), plan.bytes + 4096);
  EXPECT_EQ(ChunkGroups(req.strided, req.chunk_bytes, Direction::kGather).bytes,
            ChunkGroups(rows, req.chunk_bytes, Direction::kScatter).bytes);

  auto back = DecodeGetRequest(EncodeGetRequest(req));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, req);
  req.chunk_bytes = kMinChunkBytes - 1;  // a peer's chunks smaller than any link takes
  EXPECT_EQ(DecodeGetRequest(EncodeGetRequest(req)).status().code(), Code::kInvalidArgument);
}

// A TP 1 -> 2 pull: each token's slice of the page is a row, and the request names a page's rows
// as one entry where it named every row before (kvd-nccl/7).
TEST(NcclWireTest, AGetOfATpSliceNamesAPagesRowsAsOneEntry) {
  const int64_t blocks = 16;
  const KvRegion src = PageRegion("LBNHC", blocks), dst = PageRegion("LBNHC", blocks, 2, 1);
  std::vector<int64_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(13);
  std::shuffle(ids.begin(), ids.end(), rng);
  const TransferSpec spec{ids, ids, blocks * 16};
  auto layer = LayerPlan::Create(src, dst, spec, PlanEntries::kGroupBlocks);
  ASSERT_TRUE(layer.ok()) << layer.status().ToString();
  Plan plan;
  ASSERT_TRUE(layer->AppendLayer(0, &plan).ok());
  GetRequestMsg req;
  req.chunk_bytes = 1 << 20;
  std::vector<Range> ranges;
  std::vector<Strided> rows;
  SplitGet(plan.runs, plan.groups, plan.blocks, &req, &ranges, &rows);
  std::vector<kv::Run> expected = plan.runs;
  std::vector<RunGroup> groups = plan.groups;
  ExpandBlocks(plan.blocks, &groups);
  ExpandGroups(groups, &expected);
  ASSERT_EQ(expected.size(), 16u * blocks);  // a row per token, not one per page
  EXPECT_LE(req.ranges.size() + req.strided.size(), 2u * blocks);
  EXPECT_TRUE(CheckStrided(req.strided, src.span_bytes(), req.chunk_bytes).ok());
  EXPECT_EQ(*TotalBytes(req.ranges, req.strided), *TotalBytes(ranges, rows));
  EXPECT_EQ(*TotalBytes(ranges, rows), plan.bytes);
}

// Every row of a put's announcement and gather side, in order, as (src, dst, length).
std::vector<kv::Run> PutRows(const DataMsg& msg, std::span<const Range> gather,
                             std::span<const Strided> rows) {
  std::vector<kv::Run> out;
  for (size_t i = 0; i < msg.ranges.size(); ++i) {
    out.push_back({gather[i].offset, msg.ranges[i].offset, gather[i].length});
  }
  const std::vector<kv::Run> sent = RowsOf(rows, true), landed = RowsOf(msg.strided, false);
  for (size_t i = 0; i < sent.size(); ++i) {
    out.push_back({sent[i].src_offset, landed[i].dst_offset, sent[i].length});
  }
  return out;
}

// A pulled request's put (a whole request in one batch) moves as pieces of about piece_bytes,
// each split into rows on its own: every entry once, in order, no piece holding more than
// piece_bytes and one entry, and the pieces' rows together are the whole batch's, in order.
TEST(NcclWireTest, ALargePutMovesAsPiecesOfItsEntriesInOrder) {
  const Conversion c(32, 17);
  const KvRegion &src = c.src, &dst = c.dst;
  Plan plan;  // groups of one layer, blocks of the other, and a few plain runs
  ASSERT_TRUE(c.Append(PlanEntries::kGroups, 0, 1, &plan).ok());
  ASSERT_TRUE(c.Append(PlanEntries::kGroupBlocks, 1, 2, &plan).ok());
  std::vector<Range> ranges, gather;
  for (uint64_t i = 0; i < 20; ++i) {
    ranges.push_back({dst.span_bytes() + i * 100000, 1000 + i * 3000});
    gather.push_back({src.span_bytes() + i * 100000, 1000 + i * 3000});
  }
  const uint64_t chunk_bytes = 1 << 20, piece_bytes = 100 << 10;
  DataMsg whole;
  whole.ranges = ranges;
  std::vector<Range> whole_gather = gather;
  std::vector<Strided> whole_rows;
  SplitGroups(plan.groups, chunk_bytes, &whole, &whole_gather, &whole_rows);
  SplitBlocks(plan.blocks, chunk_bytes, &whole, &whole_gather, &whole_rows);
  const uint64_t total = *TotalBytes(whole.ranges, whole.strided);

  const std::vector<PieceStart> at = CutIntoPieces(ranges, plan.groups, plan.blocks, piece_bytes);
  ASSERT_GE(at.size(), 2u + total / (piece_bytes + (64 << 10)));
  EXPECT_EQ(at.front(), PieceStart{});
  EXPECT_EQ(at.back(), (PieceStart{ranges.size(), plan.groups.size(), plan.blocks.size()}));
  std::vector<kv::Run> joined;
  for (size_t k = 0; k + 1 < at.size(); ++k) {
    const PieceStart &a = at[k], &b = at[k + 1];
    ASSERT_TRUE(a.ranges <= b.ranges && a.groups <= b.groups && a.blocks <= b.blocks) << k;
    DataMsg msg;
    msg.ranges.assign(ranges.begin() + a.ranges, ranges.begin() + b.ranges);
    std::vector<Range> piece_gather(gather.begin() + a.ranges, gather.begin() + b.ranges);
    std::vector<Strided> rows;
    SplitGroups(std::span(plan.groups).subspan(a.groups, b.groups - a.groups), chunk_bytes, &msg,
                &piece_gather, &rows);
    SplitBlocks(std::span(plan.blocks).subspan(a.blocks, b.blocks - a.blocks), chunk_bytes, &msg,
                &piece_gather, &rows);
    const std::vector<kv::Run> piece = PutRows(msg, piece_gather, rows);
    ASSERT_FALSE(piece.empty()) << k;
    const uint64_t bytes = *TotalBytes(msg.ranges, msg.strided);
    const uint64_t largest_entry = 64 << 10;  // a page (8 heads of 16 rows of 512 B), or less
    EXPECT_LT(bytes, piece_bytes + largest_entry) << k;
    if (k + 2 < at.size()) {
      EXPECT_GE(bytes, piece_bytes) << k;  // only the last one is short
    }
    joined.insert(joined.end(), piece.begin(), piece.end());
  }
  EXPECT_EQ(joined, PutRows(whole, whole_gather, whole_rows));
  // One piece for a batch that fits, or with piece_bytes 0.
  EXPECT_EQ(CutIntoPieces(ranges, plan.groups, plan.blocks, total).size(), 2u);
  EXPECT_EQ(CutIntoPieces(ranges, plan.groups, plan.blocks, 0).size(), 2u);
  EXPECT_EQ(CutIntoPieces({}, {}, {}, piece_bytes).size(), 2u);
}

// A put's pieces complete it once, after the last of them, with the first error among them.
TEST(NcclWireTest, APutCutIntoPiecesCompletesOnceAfterItsLastPiece) {
  int calls = 0;
  Status got;
  std::vector<Completion> parts = SplitCompletion(
      [&](Status s) {
        ++calls;
        got = std::move(s);
      },
      3);
  ASSERT_EQ(parts.size(), 3u);
  parts[2](Status::Ok());
  parts[0](Status::Timeout("first"));
  EXPECT_EQ(calls, 0);
  parts[1](Status::Unavailable("second"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(got.code(), Code::kTimeout);
}

}  // namespace
}  // namespace kv::transport::nccl
