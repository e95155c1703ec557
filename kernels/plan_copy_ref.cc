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
  for (const Run& run : runs)
    chunks += (run.length + kPlanCopyChunkBytes - 1) / kPlanCopyChunkBytes;
  return chunks;
}

uint64_t PlanCopyTableBytes(size_t num_runs, uint64_t num_chunks) {
  return num_runs * sizeof(Run) + (num_runs + 1) * sizeof(uint64_t) + num_chunks * sizeof(uint32_t);
}

Result<uint64_t> EncodePlanCopyTable(std::span<const Run> runs, void* table, uint64_t table_bytes) {
  if (runs.size() >= (uint64_t{1} << 32)) {
    return Status::InvalidArgument(std::to_string(runs.size()) + " runs exceed the 2^32 limit");
  }
  const uint64_t chunks = PlanCopyChunks(runs);
  if (table_bytes < PlanCopyTableBytes(runs.size(), chunks)) {
    return Status::InvalidArgument("plan copy table of " + std::to_string(table_bytes) +
                                   " bytes cannot hold " + std::to_string(runs.size()) + " runs");
  }
  auto* bytes = static_cast<unsigned char*>(table);
  std::memcpy(bytes, runs.data(), runs.size() * sizeof(Run));
  auto* first_chunk = reinterpret_cast<uint64_t*>(bytes + runs.size() * sizeof(Run));
  auto* chunk_run = reinterpret_cast<uint32_t*>(first_chunk + runs.size() + 1);
  uint64_t next = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    first_chunk[i] = next;
    const uint64_t end = next + (runs[i].length + kPlanCopyChunkBytes - 1) / kPlanCopyChunkBytes;
    for (; next < end; ++next) chunk_run[next] = static_cast<uint32_t>(i);
  }
  first_chunk[runs.size()] = next;
  return chunks;
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
