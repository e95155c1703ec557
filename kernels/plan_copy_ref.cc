// Host side of plan copy: the CPU reference, the run-table encoding and the path chooser. Built
// in every configuration; the device entry points live in plan_copy.cu (or cuda_stubs.cc).
#include <cstring>
#include <string>

#include "kernels/plan_copy.h"

namespace kv::kernels {

void CopyRunsHost(const void* src_base, void* dst_base, std::span<const Run> runs) {
  const auto* src = static_cast<const unsigned char*>(src_base);
  auto* dst = static_cast<unsigned char*>(dst_base);
  for (const Run& run : runs) std::memcpy(dst + run.dst_offset, src + run.src_offset, run.length);
}

uint64_t PlanCopyChunks(std::span<const Run> runs) {
  uint64_t chunks = 0;
  for (const Run& run : runs) chunks += PlanCopyRunChunks(run);
  return chunks;
}

uint64_t PlanCopyTableBytes(size_t /*num_runs*/, uint64_t num_chunks) {
  return num_chunks * sizeof(PlanCopyChunk);
}

uint64_t PlanCopyRunChunks(const Run& run) {
  return (run.length + kPlanCopyChunkBytes - 1) / kPlanCopyChunkBytes;
}

Result<uint64_t> EncodePlanCopyTable(std::span<const Run> runs, void* table, uint64_t table_bytes) {
  const uint64_t chunks = PlanCopyChunks(runs);
  if (table_bytes < PlanCopyTableBytes(runs.size(), chunks)) {
    return Status::InvalidArgument("plan copy table of " + std::to_string(table_bytes) +
                                   " bytes cannot hold " + std::to_string(chunks) + " chunks");
  }
  KV_ASSIGN_OR_RETURN(PlanCopyPrefix prefix, EncodePlanCopyPrefix(runs, chunks, table));
  return prefix.chunks;
}

Result<PlanCopyPrefix> EncodePlanCopyPrefix(std::span<const Run> runs, uint64_t max_chunks,
                                            void* table) {
  static_assert(kPlanCopyChunkBytes <= (uint64_t{1} << 16), "chunk length must fit 16 bits");
  // Locals and restrict pointers: with the counters in the returned struct and the table typed
  // like the runs, every store could alias them and the compiler reloaded both per run (7.5 ns
  // a run on the 2-core VM, the largest share of a 131072-run post).
  PlanCopyChunk* __restrict out = static_cast<PlanCopyChunk*>(table);
  const Run* __restrict in = runs.data();
  const size_t count = runs.size();
  size_t i = 0;
  uint64_t chunks = 0;
  bool out_of_range = false;  // checked once at the end: the table may then hold garbage
  for (; i < count; ++i) {
    const uint64_t src = in[i].src_offset, dst = in[i].dst_offset, length = in[i].length;
    if (length == 0) continue;
    out_of_range |= length > kPlanCopyMaxOffset || src > kPlanCopyMaxOffset - length ||
                    dst > kPlanCopyMaxOffset - length;
    if (length <= kPlanCopyChunkBytes) {  // the common case: one chunk
      if (chunks >= max_chunks) break;    // with chunks == 0 (max_chunks 0), reported below
      out[chunks++] = {src, dst | (length - 1) << 48};
      continue;
    }
    const uint64_t need = (length + kPlanCopyChunkBytes - 1) / kPlanCopyChunkBytes;
    if (chunks > 0 && chunks + need > max_chunks) break;
    if (need > max_chunks) {
      return Status::InvalidArgument("plan copy table of " + std::to_string(max_chunks) +
                                     " chunks cannot hold a run of " + std::to_string(need));
    }
    uint64_t s = src, d = dst, left = length;
    for (; left > kPlanCopyChunkBytes; left -= kPlanCopyChunkBytes) {
      out[chunks++] = {s, d | (kPlanCopyChunkBytes - 1) << 48};
      s += kPlanCopyChunkBytes;
      d += kPlanCopyChunkBytes;
    }
    out[chunks++] = {s, d | (left - 1) << 48};
  }
  if (i < count && chunks == 0) {
    return Status::InvalidArgument("plan copy table of " + std::to_string(max_chunks) +
                                   " chunks cannot hold a run of 1");
  }
  if (out_of_range) return Status::InvalidArgument("plan copy offsets must stay below 2^48");
  return PlanCopyPrefix{i, chunks};
}

const char* CopyPathName(CopyPath path) {
  return path == CopyPath::kCopyEngine ? "copy-engine" : "kernel";
}

CopyPath ChooseCopyPath(std::span<const Run> runs, CopyDirection direction, void* stream) {
  if (stream == nullptr || runs.empty()) return CopyPath::kKernel;
  uint64_t bytes = 0;
  for (const Run& run : runs) bytes += run.length;
  const uint64_t mean = bytes / runs.size();
  const bool crosses_pcie =
      direction == CopyDirection::kDeviceToHost || direction == CopyDirection::kHostToDevice;
  if (mean >= kCopyEngineMinMeanRun) return CopyPath::kCopyEngine;
  if (crosses_pcie && mean >= kCopyEngineMinHostRun) return CopyPath::kCopyEngine;
  return CopyPath::kKernel;
}

}  // namespace kv::kernels
