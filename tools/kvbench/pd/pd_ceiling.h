// The host P/D ceiling: what one thread copying kvd's runs from the prefill caches straight into
// the decode caches reaches on this machine. kvd over UCX moves host memory with one copy per
// byte on one thread per transfer (a put into the peer's shared memory, or the staged path's
// three), so that memcpy of the same runs, from the same source pages to the same destination
// pages (the engines' shared memory, mapped here too), bounds it from above. It runs after the
// last wave, with the kvds idle, over every run of that wave: a wave's footprint, as kvd moved it.
//
// Thread-compatible: the caller keeps the caches mapped and unwritten by others meanwhile.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "connector/connector.h"

namespace kv::connector {

struct CopyCeiling {
  double gbps = 0;     // median over the rounds
  uint64_t bytes = 0;  // per round: the wave's bytes
  uint64_t runs = 0;   // per round: the wave's runs, planned as kvd plans them
  int rounds = 0;
};

// Plans every request of a wave (request j: prefill_blocks[j] -> decode_blocks[j], `tokens`
// tokens, every layer) for every pair of ranks that moves something (layout/rank_pairs.h), then
// memcpy's the runs round after round (a warm-up round, then at least 3 and 0.25 s). Errors: the
// planner's; kInvalidArgument when the block lists differ in count.
Result<CopyCeiling> MeasureCopyCeiling(std::span<const KvCache> prefill,
                                       std::span<const KvCache> decode,
                                       std::span<const std::vector<int64_t>> prefill_blocks,
                                       std::span<const std::vector<int64_t>> decode_blocks,
                                       int64_t tokens);

}  // namespace kv::connector
