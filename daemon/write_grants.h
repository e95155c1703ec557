// The destination side's write grants (issue 19; Transport::guard_writes in transport.h): kvd
// guards every host region an engine registers, and a request's source may write into it
// only the request's destination blocks (push and pull alike: in pull the source puts the whole
// request once it finished), from the moment the Want leaves (Core::SendToPeer)
// until the request ends (Core::FinishDest revokes). Where the transport has a checked put path
// (ucx's put messages), a write outside a live grant of its sender is refused and the sender's
// endpoint closed; other backends check the registration's bounds only.
//
// Pure functions of their arguments; call them on the io thread like the rest of the Core.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "daemon/core.h"
#include "layout/kv_region.h"
#include "transport/transport.h"

namespace kv::daemon {

// The bytes `blocks` occupy in a region of `layout`, as offsets from its byte 0: for every index
// of the axes outside B (none when blocks-first), one range per block from its first to its last
// byte; sorted and merged. A page's inner padding is included, another block's bytes never are.
std::vector<transport::Transport::WriteRange> BlockWriteRanges(const KvRegion& layout,
                                                               std::span<const int64_t> blocks);

// Grants `peer` writes into the blocks of every rank of a request, on its host regions, under a
// fresh grant id (returned; revoke it with Transport::revoke_writes). 0 when the transport
// checks no grants.
Result<uint64_t> GrantLoadWrites(transport::Transport& transport, transport::PeerId peer,
                                 const std::map<int, LoadRank>& ranks);

}  // namespace kv::daemon
