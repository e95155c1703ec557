// The host half of RunTables (run_tables.h): where each staged chunk's descriptors lie in one
// batch's table, and their encoding. CUDA-free, so that its cost per descriptor can be timed on
// a machine without a GPU (nccl_host_bench).
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "transport/nccl/wire.h"

namespace kv::transport::nccl {

// One batch's table: the plan copy table of its runs' chunks (kernels/plan_copy.h), then, from
// group_table bytes in (16-byte aligned, as the kernels read it), the block table of its
// groups' chunks (entries of repeated groups, GroupBlocks). Chunk k (runs' chunks first) has
// count[k] descriptors from first[k] in its own table and bytes[k] bytes of staging.
struct TableLayout {
  std::vector<uint64_t> first;
  std::vector<uint64_t> count;
  std::vector<uint64_t> bytes;
  size_t runs = 0;  // chunks of runs; those from `runs` on are groups'
  uint64_t group_table = 0;
  uint64_t table_bytes = 0;  // both tables
  size_t chunks() const { return first.size(); }
};

// Lays out the table of `chunks` and `groups` in *layout, whose vectors are reused.
void LayOutTables(const Chunks& chunks, const GroupChunks& groups, TableLayout* layout);
// Encodes them into `table` (layout.table_bytes, 16-byte aligned). kInvalidArgument for an
// offset at or past 2^48, kInternal where a chunk did not fit its count (a bug).
Status EncodeTables(const Chunks& chunks, const GroupChunks& groups, const TableLayout& layout,
                    void* table);

}  // namespace kv::transport::nccl
