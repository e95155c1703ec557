#include "transport/nccl/chunk_tables.h"

#include "kernels/plan_copy.h"

namespace kv::transport::nccl {

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
    for (const GroupBlocks& e : groups.chunk(k)) n += kernels::PlanCopyBlockChunks(e);
    layout->first[runs + k] = group_descriptors;
    layout->count[runs + k] = n;
    layout->bytes[runs + k] = groups.bytes[k];
    group_descriptors += n;
  }
  layout->group_table =
      (kernels::PlanCopyTableBytes(chunks.runs.size(), run_descriptors) + 15) & ~15ull;
  layout->table_bytes =
      layout->group_table + group_descriptors * sizeof(kernels::PlanCopyBlockChunk);
}

Status EncodeTables(const Chunks& chunks, const GroupChunks& groups, const TableLayout& layout,
                    void* table) {
  auto* runs = static_cast<kernels::PlanCopyChunk*>(table);
  for (size_t k = 0; k < chunks.count(); ++k) {
    KV_RETURN_IF_ERROR(kernels::EncodePlanCopyTable(chunks.chunk(k), runs + layout.first[k],
                                                    layout.count[k] * sizeof(*runs))
                           .status());
  }
  auto* blocks = reinterpret_cast<kernels::PlanCopyBlockChunk*>(static_cast<char*>(table) +
                                                                layout.group_table);
  for (size_t k = 0; k < groups.count(); ++k) {
    const size_t c = layout.runs + k;
    KV_ASSIGN_OR_RETURN(
        const uint64_t written,
        kernels::EncodePlanCopyBlocks(groups.chunk(k), layout.count[c], blocks + layout.first[c]));
    if (written != layout.count[c]) {
      return Status::Internal("nccl: a chunk's groups did not fill their table");
    }
  }
  return Status::Ok();
}

}  // namespace kv::transport::nccl
