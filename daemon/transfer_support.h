// What kvd's protocol handlers share (transfer_support.cc): the limits of the engine and peer
// protocols, the checks of block ids and request ids, the RequestDone an engine hears, and the
// per-layer trace. Free functions without state: any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "layout/kv_region.h"
#include "protocol/kvd.pb.h"

namespace kv::daemon {

using Clock = std::chrono::steady_clock;

struct Engine;

// Limits of the engine protocol, shared by validation in several files.
inline constexpr size_t kMaxRequestIdBytes = 256;
inline constexpr int kMaxTpSize = 1024;
inline constexpr int kMaxRegionsPerEngine = 64;

// The per-layer timeline at debug level: "trace <us> <event> <request> <layer> <bytes>" on the
// steady clock, which every process on the host shares, so two kvds' lines merge into one
// timeline (tools/pd_timeline.py reads them).
void Trace(std::string_view event, const std::string& request, int layer, uint64_t bytes = 0);

// Limits of one transfer request (transfers.cc, destination.cc).
inline constexpr int64_t kMaxTokens = int64_t{1} << 24;
inline constexpr int kMaxBlocksPerRequest = 1 << 20;
// Block ids from an engine or a peer, checked against every region they will index, and enough of
// them for `tokens` (0: no token count to check).
Status CheckBlocks(std::span<const int64_t> ids, const std::vector<const KvRegion*>& regions,
                   int64_t tokens);
// The layouts of an engine's registered regions, for CheckBlocks.
std::vector<const KvRegion*> LayoutsOf(const Engine& engine);
// Protobuf's repeated ids as a span.
inline std::span<const int64_t> IdsOf(const google::protobuf::RepeatedField<int64_t>& ids) {
  return {ids.data(), static_cast<size_t>(ids.size())};
}
// Destination block ids named twice: refused, each would take two sources.
Status CheckDistinctBlocks(std::span<const int64_t> ids);

// An engine's or a peer's request id (transfers and offload ops): 1 to kMaxRequestIdBytes bytes.
Status CheckRequestId(const std::string& id);
// The RequestDone an engine hears when a transfer (sent: its source side) or an offload op ends.
proto::DaemonMessage RequestDoneMessage(const std::string& id, bool sent, const Status& status,
                                        uint64_t bytes, uint64_t runs);

}  // namespace kv::daemon
