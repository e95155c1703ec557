// Cutting a batch's runs into chunks that each fit one staging slot, in order. A run longer
// than what is left of a slot is split across chunks, so any batch fits slots of any size
// ≥ kMinSlotBytes. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "layout/plan.h"

namespace kv::transport::staged {

inline constexpr uint64_t kMinSlotBytes = 4096;

struct Chunk {
  // Pieces of the batch's runs: src_offset in the local region, dst_offset in the remote one.
  std::vector<Run> runs;
  // Where the packed payload starts in the slot: after the range table when there is one.
  uint64_t payload_offset = 0;
  uint64_t payload_bytes = 0;
};

// with_table: each piece also takes kTableEntryBytes (wire.h) of the slot, for the table the
// receiver scatters by. slot_bytes ≥ kMinSlotBytes. Zero-length runs are dropped.
std::vector<Chunk> PlanChunks(std::span<const Run> runs, uint64_t slot_bytes, bool with_table);

// The chunk's pieces as copies from the local region into the slot (payload packed in order).
std::vector<Run> GatherRuns(const Chunk& chunk);
// The chunk's pieces as copies from the slot into the remote region.
std::vector<Run> SlotToRemoteRuns(const Chunk& chunk);

}  // namespace kv::transport::staged
