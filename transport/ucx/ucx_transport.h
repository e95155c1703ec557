// The `ucx` backend: one ucp context and worker per Transport, one-sided put/get per run with one
// flush per batch, active messages for notifications. See ucx_transport.cc for the rules on
// deadlines, peer failure and memory lifetime.
#pragma once

#include <memory>
#include <span>

#include "transport/transport.h"

namespace kv::transport {

// Settings: the backend's own, "max_inflight_bytes" (the per-peer bound of ucx_engine.h, > 0;
// default 16 MiB) and "put_path" (auto|am|rma, ucx_am_put.cc; default auto), and UCX
// configuration variables: every other key, with or without the "UCX_" prefix ({"UCX_TLS",
// "tcp"}), applied over UCX's environment (ucx_context.h). A value UCX cannot parse is
// kInvalidArgument (an unknown name, UCX only warns about), as is a bad value of the backend's
// own. These replace the environment variables KV_UCX_MAX_INFLIGHT_BYTES and KV_UCX_PUT_PATH.
Result<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options);
// The settings above, documented (the factory lists them under "ucx").
std::span<const SettingInfo> UcxSettings();

}  // namespace kv::transport
