#include "transport/staged/chunker.h"

#include <algorithm>

#include "transport/staged/wire.h"

namespace kv::transport::staged {
namespace {

// A slot with less room than this left starts a new chunk rather than take a sliver of a run.
constexpr uint64_t kMinPiece = 256;

void Close(std::vector<Chunk>& chunks, Chunk& open, bool with_table) {
  if (open.runs.empty()) return;
  open.payload_offset = with_table ? TableBytes(open.runs.size()) : 0;
  chunks.push_back(std::move(open));
  open = Chunk{};
}

}  // namespace

std::vector<Chunk> PlanChunks(std::span<const Run> runs, uint64_t slot_bytes, bool with_table) {
  const uint64_t entry = with_table ? kTableEntryBytes : 0;
  std::vector<Chunk> chunks;
  Chunk open;
  uint64_t used = 0;  // table and payload bytes of `open`
  for (const Run& run : runs) {
    uint64_t done = 0;
    while (done < run.length) {
      const uint64_t left = run.length - done;
      if (used + entry + std::min(left, kMinPiece) > slot_bytes) {
        Close(chunks, open, with_table);
        used = 0;
      }
      const uint64_t take = std::min(left, slot_bytes - used - entry);
      open.runs.push_back({run.src_offset + done, run.dst_offset + done, take});
      open.payload_bytes += take;
      used += entry + take;
      done += take;
    }
  }
  Close(chunks, open, with_table);
  return chunks;
}

std::vector<Run> GatherRuns(const Chunk& chunk) {
  std::vector<Run> out;
  out.reserve(chunk.runs.size());
  uint64_t at = chunk.payload_offset;
  for (const Run& r : chunk.runs) {
    out.push_back({r.src_offset, at, r.length});
    at += r.length;
  }
  return out;
}

std::vector<Run> SlotToRemoteRuns(const Chunk& chunk) {
  std::vector<Run> out;
  out.reserve(chunk.runs.size());
  uint64_t at = chunk.payload_offset;
  for (const Run& r : chunk.runs) {
    out.push_back({at, r.dst_offset, r.length});
    at += r.length;
  }
  return out;
}

}  // namespace kv::transport::staged
