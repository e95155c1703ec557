// The `ucx` backend: one ucp context and worker per Transport, one-sided put/get per run with one
// flush per batch, active messages for notifications. See ucx_transport.cc for the rules on
// deadlines, peer failure and memory lifetime.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace kv::transport {

// options.settings are UCX configuration variables, with or without the "UCX_" prefix
// ({"UCX_TLS", "tcp"}); a value UCX cannot parse is kInvalidArgument (an unknown name, UCX only
// warns about).
Result<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options);

}  // namespace kv::transport
