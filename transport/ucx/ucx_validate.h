// Checks of what a peer hands kvd's UCX backend before UCX parses it (security issue 19). UCX
// trusts its packed worker addresses and remote keys: a malformed worker address aborts the
// process on an assertion inside ucp_ep_create, and 8 random bytes as a remote key made
// ucp_ep_rkey_unpack read past them and segfault. UCX parses neither with a length, so what can
// be checked from outside is checked here, for the layouts of UCX 1.13 (Debian 12's):
//  * a remote key is [md_map u64 | mem_type u8 | per MD in md_map: size u8, that many bytes]
//    and optionally [sys_dev u8 | 3 bytes per device distance]: walked exactly, every length
//    inside the buffer, mem_type a known memory type, at least one memory domain (a key with
//    none makes UCX emulate RMA: kvd never posts to one);
//  * a worker address: ucx_worker_address.h (walked entry by entry, UCX-free so that the fuzz
//    build, which has no UCX, runs it too).
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"
#include "transport/ucx/ucx_worker_address.h"

namespace kv::transport::ucx {

inline constexpr size_t kMaxRkeyBytes = 64 << 10;

Status CheckPackedRkey(std::string_view packed);

// The worker id (UCX's uid) a packed worker address names; kInvalidArgument when unreadable.
Result<uint64_t> WorkerUid(std::string_view address);

}  // namespace kv::transport::ucx
