// Bounds checks every backend applies to a batch before anything is posted.
#pragma once

#include "transport/transport.h"

namespace kv::transport {

// kInvalidArgument for a batch without registrations; kOutOfRange (naming the run) when a run
// or a group's row leaves [0, local->length()) on the local side or [0, remote->length()) on the
// remote side, with the sides taken from batch.op. Overflow-safe. Groups are kUnsupported unless
// the backend takes them (`takes_groups`), and blocks of groups likewise (`takes_blocks`);
// blocks are checked as ValidateBlocks does (layout/plan.h).
Status CheckBatch(const Batch& batch, bool takes_groups = false, bool takes_blocks = false);

}  // namespace kv::transport
