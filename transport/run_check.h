// Bounds checks every backend applies to a batch before anything is posted.
#pragma once

#include "transport/transport.h"

namespace kv::transport {

// kInvalidArgument for a batch without registrations; kOutOfRange (naming the run) when a run
// leaves [0, local->length()) on the local side or [0, remote->length()) on the remote side,
// with the sides taken from batch.op. Overflow-safe.
Status CheckBatch(const Batch& batch);

}  // namespace kv::transport
