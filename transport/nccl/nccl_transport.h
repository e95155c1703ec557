// The "nccl" backend: moves plan runs between GPUs through NCCL point-to-point, on one host
// (NVLink / PCIe P2P) or between hosts (NCCL's network transports).
//
// address() is "tcp:<host>:<port>" of a TCP side channel this backend listens on. connect()
// opens one link (nccl_link.h) to the peer; its communicators are created on the first batch in
// each direction, bootstrapped by sending the ncclUniqueId over that link. register_memory()
// takes CUDA device memory and hands out a descriptor naming it by id; a peer's runs are checked
// against the registration before any byte moves. Batches are gathered into bounded staging
// slots, sent over one or more communicators, received and scattered as one pipeline the host
// enqueues at once (staging.h); large runs skip the staging. Completion comes with the
// receiver's ack. A put's runs must not overlap on the destination (the scatter kernels write
// them in parallel; kvd's plans never do): a put of more bytes than the destination registration
// holds is refused by the receiver before anything moves (kInvalidArgument in the completion).
// post() and notify() only queue work for the link's threads. A peer that dies or
// stops answering fails its batches with kUnavailable and its communicators are aborted, never
// waited on.
//
// NVLink multicast (NVLS) is not allowed on the shared machines and point-to-point never needs
// it, but NCCL takes it from the environment only: the program's main() sets NCCL_NVLS_ENABLE=0
// before NCCL starts (kvd and kvbench do), and removes NCCL_COMM_SPLIT_SHARE_RESOURCES, which
// would override the splitShare that blocking_launch's lanes rely on (lanes.h); this library
// sets and reads no environment variable.
//
// Settings: "device" (CUDA ordinal; default the current device), "listen_host" (default
// 127.0.0.1), "staging_bytes" (one staging slot and the chunk size; default 32 MiB; both sides
// of a link must allow the sender's size), "staging_slots" (slots per side and direction,
// 1..64; default 4), "lanes" (communicators per direction the sender opens, 1..4; default 4),
// "copy_ctas" (grid of the gather/scatter kernels, 0 = one CTA per SM; default 16),
// "group_ops" (sends or receives per NCCL launch, capped at staging_slots / 2; default 2),
// "direct_bytes" (runs at least this long skip staging: ncclSend from the region, ncclRecv into
// it; 0 = never; default 8 MiB), "timeout_ms" (connects, communicator
// creation and control messages; default 30000), "busy_poll" (0|1; default 0),
// "blocking_launch" (0|1: the sender's lanes launch on blocking communicators split from the
// non-blocking ones, on the link's own threads; 0: on a thread NCCL starts per launch; the
// sending side decides for both; default 0); `kvd --transport-opt KEY=VALUE` passes them
// (they replace the environment variable KVD_NCCL_SETTINGS). Staging memory: staging_slots ×
// staging_bytes per side, direction and link.
#pragma once

#include <memory>
#include <span>

#include "transport/transport.h"

namespace kv::transport {

// kUnsupported when no CUDA device is visible.
Result<std::unique_ptr<Transport>> CreateNcclTransport(const TransportOptions& options);
// The settings above, documented.
std::span<const SettingInfo> NcclSettings();

}  // namespace kv::transport
