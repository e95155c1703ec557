// Executing a transfer plan (layout/plan.h) on one machine: host memory, device memory, pinned
// host memory and a peer GPU's memory.
//
// Three executors of the same contract ("for every run, dst_base[dst_offset, +length) takes
// src_base[src_offset, +length)"), chosen at run time:
//  - CopyRunsHost: the CPU reference; what host-only regions use.
//  - The copy kernel: the whole run table in one launch. Runs are cut into chunks of at most
//    kPlanCopyChunkBytes; each warp copies one contiguous range of the chunk table, so megabyte
//    runs and one-byte runs balance, and reads the descriptors of 32 chunks with one load; 16-byte
//    vectors where source, destination and length allow, narrower accesses otherwise. A table of
//    fewer chunks than the grid has warps gives each chunk up to 16 warps, a slice each, so a
//    small launch still spreads over the SMs. The grid is capped (PlanCopyOptions::max_ctas) so
//    it can run beside model kernels.
//  - The copy engine: cudaMemcpyBatchAsync, best for few large runs and for pinned-host copies
//    that should leave the SMs alone.
// ChooseCopyPath picks between the last two by run size and direction.
//
// Runs must not overlap on the destination, and no run may read bytes another run writes; the
// plan guarantees both. Runs are trusted to lie inside both buffers: check runs that come from
// elsewhere with kv::ValidateRuns first. Peer memory needs cudaDeviceEnablePeerAccess by the
// caller; pinned host memory must be mapped (cudaHostAlloc/cudaHostRegister under UVA).
//
// Streams are cudaStream_t passed as void*, so this header builds without CUDA. In a build
// without CUDA every device entry point returns kUnsupported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "base/status.h"
#include "layout/plan.h"

namespace kv::kernels {

// ---- CPU reference ---------------------------------------------------------------------------
void CopyRunsHost(const void* src_base, void* dst_base, std::span<const Run> runs);

// ---- The copy kernel -------------------------------------------------------------------------
inline constexpr uint64_t kPlanCopyChunkBytes = 32 * 1024;

struct PlanCopyOptions {
  int max_ctas = 0;  // grid cap; 0 means one CTA per SM of the current device
};

// The device-side run table is one 16-byte descriptor per chunk, so a warp finds its work with
// one coalesced load and no dependent look-ups, and the table a pipeline uploads per copy stays
// small (1 MiB for 1 GiB of 16 KiB pages). Offsets must be below 2^48 (kInvalidArgument
// otherwise), which leaves the high 16 bits of the destination word for the length.
struct PlanCopyChunk {
  uint64_t src_offset;
  uint64_t dst_offset_and_length;  // dst_offset | (length - 1) << 48
};
static_assert(sizeof(PlanCopyChunk) == 16);
inline constexpr uint64_t kPlanCopyMaxOffset = uint64_t{1} << 48;

// Built on the host in O(chunks), moved to the device by an asynchronous copy, read by the kernel.
// The table depends only on the chunk count; num_runs is accepted so existing callers compile.
uint64_t PlanCopyChunks(std::span<const Run> runs);
uint64_t PlanCopyTableBytes(size_t num_runs, uint64_t num_chunks);
uint64_t PlanCopyRunChunks(const Run& run);
// Encodes `runs` into `table` (table_bytes ≥ PlanCopyTableBytes(runs.size(), chunks)); returns
// the number of chunks. kInvalidArgument when the table is too small or an offset is ≥ 2^48.
Result<uint64_t> EncodePlanCopyTable(std::span<const Run> runs, void* table, uint64_t table_bytes);
// Encodes the longest prefix of `runs` whose chunks fit in max_chunks (table holds that many),
// in one pass, for copies that go in pieces: `runs` of the prefix (zero-length runs included)
// and its `chunks`. kInvalidArgument when the first run alone needs more than max_chunks, or for
// an offset ≥ 2^48 (the table then holds garbage).
struct PlanCopyPrefix {
  size_t runs = 0;
  uint64_t chunks = 0;
};
Result<PlanCopyPrefix> EncodePlanCopyPrefix(std::span<const Run> runs, uint64_t max_chunks,
                                            void* table);

// One launch over a table already resident on the device (16-byte aligned). Asynchronous on
// `stream`. num_runs is unused by the kernel (see PlanCopyTableBytes).
Status LaunchPlanCopy(const void* src_base, void* dst_base, const void* device_table,
                      size_t num_runs, uint64_t num_chunks, const PlanCopyOptions& options,
                      void* stream);

// Owns a pool of device run tables and their pinned staging buffers, so that a pipeline of
// copies never waits for a table: Copy() encodes into pinned memory and uploads on a stream of
// its own; the caller's stream waits for the upload (an event, on the device) and launches. So
// the upload of copy i+1 overlaps copy i and anything else queued on the caller's stream. A copy
// takes the least recently used table if its launch finished, else a new one (16 exist from the
// start, 128 KiB each on the device and in pinned memory): copies held back
// on the device (behind an engine's CUDA event) never block the host. With 256 tables in flight
// Copy() fails with kUnavailable rather than wait. Outgrown tables are freed with the copier
// (cudaFree would wait for the whole device). Not thread-safe:
// one PlanCopier per thread; copies on different streams are fine. The streams must belong to
// the device that was current at Create().
class PlanCopier {
 public:
  // Allocates on the current CUDA device. kUnsupported without CUDA.
  static Result<std::unique_ptr<PlanCopier>> Create(const PlanCopyOptions& options = {});
  ~PlanCopier();
  PlanCopier(const PlanCopier&) = delete;
  PlanCopier& operator=(const PlanCopier&) = delete;

  // On an idle stream, a copy of more than 2 * kFirstPieceChunks chunks is split into several
  // launches (see plan_copy.cu); the contract is the same.
  Status Copy(const void* src_base, void* dst_base, std::span<const Run> runs, void* stream);

  // The rows of `groups`, through the group kernel, in pieces like Copy().
  Status CopyGroups(const void* src_base, void* dst_base, std::span<const RunGroup> groups,
                    void* stream);
  // The rows of block entries, through the block kernel, in pieces like Copy().
  Status CopyBlocks(const void* src_base, void* dst_base, std::span<const GroupBlocks> entries,
                    void* stream);

  static constexpr uint64_t kFirstPieceChunks = 4096;
  static constexpr uint64_t kPieceGrowth = 2;

 private:
  struct Impl;
  // Copies the longest prefix of `runs` that fits in max_chunks (at least the first run).
  Result<PlanCopyPrefix> CopyPrefix(const void* src_base, void* dst_base, std::span<const Run> runs,
                                    uint64_t max_chunks, void* stream);
  Result<PlanCopyPrefix> CopyGroupPrefix(const void* src_base, void* dst_base,
                                         std::span<const RunGroup> groups, uint64_t max_chunks,
                                         void* stream);
  Result<PlanCopyPrefix> CopyBlockPrefix(const void* src_base, void* dst_base,
                                         std::span<const GroupBlocks> entries, uint64_t max_chunks,
                                         void* stream);
  explicit PlanCopier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- Run groups -------------------------------------------------------------------------------
// The same contract for the rows of run groups (layout/plan.h), by a kernel of its own whose
// table holds one 32-byte descriptor per chunk of rows: rows of one group, rows·length at most
// kPlanCopyChunkBytes (a row longer than that is cut into single-row chunks). A TP 1 -> 2 page
// (16 rows of 2 KiB) is one descriptor where the run table needs 16, so the host encodes and
// uploads an eighth of the bytes. Row offsets must stay below 2^48 like run offsets.
struct PlanCopyGroupChunk {
  uint64_t src_offset_and_rows;    // src_offset | (rows - 1) << 48
  uint64_t dst_offset_and_length;  // dst_offset | (length - 1) << 48
  int64_t src_stride;
  int64_t dst_stride;
};
static_assert(sizeof(PlanCopyGroupChunk) == 32);

// The rows of `groups`, in order, by memcpy: the reference the group paths are tested against.
void CopyGroupsHost(const void* src_base, void* dst_base, std::span<const RunGroup> groups);
// Descriptors `group` takes in the group table (0 for rows of no bytes).
uint64_t PlanCopyGroupChunks(const RunGroup& group);
// As EncodePlanCopyPrefix, in whole groups: `runs` of the result counts groups.
Result<PlanCopyPrefix> EncodePlanCopyGroupPrefix(std::span<const RunGroup> groups,
                                                 uint64_t max_chunks, void* table);
// What the group kernel does with an encoded table, on the host: the reference its tests use.
void CopyGroupTableHost(const void* src_base, void* dst_base, const void* table,
                        uint64_t num_chunks);
// One launch over a group table already resident on the device (16-byte aligned).
Status LaunchPlanCopyGroups(const void* src_base, void* dst_base, const void* device_table,
                            uint64_t num_chunks, const PlanCopyOptions& options, void* stream);

// ---- Repeated groups ---------------------------------------------------------------------------
// The same contract for the rows of GroupBlocks entries (layout/plan.h), by a third kernel whose
// table holds one 64-byte descriptor per chunk: whole blocks of one entry, blocks·rows·length at
// most kPlanCopyBlockChunkBytes. A block larger than that goes block by block, as the group
// table cuts a group (rows of at most kPlanCopyChunkBytes, a longer row alone in pieces). A page
// of LBNHC -> BLHNC (8 blocks of 16 rows of 512 B) is one descriptor where the group table needs
// 8, so the host writes and uploads a quarter of the bytes. Row offsets stay below 2^48.
inline constexpr uint64_t kPlanCopyBlockChunkBytes = 64 * 1024;

struct PlanCopyBlockChunk {
  uint64_t src_offset_and_rows;    // src_offset | (rows per block - 1) << 48
  uint64_t dst_offset_and_length;  // dst_offset | (length - 1) << 48
  int64_t src_stride;
  int64_t dst_stride;
  int64_t src_outer_stride;
  int64_t dst_outer_stride;
  uint64_t blocks;  // at least 1
  uint64_t unused;
};
static_assert(sizeof(PlanCopyBlockChunk) == 64);

// The rows of `entries`, in order, by memcpy: the reference.
void CopyBlocksHost(const void* src_base, void* dst_base, std::span<const GroupBlocks> entries);
// Descriptors `entry` takes in the block table (0 for rows of no bytes).
uint64_t PlanCopyBlockChunks(const GroupBlocks& entry);
// Encodes every entry into `table`, which holds max_chunks descriptors; returns the number
// written. kInvalidArgument when they do not fit or an offset is at or past 2^48 (the table then
// holds garbage).
Result<uint64_t> EncodePlanCopyBlocks(std::span<const GroupBlocks> entries, uint64_t max_chunks,
                                      void* table);
// As EncodePlanCopyGroupPrefix, for block entries: the longest prefix of whole entries that fits
// max_chunks descriptors (`runs` of the result counts entries). kInvalidArgument when the first
// does not fit or an offset is at or past 2^48.
Result<PlanCopyPrefix> EncodePlanCopyBlockPrefix(std::span<const GroupBlocks> entries,
                                                 uint64_t max_chunks, void* table);
// What the block kernel does with an encoded table, on the host: the reference its tests use.
void CopyBlockTableHost(const void* src_base, void* dst_base, const void* table,
                        uint64_t num_chunks);
// One launch over a block table already resident on the device (16-byte aligned).
Status LaunchPlanCopyBlocks(const void* src_base, void* dst_base, const void* device_table,
                            uint64_t num_chunks, const PlanCopyOptions& options, void* stream);

// ---- The copy engine -------------------------------------------------------------------------
enum class CopyDirection : uint8_t { kDeviceToDevice, kDeviceToHost, kHostToDevice, kPeer };

// All runs through cudaMemcpyBatchAsync (in slices of at most kMaxBatchRuns descriptors; very
// large batches have crashed drivers). Sources are read in stream order: a device→host copy
// issued after the kernel that writes its pages must see those writes, which the driver does
// not promise under "any order" source access (vLLM PR 39306). The legacy default stream is
// not accepted by the batch API: kInvalidArgument for a null stream.
inline constexpr size_t kMaxBatchRuns = 4096;
Status LaunchBatchCopy(const void* src_base, void* dst_base, std::span<const Run> runs,
                       void* stream);

// ---- Choosing --------------------------------------------------------------------------------
enum class CopyPath : uint8_t { kKernel, kCopyEngine };
const char* CopyPathName(CopyPath path);
// Copy engine when runs are large on average (≥ kCopyEngineMinMeanRun) or the copy crosses
// PCIe with runs of at least kCopyEngineMinHostRun (DMA leaves the SMs to the model and
// reaches PCIe bandwidth without them); the kernel otherwise. Never the copy engine for a null
// stream.
inline constexpr uint64_t kCopyEngineMinMeanRun = 1 << 20;
inline constexpr uint64_t kCopyEngineMinHostRun = 256 << 10;
CopyPath ChooseCopyPath(std::span<const Run> runs, CopyDirection direction, void* stream);

}  // namespace kv::kernels
