// libFuzzer target: bytes as a frame a peer's nccl side channel delivered (after its seal was
// opened), decoded as the link's reader does, then, for a put's announcement, checked and laid
// out in chunks as the receive worker does (transport/nccl/link_receive.cc ReceiveData, staging.cc
// Receive), and for a get's request as the responder gathers its reply (AnswerGet, staging.cc
// Send), against a 16 MiB region and 32 MiB staging slots. Nothing may crash, read out of
// bounds or overflow (ASan, UBSan), and what is decoded must hold together:
//  - every message that decodes re-encodes to one that decodes to the same fields (the rows'
//    shape encoding of kvd-nccl/6 included, and a get's rows since kvd-nccl/8);
//  - an announcement or request the checks accept is laid out whole: its staged chunks, group
//    chunks and direct pieces add up to its TotalBytes, no chunk exceeds chunk_bytes, and every
//    run or row (the first and last of each entry's first and last block) lies inside the region
//    on one side and inside its chunk on the other.
// Beside the backend: it includes the backend's own header (registered in tests/fuzz). wire.cc
// needs no CUDA or NCCL, so the fuzz build compiles it alone.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "transport/nccl/wire.h"

namespace {

using namespace kv::transport::nccl;  // NOLINT: the backend's wire vocabulary throughout

constexpr uint64_t kRegionBytes = 16 << 20;
constexpr uint64_t kSlotBytes = 32 << 20;

void Require(bool holds) {
  if (!holds) __builtin_trap();
}

// Decodes `frame`; a message that decodes must re-encode to one that decodes `same` as it.
template <typename Decode, typename Encode, typename Same>
auto RoundTrip(std::string_view frame, Decode decode, Encode encode, Same same) {
  auto msg = decode(frame);
  if (msg.ok()) {
    auto again = decode(encode(*msg));
    Require(again.ok() && same(*again, *msg));
  }
  return msg;
}

constexpr auto kEqual = [](const auto& a, const auto& b) { return a == b; };

// A run of a chunk: one side in the region, the other inside the chunk's staging.
void RequireRunInside(const kv::Run& run, Direction direction, uint64_t chunk_bytes) {
  const uint64_t region = direction == Direction::kGather ? run.src_offset : run.dst_offset;
  const uint64_t staging = direction == Direction::kGather ? run.dst_offset : run.src_offset;
  Require(run.length <= kRegionBytes && region <= kRegionBytes - run.length);
  Require(staging <= chunk_bytes && run.length <= chunk_bytes - staging);
}

// What the receive worker does with a put's announcement once it decoded (kScatter), and the
// responder with a get's request (kGather: the reply's chunks are gathered from its region).
void LayOut(const DataMsg& msg, Direction direction) {
  auto total = TotalBytes(msg.ranges, msg.strided);
  if (!total.ok() || !CheckBatchSize(*total, kRegionBytes).ok()) return;
  if (!CheckRanges(msg.ranges, kRegionBytes).ok()) return;
  if (!CheckStrided(msg.strided, kRegionBytes, msg.chunk_bytes).ok()) return;
  if (msg.chunk_bytes > kSlotBytes) return;  // Staging::CheckChunk refuses it
  const DirectSplit split = SplitDirect(msg.ranges, msg.direct_bytes, msg.chunk_bytes);
  const Chunks chunks = ChunkRuns(split.staged, msg.chunk_bytes, direction);
  const GroupChunks groups = ChunkGroups(msg.strided, msg.chunk_bytes, direction);
  uint64_t laid_out = 0;
  for (const Range& piece : split.direct) {
    Require(piece.length <= msg.chunk_bytes && piece.offset <= kRegionBytes - piece.length);
    laid_out += piece.length;
  }
  for (size_t k = 0; k < chunks.count(); ++k) {
    Require(chunks.bytes[k] <= msg.chunk_bytes);
    uint64_t in_chunk = 0;
    for (const kv::Run& run : chunks.chunk(k)) {
      RequireRunInside(run, direction, msg.chunk_bytes);
      in_chunk += run.length;
    }
    Require(in_chunk == chunks.bytes[k]);
    laid_out += chunks.bytes[k];
  }
  for (size_t k = 0; k < groups.count(); ++k) {
    Require(groups.bytes[k] <= msg.chunk_bytes);
    uint64_t in_chunk = 0;
    for (const kv::GroupBlocks& e : groups.chunk(k)) {
      const kv::RunGroup& g = e.group;
      // Repeated blocks hold kMinBlockBytes each, so they never stand for more descriptors than
      // the region has of those.
      Require(e.outer_count == 1 || g.count * g.length >= kMinBlockBytes);
      for (const uint64_t o : {uint64_t{0}, e.outer_count - 1}) {  // first and last block
        const kv::RunGroup block = e.block(o);
        for (const uint64_t i : {uint64_t{0}, g.count - 1}) {  // their first and last rows
          RequireRunInside(block.row(i), direction, msg.chunk_bytes);
        }
      }
      in_chunk += g.length * g.count * e.outer_count;
    }
    Require(in_chunk == groups.bytes[k]);
    laid_out += groups.bytes[k];
  }
  Require(laid_out == *total);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  auto type = PeekType(frame);
  if (!type.ok()) return 0;
  switch (*type) {
    case MsgType::kHello:
      (void)DecodeHello(frame);
      break;
    case MsgType::kCommInit:
      (void)RoundTrip(frame, DecodeCommInit, EncodeCommInit, kEqual);
      break;
    case MsgType::kData: {
      auto msg = RoundTrip(frame, DecodeData, EncodeData, kEqual);
      if (msg.ok() && msg->reply_to == 0) LayOut(*msg, Direction::kScatter);
      break;
    }
    case MsgType::kAck:
    case MsgType::kGetError:
      // The decoder prefixes the peer's text ("peer: "): the code and seq round-trip.
      (void)RoundTrip(frame, DecodeAck, EncodeAck, [](const AckMsg& a, const AckMsg& b) {
        return a.seq == b.seq && a.status.code() == b.status.code();
      });
      break;
    case MsgType::kGetRequest: {
      auto msg = RoundTrip(frame, DecodeGetRequest, EncodeGetRequest, kEqual);
      if (!msg.ok()) break;
      DataMsg reply;  // what the responder lays out: the request's, with its direct threshold
      reply.chunk_bytes = msg->chunk_bytes;
      reply.direct_bytes = 1 << 20;
      reply.ranges = std::move(msg->ranges);
      reply.strided = std::move(msg->strided);
      LayOut(reply, Direction::kGather);
      break;
    }
    case MsgType::kNote:
      (void)RoundTrip(frame, DecodeNote, EncodeNote, kEqual);
      break;
  }
  return 0;
}
