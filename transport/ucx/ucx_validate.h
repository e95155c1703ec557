// Checks of what a peer hands kvd's UCX backend before UCX parses it (security issue 19). UCX
// trusts its packed worker addresses and remote keys: a malformed worker address aborts the
// process on an assertion inside ucp_ep_create, and 8 random bytes as a remote key made
// ucp_ep_rkey_unpack read past them and segfault. UCX parses neither with a length, so what can
// be checked from outside is checked here, for the layouts of UCX 1.13 (Debian 12's):
//  * a remote key is [md_map u64 | mem_type u8 | per MD in md_map: size u8, that many bytes]
//    and optionally [sys_dev u8 | 3 bytes per device distance]: walked exactly, every length
//    inside the buffer, mem_type a known memory type, at least one memory domain (a key with
//    none makes UCX emulate RMA: kvd never posts to one);
//  * a worker address is [header u8 | uuid u64 | ...]: bounded in size, its header byte the one
//    this UCX build packs (same address version and flags), its worker id readable through
//    ucp_worker_address_query and not one of this process's own workers (an endpoint to itself
//    would let a peer make kvd act on its own memory).
// The rest of a worker address (device and interface entries) is not parsed here: a peer that
// proved the cluster secret can still craft one UCX chokes on (SECURITY.md, known gaps).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kv::transport::ucx {

inline constexpr size_t kMaxWorkerAddressBytes = 64 << 10;
inline constexpr size_t kMaxRkeyBytes = 64 << 10;

Status CheckPackedRkey(std::string_view packed);

// The worker id (UCX's uid) a packed worker address names; kInvalidArgument when unreadable.
Result<uint64_t> WorkerUid(std::string_view address);

// `own_address`: a worker address of this process (its header byte is the reference);
// `own_uids`: the ids of every worker of this process.
Status CheckWorkerAddress(std::string_view address, std::string_view own_address,
                          const std::vector<uint64_t>& own_uids);

}  // namespace kv::transport::ucx
