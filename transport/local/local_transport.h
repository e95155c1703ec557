// The `local` backend: transports in one process, found by address ("local:<pid>:<n>"); an
// address of another process is refused (kIncompatible) rather than mistaken for one here.
//
// put/get are memcpy of the runs, done in post order on the initiator's progress thread;
// notifications are handed to the receiver's progress thread after the memcpy of every batch
// posted before them, which is what makes them ordered after the data. Deadlines are checked
// when a batch starts (a memcpy is not interruptible). Host memory only.
//
// Used by the daemon's embedded mode and by tests that need a Transport without a network.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace kv::transport {

Result<std::unique_ptr<Transport>> CreateLocalTransport(const TransportOptions& options);

}  // namespace kv::transport
