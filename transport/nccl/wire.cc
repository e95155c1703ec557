#include "transport/nccl/wire.h"

#include <algorithm>

#include "base/codec.h"

namespace kv::transport::nccl {
namespace {

constexpr uint64_t kRangeBytes = 16;

ByteWriter Start(MsgType type) {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(type));
  return w;
}

void PutRanges(ByteWriter& w, std::span<const Range> ranges) {
  w.u64(ranges.size());
  for (const Range& r : ranges) w.u64(r.offset).u64(r.length);
}

bool GetRanges(ByteReader& r, uint64_t bytes_left, std::vector<Range>* out) {
  uint64_t n = 0;
  if (!r.u64(&n) || n > bytes_left / kRangeBytes) return false;  // count bounded by the frame
  out->resize(n);
  for (Range& range : *out) {
    if (!r.u64(&range.offset) || !r.u64(&range.length)) return false;
  }
  return true;
}

constexpr uint64_t kStridedBytes = 32;

void PutStrided(ByteWriter& w, std::span<const Strided> strided) {
  w.u64(strided.size());
  for (const Strided& g : strided) {
    w.u64(g.offset).u64(g.length).u64(g.count).u64(static_cast<uint64_t>(g.stride));
  }
}

bool GetStrided(ByteReader& r, uint64_t bytes_left, std::vector<Strided>* out) {
  uint64_t n = 0;
  if (!r.u64(&n) || n > bytes_left / kStridedBytes) return false;
  out->resize(n);
  for (Strided& g : *out) {
    uint64_t stride = 0;
    if (!r.u64(&g.offset) || !r.u64(&g.length) || !r.u64(&g.count) || !r.u64(&stride)) {
      return false;
    }
    g.stride = static_cast<int64_t>(stride);
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

std::string EncodeCommInit(std::string_view unique_id) {
  return Start(MsgType::kCommInit).bytes(unique_id).take();
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
  w.u64(msg.seq).u64(msg.region_id);
  PutRanges(w, msg.ranges);
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

Result<std::string> DecodeCommInit(std::string_view frame) {
  ByteReader r(frame);
  std::string_view id;
  if (!Open(MsgType::kCommInit, &r) || !r.bytes(&id) || !r.at_end()) {
    return Malformed("comm-init");
  }
  return std::string(id);
}

Result<DataMsg> DecodeData(std::string_view frame) {
  ByteReader r(frame);
  DataMsg msg;
  if (!Open(MsgType::kData, &r) || !r.u64(&msg.seq) || !r.u64(&msg.reply_to) ||
      !r.u64(&msg.region_id) || !r.u64(&msg.chunk_bytes) || !r.u64(&msg.direct_bytes) ||
      !GetRanges(r, frame.size(), &msg.ranges) || !GetStrided(r, frame.size(), &msg.strided) ||
      !r.at_end() || msg.chunk_bytes < kMinChunkBytes) {
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
      !GetRanges(r, frame.size(), &msg.ranges) || !r.at_end()) {
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

Result<uint64_t> TotalBytes(std::span<const Range> ranges, std::span<const Strided> strided) {
  uint64_t total = 0;
  for (const Range& r : ranges) {
    if (r.length > UINT64_MAX - total) return Status::InvalidArgument("batch size overflows");
    total += r.length;
  }
  for (const Strided& g : strided) {
    if (g.length != 0 && g.count > (UINT64_MAX - total) / g.length) {
      return Status::InvalidArgument("batch size overflows");
    }
    total += g.count * g.length;
  }
  return total;
}

Status CheckStrided(std::span<const Strided> strided, uint64_t region_bytes, uint64_t chunk_bytes) {
  std::vector<RunGroup> groups;
  groups.reserve(strided.size());
  for (const Strided& g : strided) {
    if (g.length == 0 || g.length > chunk_bytes) {
      return Status::InvalidArgument("rows of " + std::to_string(g.length) +
                                     " bytes: a staged row holds 1 to " +
                                     std::to_string(chunk_bytes) + " bytes");
    }
    groups.push_back({g.offset, g.offset, g.length, g.count, g.stride, g.stride});
  }
  // Both sides of each group are its rows in the region: in range, and apart on the destination.
  return ValidateGroups(groups, region_bytes, region_bytes);
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
  out.starts.push_back(0);
  uint64_t used = 0;  // bytes of the current chunk already assigned
  auto close = [&] {
    out.starts.push_back(out.groups.size());
    out.bytes.push_back(used);
    used = 0;
  };
  for (const Strided& g : strided) {
    if (g.length == 0 || g.length > chunk_bytes) continue;  // refused by CheckStrided
    for (uint64_t row = 0; row < g.count;) {
      if (chunk_bytes - used < g.length) close();
      const uint64_t take = std::min(g.count - row, (chunk_bytes - used) / g.length);
      const uint64_t at = g.offset + row * static_cast<uint64_t>(g.stride);
      const auto packed = static_cast<int64_t>(g.length);
      if (direction == Direction::kGather) {
        out.groups.push_back(RunGroup{at, used, g.length, take, g.stride, packed});
      } else {
        out.groups.push_back(RunGroup{used, at, g.length, take, packed, g.stride});
      }
      used += take * g.length;
      row += take;
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
