// Host side of plan copy: the CPU reference, the run-table encoding and the path chooser. Built
// in every configuration; the device entry points live in plan_copy.cu (or cuda_stubs.cc).
#include <algorithm>
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

void CopyGroupsHost(const void* src_base, void* dst_base, std::span<const RunGroup> groups) {
  const auto* src = static_cast<const unsigned char*>(src_base);
  auto* dst = static_cast<unsigned char*>(dst_base);
  for (const RunGroup& g : groups) {
    for (uint64_t i = 0; i < g.count; ++i) {
      const Run r = g.row(i);
      std::memcpy(dst + r.dst_offset, src + r.src_offset, r.length);
    }
  }
}

namespace {

// Whether `g` is one chunk of the group table: rows and length in [1, kPlanCopyChunkBytes] (a
// power of two, so one comparison bounds both, and their product cannot wrap) and rows·length
// at most kPlanCopyChunkBytes. No division: two per group were the largest share of a post's
// host time (kvbench plan).
bool OneChunk(const RunGroup& g) {
  static_assert((kPlanCopyChunkBytes & (kPlanCopyChunkBytes - 1)) == 0);
  return ((g.count - 1) | (g.length - 1)) < kPlanCopyChunkBytes &&
         g.count * g.length <= kPlanCopyChunkBytes;
}

}  // namespace

uint64_t PlanCopyGroupChunks(const RunGroup& g) {
  if (OneChunk(g)) return 1;
  if (g.length == 0) return 0;
  if (g.length > kPlanCopyChunkBytes) return g.count * PlanCopyRunChunks({0, 0, g.length});
  const uint64_t per = kPlanCopyChunkBytes / g.length;
  return (g.count + per - 1) / per;
}

namespace {

// Rows per chunk for the length of the last group of several chunks: a batch's groups nearly
// always share one length, so this divides once a batch (their chunk count, once a group).
struct RowsPerChunk {
  uint64_t length = 0, rows = 0;
  uint64_t For(uint64_t l) {
    if (l != length) {
      length = l;
      rows = kPlanCopyChunkBytes / l;
    }
    return rows;
  }
};

// What a group that is not OneChunk adds at out[chunks]: `chunks` after it, or `need` when it
// would pass max_chunks (nothing written then). Out of line, so that the one-chunk loop keeps
// its state in registers.
struct GroupChunks {
  uint64_t chunks;
  uint64_t need;
  bool fits;
  bool out_of_range;
};
[[gnu::noinline]] GroupChunks PutGroupChunks(const RunGroup& g, uint64_t max_chunks,
                                             PlanCopyGroupChunk* __restrict out, uint64_t chunks,
                                             RowsPerChunk* per_length) {
  const uint64_t rows = g.count, length = g.length;
  if (rows == 0 || length == 0) return {chunks, 0, true, false};  // PlanCopyGroupChunks's cases
  const bool long_rows = length > kPlanCopyChunkBytes;
  const uint64_t per = long_rows ? 1 : per_length->For(length);
  const uint64_t need =
      long_rows ? rows * PlanCopyRunChunks({0, 0, length}) : (rows + per - 1) / per;
  if (chunks + need > max_chunks) return {chunks, need, false, false};
  bool out_of_range = long_rows && length > kPlanCopyMaxOffset;
  // A chunk's first row; the kernel steps from it to the others.
  auto put = [&](uint64_t src, uint64_t dst, uint64_t rows_in, uint64_t take, int64_t ss,
                 int64_t ds) {
    out_of_range |= src > kPlanCopyMaxOffset - take || dst > kPlanCopyMaxOffset - take;
    out[chunks++] = {src | (rows_in - 1) << 48, dst | (take - 1) << 48, ss, ds};
  };
  const uint64_t src_step = static_cast<uint64_t>(g.src_stride);
  const uint64_t dst_step = static_cast<uint64_t>(g.dst_stride);
  uint64_t src = g.src_offset, dst = g.dst_offset;
  if (long_rows) {
    for (uint64_t r = 0; r < rows; ++r, src += src_step, dst += dst_step) {
      for (uint64_t done = 0; done < length; done += kPlanCopyChunkBytes) {
        put(src + done, dst + done, 1, std::min(kPlanCopyChunkBytes, length - done), 0, 0);
      }
    }
  } else {
    for (uint64_t r = 0; r < rows; r += per, src += per * src_step, dst += per * dst_step) {
      put(src, dst, std::min(per, rows - r), length, g.src_stride, g.dst_stride);
    }
  }
  return {chunks, need, true, out_of_range};
}

}  // namespace

Result<PlanCopyPrefix> EncodePlanCopyGroupPrefix(std::span<const RunGroup> groups,
                                                 uint64_t max_chunks, void* table) {
  static_assert(kPlanCopyChunkBytes <= (uint64_t{1} << 16), "rows and length must fit 16 bits");
  PlanCopyGroupChunk* __restrict out = static_cast<PlanCopyGroupChunk*>(table);
  const RunGroup* __restrict in = groups.data();
  const size_t count = groups.size();
  size_t i = 0;
  uint64_t chunks = 0;
  bool out_of_range = false;
  RowsPerChunk per_length;
  // The common case, a group of one chunk, encoded from the shape (rows, length) of the last
  // such group: a batch's groups nearly always share it. Starts as a shape of one chunk.
  uint64_t shape_rows = 1, shape_length = 1;
  uint64_t src_high = 0, dst_high = 0, offset_limit = kPlanCopyMaxOffset - 1;
  for (; i < count; ++i) {
    const RunGroup& g = in[i];
    if ((g.count != shape_rows || g.length != shape_length) && OneChunk(g)) {
      shape_rows = g.count;
      shape_length = g.length;
      src_high = (shape_rows - 1) << 48;
      dst_high = (shape_length - 1) << 48;
      offset_limit = kPlanCopyMaxOffset - shape_length;
    }
    if (g.count == shape_rows && g.length == shape_length && chunks < max_chunks) {
      const uint64_t src = g.src_offset, dst = g.dst_offset;
      out_of_range |= (src > offset_limit) | (dst > offset_limit);
      out[chunks++] = {src | src_high, dst | dst_high, g.src_stride, g.dst_stride};
      continue;
    }
    // Several chunks, none, or a full table.
    const GroupChunks put = PutGroupChunks(g, max_chunks, out, chunks, &per_length);
    if (!put.fits) {
      if (chunks > 0) break;
      return Status::InvalidArgument("plan copy table of " + std::to_string(max_chunks) +
                                     " chunks cannot hold a group of " + std::to_string(put.need));
    }
    chunks = put.chunks;
    out_of_range |= put.out_of_range;
  }
  if (out_of_range) return Status::InvalidArgument("plan copy offsets must stay below 2^48");
  return PlanCopyPrefix{i, chunks};
}

void CopyGroupTableHost(const void* src_base, void* dst_base, const void* table,
                        uint64_t num_chunks) {
  const auto* src = static_cast<const unsigned char*>(src_base);
  auto* dst = static_cast<unsigned char*>(dst_base);
  const auto* chunks = static_cast<const PlanCopyGroupChunk*>(table);
  constexpr uint64_t kMask = kPlanCopyMaxOffset - 1;
  for (uint64_t c = 0; c < num_chunks; ++c) {
    const PlanCopyGroupChunk& e = chunks[c];
    const uint64_t rows = (e.src_offset_and_rows >> 48) + 1;
    const uint64_t length = (e.dst_offset_and_length >> 48) + 1;
    uint64_t s = e.src_offset_and_rows & kMask, d = e.dst_offset_and_length & kMask;
    for (uint64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + d, src + s, length);
      s += static_cast<uint64_t>(e.src_stride);
      d += static_cast<uint64_t>(e.dst_stride);
    }
  }
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
