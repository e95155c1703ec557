// The host side of the block table (plan_copy.h, "Repeated groups"): descriptor counts, the
// encoder, and the references the block kernel is tested against.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/plan_copy.h"

namespace kv::kernels {
namespace {

static_assert((kPlanCopyBlockChunkBytes & (kPlanCopyBlockChunkBytes - 1)) == 0 &&
                  kPlanCopyBlockChunkBytes <= (uint64_t{1} << 16),
              "rows and length must fit the descriptor's 16 bits");

// Whether blocks of `g` pack several to a descriptor: rows and length in [1, the chunk] (a power
// of two, so one comparison bounds both and their product cannot wrap), rows·length at most
// the chunk.
bool Packs(const RunGroup& g) {
  return ((g.count - 1) | (g.length - 1)) < kPlanCopyBlockChunkBytes &&
         g.count * g.length <= kPlanCopyBlockChunkBytes;
}

constexpr uint64_t kOffsetMask = kPlanCopyMaxOffset - 1;

}  // namespace

void CopyBlocksHost(const void* src_base, void* dst_base, std::span<const GroupBlocks> entries) {
  for (const GroupBlocks& e : entries) {
    for (uint64_t o = 0; o < e.outer_count; ++o) {
      const RunGroup block = e.block(o);
      CopyGroupsHost(src_base, dst_base, std::span(&block, 1));
    }
  }
}

uint64_t PlanCopyBlockChunks(const GroupBlocks& e) {
  const RunGroup& g = e.group;
  if (g.length == 0 || g.count == 0 || e.outer_count == 0) return 0;
  if (!Packs(g)) return e.outer_count * PlanCopyGroupChunks(g);
  // The usual case, one descriptor, without a division (both factors below 2^17).
  const uint64_t block_bytes = g.count * g.length;
  if (e.outer_count <= kPlanCopyBlockChunkBytes &&
      block_bytes * e.outer_count <= kPlanCopyBlockChunkBytes) {
    return 1;
  }
  const uint64_t per = kPlanCopyBlockChunkBytes / block_bytes;
  return (e.outer_count + per - 1) / per;
}

Result<uint64_t> EncodePlanCopyBlocks(std::span<const GroupBlocks> entries, uint64_t max_chunks,
                                      void* table) {
  auto* __restrict out = static_cast<PlanCopyBlockChunk*>(table);
  uint64_t n = 0;
  bool out_of_range = false;
  // Blocks per descriptor for the block size of the last entry that packs: a batch's entries
  // nearly always share one (a page's heads), so this divides once a batch.
  uint64_t shape_bytes = 0, per = 0;
  std::vector<PlanCopyGroupChunk> cut;  // a block too large to pack, as the group table cuts it
  auto full = [&](uint64_t need) {
    return Status::InvalidArgument("plan copy block table of " + std::to_string(max_chunks) +
                                   " chunks cannot hold " + std::to_string(n + need));
  };
  for (const GroupBlocks& e : entries) {
    const RunGroup& g = e.group;
    if (g.length == 0 || g.count == 0 || e.outer_count == 0) continue;
    if (Packs(g)) {
      const uint64_t block_bytes = g.count * g.length;
      if (block_bytes != shape_bytes) {
        shape_bytes = block_bytes;
        per = kPlanCopyBlockChunkBytes / block_bytes;
      }
      const uint64_t need = e.outer_count <= per ? 1 : (e.outer_count + per - 1) / per;
      if (need > max_chunks - n) return full(need);
      const uint64_t limit = kPlanCopyMaxOffset - g.length;
      const uint64_t src_high = (g.count - 1) << 48, dst_high = (g.length - 1) << 48;
      const uint64_t src_step = per * static_cast<uint64_t>(e.src_outer_stride);
      const uint64_t dst_step = per * static_cast<uint64_t>(e.dst_outer_stride);
      uint64_t src = g.src_offset, dst = g.dst_offset;
      for (uint64_t o = 0; o < e.outer_count; o += per, src += src_step, dst += dst_step) {
        out_of_range |= (src > limit) | (dst > limit);
        out[n++] = {src | src_high,
                    dst | dst_high,
                    g.src_stride,
                    g.dst_stride,
                    e.src_outer_stride,
                    e.dst_outer_stride,
                    std::min(per, e.outer_count - o),
                    0};
      }
      continue;
    }
    const uint64_t per_block = PlanCopyGroupChunks(g);
    if (per_block > (max_chunks - n) / e.outer_count) return full(per_block * e.outer_count);
    cut.resize(per_block);
    for (uint64_t o = 0; o < e.outer_count; ++o) {
      const RunGroup block = e.block(o);
      KV_ASSIGN_OR_RETURN(PlanCopyPrefix encoded,
                          EncodePlanCopyGroupPrefix(std::span(&block, 1), per_block, cut.data()));
      for (uint64_t c = 0; c < encoded.chunks; ++c) {
        out[n++] = {cut[c].src_offset_and_rows,
                    cut[c].dst_offset_and_length,
                    cut[c].src_stride,
                    cut[c].dst_stride,
                    0,
                    0,
                    1,
                    0};
      }
    }
  }
  if (out_of_range) return Status::InvalidArgument("plan copy offsets must stay below 2^48");
  return n;
}

Result<PlanCopyPrefix> EncodePlanCopyBlockPrefix(std::span<const GroupBlocks> entries,
                                                 uint64_t max_chunks, void* table) {
  PlanCopyPrefix prefix;
  for (; prefix.runs < entries.size(); ++prefix.runs) {
    const uint64_t need = PlanCopyBlockChunks(entries[prefix.runs]);
    if (need > max_chunks - prefix.chunks) break;
    prefix.chunks += need;
  }
  if (prefix.runs == 0 && !entries.empty()) {
    return Status::InvalidArgument("plan copy block table of " + std::to_string(max_chunks) +
                                   " chunks cannot hold the first entry");
  }
  KV_ASSIGN_OR_RETURN(const uint64_t written,
                      EncodePlanCopyBlocks(entries.first(prefix.runs), prefix.chunks, table));
  prefix.chunks = written;
  return prefix;
}

void CopyBlockTableHost(const void* src_base, void* dst_base, const void* table,
                        uint64_t num_chunks) {
  const auto* src = static_cast<const unsigned char*>(src_base);
  auto* dst = static_cast<unsigned char*>(dst_base);
  const auto* chunks = static_cast<const PlanCopyBlockChunk*>(table);
  for (uint64_t c = 0; c < num_chunks; ++c) {
    const PlanCopyBlockChunk& e = chunks[c];
    const uint64_t rows = (e.src_offset_and_rows >> 48) + 1;
    const uint64_t length = (e.dst_offset_and_length >> 48) + 1;
    for (uint64_t b = 0; b < e.blocks; ++b) {
      uint64_t s =
          (e.src_offset_and_rows & kOffsetMask) + b * static_cast<uint64_t>(e.src_outer_stride);
      uint64_t d =
          (e.dst_offset_and_length & kOffsetMask) + b * static_cast<uint64_t>(e.dst_outer_stride);
      for (uint64_t r = 0; r < rows; ++r) {
        std::memcpy(dst + d, src + s, length);
        s += static_cast<uint64_t>(e.src_stride);
        d += static_cast<uint64_t>(e.dst_stride);
      }
    }
  }
}

}  // namespace kv::kernels
