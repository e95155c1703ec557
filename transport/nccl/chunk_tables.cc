#include "transport/nccl/chunk_tables.h"

#include <span>

#include "kernels/plan_copy.h"

namespace kv::transport::nccl {
namespace {

// The group table of one chunk's entries, `count` descriptors (LayOutTables's). A block that is
// one descriptor (a page's head: 16 rows of 512 B) is written here, block after block at the
// outer strides; any other through the kernels' encoder, a block at a time.
Status EncodeGroupBlocks(std::span<const GroupBlocks> entries, uint64_t count,
                         kernels::PlanCopyGroupChunk* out) {
  uint64_t written = 0;
  bool out_of_range = false;
  for (const GroupBlocks& e : entries) {
    const RunGroup& g = e.group;
    const uint64_t per_block = kernels::PlanCopyGroupChunks(g);
    if (per_block == 0) continue;
    if (e.outer_count > (count - written) / per_block) {
      return Status::Internal("nccl: a chunk's groups did not fit their table");
    }
    if (per_block > 1) {
      for (uint64_t o = 0; o < e.outer_count; ++o) {
        const RunGroup block = e.block(o);
        KV_ASSIGN_OR_RETURN(kernels::PlanCopyPrefix encoded,
                            kernels::EncodePlanCopyGroupPrefix(std::span(&block, 1),
                                                               count - written, out + written));
        written += encoded.chunks;
      }
      continue;
    }
    const uint64_t limit = kernels::kPlanCopyMaxOffset - g.length;
    const uint64_t src_high = (g.count - 1) << 48, dst_high = (g.length - 1) << 48;
    const auto src_outer = static_cast<uint64_t>(e.src_outer_stride);
    const auto dst_outer = static_cast<uint64_t>(e.dst_outer_stride);
    uint64_t src = g.src_offset, dst = g.dst_offset;
    for (uint64_t o = 0; o < e.outer_count; ++o, src += src_outer, dst += dst_outer) {
      out_of_range |= (src > limit) | (dst > limit);
      out[written++] = {src | src_high, dst | dst_high, g.src_stride, g.dst_stride};
    }
  }
  if (out_of_range) return Status::InvalidArgument("plan copy offsets must stay below 2^48");
  if (written != count) return Status::Internal("nccl: a chunk's groups did not fill their table");
  return Status::Ok();
}

}  // namespace

void LayOutTables(const Chunks& chunks, const GroupChunks& groups, TableLayout* layout) {
  const size_t runs = chunks.count();
  const size_t total = runs + groups.count();
  layout->first.resize(total);
  layout->count.resize(total);
  layout->bytes.resize(total);
  layout->runs = runs;
  uint64_t run_descriptors = 0, group_descriptors = 0;
  for (size_t k = 0; k < runs; ++k) {
    layout->first[k] = run_descriptors;
    layout->count[k] = kernels::PlanCopyChunks(chunks.chunk(k));
    layout->bytes[k] = chunks.bytes[k];
    run_descriptors += layout->count[k];
  }
  for (size_t k = 0; k < groups.count(); ++k) {
    uint64_t n = 0;
    for (const GroupBlocks& e : groups.chunk(k)) {
      n += e.outer_count * kernels::PlanCopyGroupChunks(e.group);
    }
    layout->first[runs + k] = group_descriptors;
    layout->count[runs + k] = n;
    layout->bytes[runs + k] = groups.bytes[k];
    group_descriptors += n;
  }
  layout->group_table =
      (kernels::PlanCopyTableBytes(chunks.runs.size(), run_descriptors) + 15) & ~15ull;
  layout->table_bytes =
      layout->group_table + group_descriptors * sizeof(kernels::PlanCopyGroupChunk);
}

Status EncodeTables(const Chunks& chunks, const GroupChunks& groups, const TableLayout& layout,
                    void* table) {
  auto* runs = static_cast<kernels::PlanCopyChunk*>(table);
  for (size_t k = 0; k < chunks.count(); ++k) {
    KV_RETURN_IF_ERROR(kernels::EncodePlanCopyTable(chunks.chunk(k), runs + layout.first[k],
                                                    layout.count[k] * sizeof(*runs))
                           .status());
  }
  auto* rows = reinterpret_cast<kernels::PlanCopyGroupChunk*>(static_cast<char*>(table) +
                                                              layout.group_table);
  for (size_t k = 0; k < groups.count(); ++k) {
    const size_t c = layout.runs + k;
    KV_RETURN_IF_ERROR(EncodeGroupBlocks(groups.chunk(k), layout.count[c], rows + layout.first[c]));
  }
  return Status::Ok();
}

}  // namespace kv::transport::nccl
