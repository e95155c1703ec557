// The NCCL backend's side-channel messages: one frame each (transport/cuda_ipc/side_channel.h),
// a u32 type first, little-endian fields after it (transport/codec.h).
//
// Data moves in batches: the sender announces a batch (kData: its runs in the receiver's
// region, in order, then its run groups' rows, as runs of groups of one shape), then the bytes
// travel as NCCL operations (the direction's n-th operation since the link began on lane n %
// lanes): first the staged chunks of `chunk_bytes` of the runs, then those of the groups' rows
// (ChunkGroups), then the direct pieces (SplitDirect); the receiver answers kAck once they are in
// place. kCommInit comes once per lane, before the first kData. A kNote is delivered once every
// batch announced before it has landed, so the sender never waits for acks to keep notes behind the
// data. A get is a request (kGetRequest) answered by a kData whose reply_to names it, or by
// kGetError. Every decoder checks sizes and counts before building anything.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "layout/plan.h"

namespace kv::transport::nccl {

enum class MsgType : uint32_t {
  kHello = 1,   // first frame of a connection: protocol magic
  kCommInit,    // a lane for data flowing from the sender (CommInitMsg)
  kData,        // a batch announcement
  kAck,         // a batch landed (or failed) at the receiver
  kGetRequest,  // please send me these ranges of your region
  kGetError,    // a get request was refused
  kNote,        // a notification for the peer's handler
};

// Also the side channel's handshake label (channel_auth.h): 4 seals every frame after the
// handshake, so a side of another version is refused at the handshake with both named. 5 sends
// a batch's rows as runs of one shape (EncodeData); 6 repeats a group at a second stride
// (Strided::outer_count); 7 says in each kCommInit how the lane launches (CommInitMsg); 8 asks
// for a get's run groups as rows (GetRequestMsg::strided) where it named every row.
inline constexpr std::string_view kHelloMagic = "kvd-nccl/8";

// A stretch of a region: `length` bytes at `offset`.
struct Range {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const Range&) const = default;
};

// The smallest chunk a link sends or accepts: a batch's chunks and direct pieces are listed on
// the host, one entry per chunk_bytes of its ranges, so a peer's tiny chunk must not multiply
// them past the region's size / kMinChunkBytes.
inline constexpr uint64_t kMinChunkBytes = 4096;

// The rows of a run group (layout/plan.h) as one side sees them, repeated `outer_count` times:
// row i of block o is `length` bytes at offset + o·outer_stride + i·stride, a block is `count`
// rows. A TP split's page is one entry where ranges need one per token, and a page converted
// between head-major and token-major orders (LBNHC -> BLHNC: a group of 16 rows per head) one
// entry where groups need one per head (SplitGroups).
struct Strided {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t count = 0;
  int64_t stride = 0;
  uint64_t outer_count = 1;
  int64_t outer_stride = 0;
  // Block o as a group of its own (outer_count 1).
  Strided block(uint64_t o) const {
    return {offset + o * static_cast<uint64_t>(outer_stride), length, count, stride, 1, 0};
  }
  bool operator==(const Strided&) const = default;
};

// A block of several rows repeated at a second stride holds at least this many bytes (CheckStrided
// refuses less), so a peer's few bytes of announcement never stand for more copy descriptors than
// one per kMinBlockBytes of the region.
inline constexpr uint64_t kMinBlockBytes = 4096;

struct DataMsg {
  uint64_t seq = 0;
  uint64_t reply_to = 0;      // 0 for a put; the requester's get seq otherwise
  uint64_t region_id = 0;     // the receiver's registration (puts only)
  uint64_t chunk_bytes = 0;   // at least kMinChunkBytes
  uint64_t direct_bytes = 0;  // ranges at least this long travel direct; 0: none
  std::vector<Range> ranges;
  std::vector<Strided> strided;  // staged after the ranges; rows of at most chunk_bytes
  bool operator==(const DataMsg&) const = default;
};

struct AckMsg {
  uint64_t seq = 0;
  Status status;
};

// A get names the bytes as the responder's ranges and rows, staged in the requester's chunks
// (the reply is laid out in those, so the rows, cut to fit them, match it on both sides).
struct GetRequestMsg {
  uint64_t seq = 0;
  uint64_t region_id = 0;    // the responder's registration
  uint64_t chunk_bytes = 0;  // at least kMinChunkBytes
  std::vector<Range> ranges;
  std::vector<Strided> strided;  // staged after the ranges, as in a DataMsg
  bool operator==(const GetRequestMsg&) const = default;
};

// One lane of data flowing from the sender: the ncclUniqueId of its communicator, and whether
// its operations launch on a blocking communicator split from that one (lanes.h, Launch).
struct CommInitMsg {
  std::string unique_id;
  bool blocking_launch = false;
  bool operator==(const CommInitMsg&) const = default;
};

// The type of a frame; kInvalidArgument for an empty or unknown one.
Result<MsgType> PeekType(std::string_view frame);

std::string EncodeHello();
std::string EncodeCommInit(const CommInitMsg& msg);
std::string EncodeData(const DataMsg& msg);
std::string EncodeAck(const AckMsg& msg);
std::string EncodeGetRequest(const GetRequestMsg& msg);
std::string EncodeGetError(const AckMsg& msg);
std::string EncodeNote(std::string_view message);

Status DecodeHello(std::string_view frame);
Result<CommInitMsg> DecodeCommInit(std::string_view frame);
Result<DataMsg> DecodeData(std::string_view frame);
Result<AckMsg> DecodeAck(std::string_view frame);  // kAck and kGetError alike
Result<GetRequestMsg> DecodeGetRequest(std::string_view frame);
Result<std::string> DecodeNote(std::string_view frame);

// Total bytes of `ranges`, and of the rows of `strided`; kInvalidArgument on overflow.
Result<uint64_t> TotalBytes(std::span<const Range> ranges, std::span<const Strided> strided = {});
// A batch's bytes (TotalBytes) against the region it writes (a put) or reads (a get): a put never
// writes a byte twice (its runs do not overlap on the destination), and a get never asks for a
// byte twice, so one of more bytes than the region is malformed. Checked first, so a peer cannot
// make the receiver (the responder) lay out chunks for more than the region.
Status CheckBatchSize(uint64_t bytes, uint64_t region_bytes);
// A peer's ranges checked before any byte moves: inside [0, region_bytes).
Status CheckRanges(std::span<const Range> ranges, uint64_t region_bytes);
// A peer's rows checked before any byte moves: inside [0, region_bytes), rows of 1 to
// chunk_bytes bytes that do not overlap (|stride| >= length), at least one row each; repeated
// blocks (outer_count > 1) of at least kMinBlockBytes, each clear of the next (|outer_stride| at
// least a block's extent).
Status CheckStrided(std::span<const Strided> strided, uint64_t region_bytes, uint64_t chunk_bytes);

// A put's run groups as rows, in the receiver's view (`msg->strided`) and the sender's
// (`rows`). Rows travel staged, so a group whose rows do not fit a chunk goes as ranges
// (`msg->ranges`, and `gather` in the sender's view). Consecutive groups of one shape whose
// offsets step by constant amounts on both sides become one entry of several blocks, where
// CheckStrided accepts it (blocks of kMinBlockBytes, clear of each other on the receiver): a
// page's 8 heads in LBNHC -> BLHNC, so the announcement, the checks and the chunking of such a
// batch handle an eighth of the entries.
void SplitGroups(std::span<const RunGroup> groups, uint64_t chunk_bytes, DataMsg* msg,
                 std::vector<Range>* gather, std::vector<Strided>* rows);
// The same for blocks of groups the planner joined (layout/plan.h): each is one entry where
// CheckStrided accepts it as such, else its groups go through SplitGroups. The announcement is
// the one SplitGroups makes of the blocks' groups expanded wherever the planner's joins and
// SplitGroups' agree, which they do for a page's heads.
void SplitBlocks(std::span<const GroupBlocks> blocks, uint64_t chunk_bytes, DataMsg* msg,
                 std::vector<Range>* gather, std::vector<Strided>* rows);
// A get's runs, run groups and blocks of them (src_offset in the responder's region): the request
// names them in the responder's region (`req->ranges`, `req->strided`, at `req->chunk_bytes`),
// and `ranges` and `rows` say where the same bytes land in the requester's, in the same order.
// Joined as SplitGroups and SplitBlocks join a put's, with the responder in the receiver's place:
// the responder checks the rows it is asked for with CheckStrided, which takes them so joined.
void SplitGet(std::span<const Run> runs, std::span<const RunGroup> groups,
              std::span<const GroupBlocks> blocks, GetRequestMsg* req, std::vector<Range>* ranges,
              std::vector<Strided>* rows);

// Where a put is cut into pieces that move as batches of their own: piece k is entries
// [at[k], at[k + 1]) of its ranges, of its run groups and of its blocks of groups, in that order
// (`at` has one more element than there are pieces). A piece ends once it holds `piece_bytes`, so
// it holds at most that plus one entry; an entry is never cut; piece_bytes 0: one piece. The
// sender splits each piece into rows (SplitGroups, SplitBlocks) as it goes, so a large batch's
// first bytes move while it lays out the rest, and no announcement grows with its batch.
struct PieceStart {
  size_t ranges = 0;
  size_t groups = 0;
  size_t blocks = 0;
  bool operator==(const PieceStart&) const = default;
};
std::vector<PieceStart> CutIntoPieces(std::span<const Range> ranges,
                                      std::span<const RunGroup> groups,
                                      std::span<const GroupBlocks> blocks, uint64_t piece_bytes);

// A batch's ranges laid end to end in staging and cut into chunks of at most `chunk_bytes` of
// staging. Chunk k is runs[starts[k], starts[k + 1]) and holds bytes[k] bytes; its runs have one
// offset in the region and the other inside the chunk (see ChunkRuns).
struct Chunks {
  std::vector<Run> runs;
  std::vector<size_t> starts;   // count() + 1 entries
  std::vector<uint64_t> bytes;  // per chunk

  size_t count() const { return bytes.size(); }
  std::span<const Run> chunk(size_t k) const {
    return std::span<const Run>(runs).subspan(starts[k], starts[k + 1] - starts[k]);
  }
};

// The rows of a batch's groups laid end to end in staging after its ranges' chunks, cut into
// chunks of at most `chunk_bytes` (a row never straddles two: every row is at most chunk_bytes).
// Chunk k is groups[starts[k], starts[k + 1]) and holds bytes[k] bytes; each of its entries has
// one side in the region (the Strided rows) and the other packed in the chunk (stride = length,
// outer stride = a block's bytes).
struct GroupChunks {
  std::vector<GroupBlocks> groups;
  std::vector<size_t> starts;   // count() + 1 entries
  std::vector<uint64_t> bytes;  // per chunk

  size_t count() const { return bytes.size(); }
  std::span<const GroupBlocks> chunk(size_t k) const {
    return std::span<const GroupBlocks>(groups).subspan(starts[k], starts[k + 1] - starts[k]);
  }
};

// How a chunk's runs point: a gather reads the region (src_offset) and writes the chunk
// (dst_offset); a scatter the other way round.
enum class Direction { kGather, kScatter };

// chunk_bytes > 0; zero-length ranges are skipped.
Chunks ChunkRuns(std::span<const Range> ranges, uint64_t chunk_bytes, Direction direction);
// Every row at most chunk_bytes long (CheckStrided); rows of no bytes are skipped.
GroupChunks ChunkGroups(std::span<const Strided> strided, uint64_t chunk_bytes,
                        Direction direction);

// How a batch's ranges travel. A range of at least direct_bytes (when not 0) goes by ncclSend
// straight out of the sender's region into the receiver's, in pieces of at most piece_bytes:
// no gather, no scatter, no staging slot. The others are staged (gathered into chunks). Both
// sides compute this from the lengths alone, which they share in the same order.
struct DirectSplit {
  std::vector<Range> staged;  // in order
  std::vector<Range> direct;  // pieces, in order
};
DirectSplit SplitDirect(std::span<const Range> ranges, uint64_t direct_bytes, uint64_t piece_bytes);

}  // namespace kv::transport::nccl
