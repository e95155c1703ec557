#include "transport/nccl/wire.h"

#include <algorithm>
#include <type_traits>
#include <utility>

#include "base/codec.h"

namespace kv::transport::nccl {
namespace {

ByteWriter Start(MsgType type) {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(type));
  return w;
}

// Ranges travel as arrays of their u64 fields, copied whole (ByteWriter::raw): a batch of a TP
// split holds thousands.
static_assert(sizeof(Range) == 16 && sizeof(Strided) == 48);
static_assert(std::is_trivially_copyable_v<Range> && std::is_trivially_copyable_v<Strided>);

template <typename T>
void PutArray(ByteWriter& w, std::span<const T> items) {
  w.u64(items.size()).raw(items.data(), items.size_bytes());
}

template <typename T>
bool GetArray(ByteReader& r, uint64_t bytes_left, std::vector<T>* out) {
  uint64_t n = 0;
  if (!r.u64(&n) || n > bytes_left / sizeof(T)) return false;  // count bounded by the frame
  out->resize(n);
  return r.raw(out->data(), n * sizeof(T));
}

void PutRanges(ByteWriter& w, std::span<const Range> ranges) {
  PutArray(w, ranges);
}
bool GetRanges(ByteReader& r, uint64_t bytes_left, std::vector<Range>* out) {
  return GetArray(r, bytes_left, out);
}
// Rows travel as runs of one shape: (length, count, stride, outer_count, outer_stride, n), then
// the first offsets of the n entries of that shape, 8 bytes an entry where the whole Strided
// takes 48. A batch's entries nearly all share one shape (a page's heads: 8 blocks of 16 rows of
// 512 B), and the announcement of a layer of 32 requests of 512 B rows was 2 MiB, 16 times a
// batch of 64 KiB pages, and the largest host cost of such a batch (nccl_host_bench, send/frame).
constexpr size_t kShapeWords = 6;

bool SameShape(const Strided& a, const Strided& b) {
  return a.length == b.length && a.count == b.count && a.stride == b.stride &&
         a.outer_count == b.outer_count && a.outer_stride == b.outer_stride;
}

void PutStrided(ByteWriter& w, std::span<const Strided> strided) {
  std::vector<uint64_t> words;
  words.reserve(strided.size() + 2 * kShapeWords);
  uint64_t runs = 0;
  size_t header = 0;  // the current run's, in words
  for (size_t i = 0; i < strided.size(); ++i) {
    const Strided& g = strided[i];
    if (i == 0 || !SameShape(g, strided[i - 1])) {
      header = words.size();
      words.insert(words.end(), {g.length, g.count, static_cast<uint64_t>(g.stride), g.outer_count,
                                 static_cast<uint64_t>(g.outer_stride), 0});
      ++runs;
    }
    words.push_back(g.offset);
    ++words[header + kShapeWords - 1];
  }
  w.u64(runs).raw(words.data(), words.size() * sizeof(uint64_t));
}
bool GetStrided(ByteReader& r, std::vector<Strided>* out) {
  uint64_t runs = 0;
  if (!r.u64(&runs) || runs > r.remaining() / (kShapeWords * 8)) return false;  // the headers
  out->clear();
  std::vector<uint64_t> offsets;
  for (uint64_t k = 0; k < runs; ++k) {
    uint64_t shape[kShapeWords] = {};
    for (uint64_t& word : shape) {
      if (!r.u64(&word)) return false;
    }
    const uint64_t n = shape[kShapeWords - 1];
    if (n == 0 || n > r.remaining() / sizeof(uint64_t)) {
      return false;  // every entry a run names is in the frame: at most 6 bytes kept per byte
    }
    offsets.resize(n);
    if (!r.raw(offsets.data(), n * sizeof(uint64_t))) return false;
    const Strided like{0,        shape[0],
                       shape[1], static_cast<int64_t>(shape[2]),
                       shape[3], static_cast<int64_t>(shape[4])};
    const size_t first = out->size();
    out->resize(first + n, like);
    Strided* at = out->data() + first;
    for (uint64_t i = 0; i < n; ++i) at[i].offset = offsets[i];
  }
  return true;
}

Status Malformed(const char* what) {
  return Status::InvalidArgument(std::string("malformed ") + what + " message from peer");
}

// A reader positioned after the type, which must be `type`.
bool Open(MsgType type, ByteReader* r) {
  uint32_t t = 0;
  return r->u32(&t) && t == static_cast<uint32_t>(type);
}

}  // namespace

Result<MsgType> PeekType(std::string_view frame) {
  ByteReader r(frame);
  uint32_t t = 0;
  if (!r.u32(&t) || t < static_cast<uint32_t>(MsgType::kHello) ||
      t > static_cast<uint32_t>(MsgType::kNote)) {
    return Status::InvalidArgument("unknown message type from peer");
  }
  return static_cast<MsgType>(t);
}

std::string EncodeHello() {
  return Start(MsgType::kHello).bytes(kHelloMagic).take();
}

std::string EncodeCommInit(const CommInitMsg& msg) {
  return Start(MsgType::kCommInit).bytes(msg.unique_id).u32(msg.blocking_launch ? 1 : 0).take();
}

std::string EncodeData(const DataMsg& msg) {
  ByteWriter w = Start(MsgType::kData);
  w.u64(msg.seq).u64(msg.reply_to).u64(msg.region_id).u64(msg.chunk_bytes).u64(msg.direct_bytes);
  PutRanges(w, msg.ranges);
  PutStrided(w, msg.strided);
  return w.take();
}

std::string EncodeAck(const AckMsg& msg) {
  ByteWriter w = Start(MsgType::kAck);
  w.u64(msg.seq).u32(static_cast<uint32_t>(msg.status.code())).bytes(msg.status.message());
  return w.take();
}

std::string EncodeGetError(const AckMsg& msg) {
  ByteWriter w = Start(MsgType::kGetError);
  w.u64(msg.seq).u32(static_cast<uint32_t>(msg.status.code())).bytes(msg.status.message());
  return w.take();
}

std::string EncodeGetRequest(const GetRequestMsg& msg) {
  ByteWriter w = Start(MsgType::kGetRequest);
  w.u64(msg.seq).u64(msg.region_id).u64(msg.chunk_bytes);
  PutRanges(w, msg.ranges);
  PutStrided(w, msg.strided);
  return w.take();
}

std::string EncodeNote(std::string_view message) {
  return Start(MsgType::kNote).bytes(message).take();
}

Status DecodeHello(std::string_view frame) {
  ByteReader r(frame);
  std::string_view magic;
  if (!Open(MsgType::kHello, &r) || !r.bytes(&magic) || magic != kHelloMagic) {
    return Status::Incompatible("peer does not speak " + std::string(kHelloMagic));
  }
  return Status::Ok();
}

Result<CommInitMsg> DecodeCommInit(std::string_view frame) {
  ByteReader r(frame);
  std::string_view id;
  uint32_t blocking = 0;
  if (!Open(MsgType::kCommInit, &r) || !r.bytes(&id) || !r.u32(&blocking) || blocking > 1 ||
      !r.at_end()) {
    return Malformed("comm-init");
  }
  return CommInitMsg{std::string(id), blocking == 1};
}

Result<DataMsg> DecodeData(std::string_view frame) {
  ByteReader r(frame);
  DataMsg msg;
  if (!Open(MsgType::kData, &r) || !r.u64(&msg.seq) || !r.u64(&msg.reply_to) ||
      !r.u64(&msg.region_id) || !r.u64(&msg.chunk_bytes) || !r.u64(&msg.direct_bytes) ||
      !GetRanges(r, frame.size(), &msg.ranges) || !GetStrided(r, &msg.strided) || !r.at_end() ||
      msg.chunk_bytes < kMinChunkBytes) {
    return Malformed("data");
  }
  return msg;
}

Result<AckMsg> DecodeAck(std::string_view frame) {
  ByteReader r(frame);
  uint32_t t = 0, code = 0;
  AckMsg msg;
  std::string_view text;
  if (!r.u32(&t) ||
      (t != static_cast<uint32_t>(MsgType::kAck) &&
       t != static_cast<uint32_t>(MsgType::kGetError)) ||
      !r.u64(&msg.seq) || !r.u32(&code) || !r.bytes(&text) || !r.at_end() ||
      code > static_cast<uint32_t>(Code::kInternal)) {
    return Malformed("ack");
  }
  if (code != 0) msg.status = Status(static_cast<Code>(code), "peer: " + std::string(text));
  return msg;
}

Result<GetRequestMsg> DecodeGetRequest(std::string_view frame) {
  ByteReader r(frame);
  GetRequestMsg msg;
  if (!Open(MsgType::kGetRequest, &r) || !r.u64(&msg.seq) || !r.u64(&msg.region_id) ||
      !r.u64(&msg.chunk_bytes) || !GetRanges(r, frame.size(), &msg.ranges) ||
      !GetStrided(r, &msg.strided) || !r.at_end() || msg.chunk_bytes < kMinChunkBytes) {
    return Malformed("get-request");
  }
  return msg;
}

Result<std::string> DecodeNote(std::string_view frame) {
  ByteReader r(frame);
  std::string_view text;
  if (!Open(MsgType::kNote, &r) || !r.bytes(&text) || !r.at_end()) {
    return Malformed("note");
  }
  return std::string(text);
}

Status CheckBatchSize(uint64_t bytes, uint64_t region_bytes) {
  if (bytes <= region_bytes) return Status::Ok();
  return Status::InvalidArgument("a batch of " + std::to_string(bytes) + " bytes for a region of " +
                                 std::to_string(region_bytes));
}

Result<uint64_t> TotalBytes(std::span<const Range> ranges, std::span<const Strided> strided) {
  uint64_t total = 0;
  for (const Range& r : ranges) {
    if (r.length > UINT64_MAX - total) return Status::InvalidArgument("batch size overflows");
    total += r.length;
  }
  // An entry's bytes, count·length·outer_count, worked out once per shape: a division per
  // group was the largest part of checking a batch of 512 B rows.
  uint64_t count = 0, length = 0, outer_count = 0, bytes = 0;
  for (const Strided& g : strided) {
    if (g.count != count || g.length != length || g.outer_count != outer_count) {
      if (g.length != 0 && g.count > UINT64_MAX / g.length) {
        return Status::InvalidArgument("batch size overflows");
      }
      const uint64_t block = g.count * g.length;
      if (g.outer_count != 0 && block > UINT64_MAX / g.outer_count) {
        return Status::InvalidArgument("batch size overflows");
      }
      count = g.count;
      length = g.length;
      outer_count = g.outer_count;
      bytes = block * outer_count;
    }
    if (bytes > UINT64_MAX - total) return Status::InvalidArgument("batch size overflows");
    total += bytes;
  }
  return total;
}

Status CheckRanges(std::span<const Range> ranges, uint64_t region_bytes) {
  for (const Range& r : ranges) {
    if (r.offset > region_bytes || r.length > region_bytes - r.offset) {
      return Status::OutOfRange("range [" + std::to_string(r.offset) + ", +" +
                                std::to_string(r.length) + ") outside the region of " +
                                std::to_string(region_bytes) + " bytes");
    }
  }
  return Status::Ok();
}

namespace {

__extension__ typedef unsigned __int128 Wide;

Wide Magnitude(int64_t v) {
  return v < 0 ? static_cast<Wide>(0) - static_cast<Wide>(v) : static_cast<Wide>(v);
}

// The rule for blocks of `count` rows of `length` bytes, rows `stride` apart, repeated
// `outer_stride` apart: each holds kMinBlockBytes, and each is clear of the next (one block's
// extent apart at least), so no two rows overlap. CheckStrided's for a peer's entries; the one
// SplitGroups joins groups by, so it never sends what the receiver refuses.
bool BlocksApart(uint64_t count, uint64_t length, int64_t stride, int64_t outer_stride) {
  const Wide extent = static_cast<Wide>(count - 1) * Magnitude(stride) + length;
  return static_cast<Wide>(count) * length >= kMinBlockBytes && Magnitude(outer_stride) >= extent;
}

// Whether group g, of the shape of a one-block entry (r in the receiver's view, s in the
// sender's), may be its second block (BlocksApart on the receiver). Sets the outer strides if so.
bool StartBlocks(const RunGroup& g, Strided* r, Strided* s) {
  const auto dst_step = static_cast<int64_t>(g.dst_offset - r->offset);
  if (!BlocksApart(g.count, g.length, g.dst_stride, dst_step)) return false;
  r->outer_stride = dst_step;
  s->outer_stride = static_cast<int64_t>(g.src_offset - s->offset);
  return true;
}

}  // namespace

void SplitGroups(std::span<const RunGroup> groups, uint64_t chunk_bytes, DataMsg* msg,
                 std::vector<Range>* gather, std::vector<Strided>* rows) {
  // The entry being built (r in the receiver's view, s in the sender's), kept out of the vectors
  // until the next starts, and where its next block would start once it has two.
  Strided r, s;
  bool open = false;
  uint64_t next_dst = 0, next_src = 0;
  for (const RunGroup& g : groups) {
    if (g.length > chunk_bytes) {
      for (uint64_t i = 0; i < g.count; ++i) {
        const Run run = g.row(i);
        msg->ranges.push_back({run.dst_offset, run.length});
        gather->push_back({run.src_offset, run.length});
      }
      continue;
    }
    if (open && g.length == r.length && g.count == r.count && g.dst_stride == r.stride &&
        g.src_stride == s.stride &&
        (r.outer_count > 1 ? g.dst_offset == next_dst && g.src_offset == next_src
                           : StartBlocks(g, &r, &s))) {
      ++r.outer_count;
      ++s.outer_count;
      next_dst = g.dst_offset + static_cast<uint64_t>(r.outer_stride);
      next_src = g.src_offset + static_cast<uint64_t>(s.outer_stride);
      continue;
    }
    if (open) {
      msg->strided.push_back(r);
      rows->push_back(s);
    }
    r = {g.dst_offset, g.length, g.count, g.dst_stride};
    s = {g.src_offset, g.length, g.count, g.src_stride};
    open = true;
  }
  if (open) {
    msg->strided.push_back(r);
    rows->push_back(s);
  }
}

void SplitBlocks(std::span<const GroupBlocks> blocks, uint64_t chunk_bytes, DataMsg* msg,
                 std::vector<Range>* gather, std::vector<Strided>* rows) {
  std::vector<RunGroup> groups;  // a block entry the receiver would refuse whole
  for (const GroupBlocks& b : blocks) {
    const RunGroup& g = b.group;
    if (g.length <= chunk_bytes &&
        (b.outer_count == 1 || BlocksApart(g.count, g.length, g.dst_stride, b.dst_outer_stride))) {
      msg->strided.push_back(
          {g.dst_offset, g.length, g.count, g.dst_stride, b.outer_count, b.dst_outer_stride});
      rows->push_back(
          {g.src_offset, g.length, g.count, g.src_stride, b.outer_count, b.src_outer_stride});
      continue;
    }
    groups.clear();
    ExpandBlocks(std::span(&b, 1), &groups);
    SplitGroups(groups, chunk_bytes, msg, gather, rows);
  }
}

void SplitGet(std::span<const Run> runs, std::span<const RunGroup> groups,
              std::span<const GroupBlocks> blocks, GetRequestMsg* req, std::vector<Range>* ranges,
              std::vector<Strided>* rows) {
  // The responder is the receiver SplitGroups joins for: its view goes where a put's
  // receiver's would, so every side of a group swaps.
  const auto swapped = [](RunGroup g) {
    std::swap(g.src_offset, g.dst_offset);
    std::swap(g.src_stride, g.dst_stride);
    return g;
  };
  DataMsg asked;
  asked.ranges.reserve(runs.size());
  ranges->reserve(ranges->size() + runs.size());
  for (const Run& r : runs) {
    asked.ranges.push_back({r.src_offset, r.length});
    ranges->push_back({r.dst_offset, r.length});
  }
  std::vector<RunGroup> turned;
  turned.reserve(groups.size());
  for (const RunGroup& g : groups) turned.push_back(swapped(g));
  SplitGroups(turned, req->chunk_bytes, &asked, ranges, rows);
  std::vector<GroupBlocks> turned_blocks;
  turned_blocks.reserve(blocks.size());
  for (const GroupBlocks& b : blocks) {
    turned_blocks.push_back(
        {swapped(b.group), b.outer_count, b.dst_outer_stride, b.src_outer_stride});
  }
  SplitBlocks(turned_blocks, req->chunk_bytes, &asked, ranges, rows);
  req->ranges = std::move(asked.ranges);
  req->strided = std::move(asked.strided);
}

std::vector<PieceStart> CutIntoPieces(std::span<const Range> ranges,
                                      std::span<const RunGroup> groups,
                                      std::span<const GroupBlocks> blocks, uint64_t piece_bytes) {
  std::vector<PieceStart> at = {PieceStart{}};
  PieceStart next;
  uint64_t held = 0;
  // Entry `bytes` joins the open piece, which ends once it holds piece_bytes. The sender's own
  // entries: their sizes do not overflow.
  const auto add = [&](uint64_t bytes) {
    held += bytes;
    if (piece_bytes != 0 && held >= piece_bytes) {
      at.push_back(next);
      held = 0;
    }
  };
  for (const Range& r : ranges) {
    ++next.ranges;
    add(r.length);
  }
  for (const RunGroup& g : groups) {
    ++next.groups;
    add(g.length * g.count);
  }
  for (const GroupBlocks& b : blocks) {
    ++next.blocks;
    add(b.group.length * b.group.count * b.outer_count);
  }
  if (held > 0 || at.size() == 1) at.push_back(next);
  return at;
}

Status CheckStrided(std::span<const Strided> strided, uint64_t region_bytes, uint64_t chunk_bytes) {
  // Rows of one shape lie in the region iff the first row's offset lies in [lowest, highest]:
  // worked out once per shape (a batch's entries nearly all share one), so each entry costs a
  // comparison of its shape and two of its offset.
  const Strided* shape = nullptr;
  uint64_t lowest = 1, highest = 0;
  for (const Strided& g : strided) {
    if (shape == nullptr || !SameShape(g, *shape)) {
      if (g.length == 0 || g.length > chunk_bytes) {
        return Status::InvalidArgument("rows of " + std::to_string(g.length) +
                                       " bytes: a staged row holds 1 to " +
                                       std::to_string(chunk_bytes) + " bytes");
      }
      const Wide step = Magnitude(g.stride), outer_step = Magnitude(g.outer_stride);
      if (g.count == 0 || (g.count > 1 && step < g.length)) {
        return Status::InvalidArgument("a group of " + std::to_string(g.count) + " rows of " +
                                       std::to_string(g.length) + " bytes " +
                                       std::to_string(g.stride) + " bytes apart");
      }
      // Each term below 2^127 (a count below 2^64 times a step of at most 2^63), so no sum of
      // them and a length wraps.
      const Wide span = (g.count - 1) * step, outer_span = (g.outer_count - 1) * outer_step;
      if (g.outer_count == 0 ||
          (g.outer_count > 1 && !BlocksApart(g.count, g.length, g.stride, g.outer_stride))) {
        return Status::InvalidArgument(
            std::to_string(g.outer_count) + " blocks of " + std::to_string(g.count) + " rows of " +
            std::to_string(g.length) + " bytes " + std::to_string(g.outer_stride) +
            " bytes apart: blocks hold at least " + std::to_string(kMinBlockBytes) +
            " bytes and do not overlap");
      }
      const Wide below = (g.stride < 0 ? span : 0) + (g.outer_stride < 0 ? outer_span : 0);
      const Wide above = span + outer_span - below;
      shape = &g;
      lowest = 1;
      highest = 0;  // none, unless the rows fit at all
      // The rows' whole extent, not only the part above the first row: `below` of a negative
      // stride can pass 2^64 (INT64_MIN, 37 rows), and truncated to 64 bits it let rows outside
      // the region through (found by fuzz_nccl_wire).
      if (span + outer_span + g.length <= region_bytes) {
        lowest = static_cast<uint64_t>(below);
        highest = region_bytes - static_cast<uint64_t>(above) - g.length;
      }
    }
    if (g.offset < lowest || g.offset > highest) {
      return Status::OutOfRange(
          "rows from " + std::to_string(g.offset) + " (" + std::to_string(g.outer_count) + " x " +
          std::to_string(g.count) + " of " + std::to_string(g.length) + " bytes, steps " +
          std::to_string(g.stride) + " and " + std::to_string(g.outer_stride) +
          ") reach outside the region of " + std::to_string(region_bytes) + " bytes");
    }
  }
  return Status::Ok();
}

Chunks ChunkRuns(std::span<const Range> ranges, uint64_t chunk_bytes, Direction direction) {
  Chunks out;
  out.runs.reserve(ranges.size());
  out.starts.push_back(0);
  uint64_t used = 0;  // bytes of the current chunk already assigned
  for (const Range& range : ranges) {
    uint64_t done = 0;
    while (done < range.length) {
      if (used == chunk_bytes) {
        out.starts.push_back(out.runs.size());
        out.bytes.push_back(used);
        used = 0;
      }
      const uint64_t take = std::min(range.length - done, chunk_bytes - used);
      if (direction == Direction::kGather) {
        out.runs.push_back(Run{range.offset + done, used, take});
      } else {
        out.runs.push_back(Run{used, range.offset + done, take});
      }
      done += take;
      used += take;
    }
  }
  if (used > 0) {
    out.starts.push_back(out.runs.size());
    out.bytes.push_back(used);
  }
  return out;
}

GroupChunks ChunkGroups(std::span<const Strided> strided, uint64_t chunk_bytes,
                        Direction direction) {
  GroupChunks out;
  // An entry cut at a chunk boundary adds up to three; slack for a boundary every 8 entries.
  out.groups.reserve(strided.size() + strided.size() / 8 + 16);
  out.starts.push_back(0);
  uint64_t used = 0;  // bytes of the current chunk already assigned
  auto close = [&] {
    out.starts.push_back(out.groups.size());
    out.bytes.push_back(used);
    used = 0;
  };
  // `blocks` blocks of `rows` rows of g from offset `at` in the region, at `used` in the chunk.
  auto put = [&](const Strided& g, uint64_t at, uint64_t rows, uint64_t blocks) {
    const auto packed = static_cast<int64_t>(g.length);
    const auto packed_outer = static_cast<int64_t>(rows * g.length);
    if (direction == Direction::kGather) {
      out.groups.push_back({RunGroup{at, used, g.length, rows, g.stride, packed}, blocks,
                            g.outer_stride, packed_outer});
    } else {
      out.groups.push_back({RunGroup{used, at, g.length, rows, packed, g.stride}, blocks,
                            packed_outer, g.outer_stride});
    }
    used += blocks * rows * g.length;
  };
  for (const Strided& g : strided) {
    if (g.length == 0 || g.length > chunk_bytes) continue;  // refused by CheckStrided
    const uint64_t block_bytes = g.count * g.length;
    // The usual case, the whole entry in what is left of the chunk, without a division.
    if (static_cast<Wide>(block_bytes) * g.outer_count <= chunk_bytes - used) {
      put(g, g.offset, g.count, g.outer_count);
      continue;
    }
    // Whole blocks while they fit; a block that does not fills the chunk with its rows and goes
    // on in the next, as its rows one by one would.
    for (uint64_t o = 0; o < g.outer_count && block_bytes > 0;) {
      const uint64_t at = g.block(o).offset;
      const uint64_t blocks = std::min(g.outer_count - o, (chunk_bytes - used) / block_bytes);
      if (blocks > 0) {
        put(g, at, g.count, blocks);
        o += blocks;
        continue;
      }
      for (uint64_t row = 0; row < g.count;) {
        if (chunk_bytes - used < g.length) close();
        const uint64_t take = std::min(g.count - row, (chunk_bytes - used) / g.length);
        put(g, at + row * static_cast<uint64_t>(g.stride), take, 1);
        row += take;
      }
      ++o;
    }
  }
  if (used > 0) close();
  return out;
}

DirectSplit SplitDirect(std::span<const Range> ranges, uint64_t direct_bytes,
                        uint64_t piece_bytes) {
  DirectSplit out;
  for (const Range& range : ranges) {
    if (direct_bytes == 0 || range.length < direct_bytes) {
      if (range.length > 0) out.staged.push_back(range);
      continue;
    }
    for (uint64_t done = 0; done < range.length; done += piece_bytes) {
      out.direct.push_back({range.offset + done, std::min(piece_bytes, range.length - done)});
    }
  }
  return out;
}

}  // namespace kv::transport::nccl
