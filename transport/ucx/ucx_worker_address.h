// A peer's UCX worker address, checked before ucp_ep_create reads it (security issue 19). UCX
// trusts a packed worker address: it has no length, and ucp_address_unpack and the transports'
// reachability checks read wherever its bytes point. Mutated addresses made ucp_ep_create abort
// on an assertion (an unknown address version), read past the end (truncated entries, lengths
// past the end, a missing "last" flag, endpoint-address flags) or fault inside a transport
// (an interface address shorter than that transport packs: transport/ucx/ucx_address_test.cc).
// Here the address is walked the way UCX 1.13 (Debian 12's) unpacks it, every read bounded.
// No UCX headers: the fuzz build (no UCX) runs it too (fuzz_ucx_address).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kv::transport::ucx {

inline constexpr size_t kMaxWorkerAddressBytes = 64 << 10;

// What CheckWorkerAddress reads of a packed worker address. The layout (UCX 1.13's
// ucp/wireup/address.c, pack flags of ucp_worker_get_address):
//   header: v1 one byte [flags:4 | version:4], v2 two bytes [version] [flags];
//           flags: 1 debug info (a worker name follows), 2 worker uid, 4 client id, 8 am only
//   uid u64 (flag 2) | client id u64 (flag 4) | name: length u8 + bytes (flag 1)
//   per device: md byte [empty 0x80 | v1: alloc 0x40, reg 0x20, md index:5 | v2: index:7,
//               127 = the index in the next byte]
//               length byte [last 0x80 | paths 0x40 | sys device 0x20 | device address
//               length:5, v2: 31 = the length in the next byte] [paths u8] [sys device u8]
//               device address
//     per interface: transport name checksum u16 | attributes (v1 16 bytes, v2 8 bytes)
//               length byte [last 0x80 | ep address 0x40 | interface address length:6, v2:
//               63 = the length in the next byte] | interface address
// A worker address carries no endpoint addresses, no empty device and at least one device.
// UCX 1.16 (read for comparison) packs its release into version 2's header (high nibble) and
// ends a version 1 address with an empty device carrying it: both are refused as kIncompatible,
// not guessed at.
struct WorkerAddressInfo {
  struct Interface {
    uint16_t transport_checksum = 0;  // UCX's checksum of the transport's name
    uint8_t device_address_length = 0;
    uint8_t interface_address_length = 0;
  };
  uint8_t version = 0;  // 0: UCX's address version 1, 1: version 2
  uint8_t flags = 0;
  uint64_t uid = 0;
  std::vector<Interface> interfaces;
};

// kIncompatible for an address version UCX 1.13 does not pack (UCX aborts on one) or another
// release's additions (above); kInvalidArgument naming the first entry that is truncated,
// overruns the buffer, counts past UCX's limits or carries flags a worker address never has, or
// the bytes after the last entry.
Result<WorkerAddressInfo> ParseWorkerAddress(std::string_view address);

// `own_address`: a worker address of this process (its header and its interfaces are the
// reference); `own_uids`: the ids of every worker of this process. kIncompatible when the peer's
// header or an interface's lengths differ from this process's (or when this process's own
// address does not parse: a UCX configuration, such as unified mode, whose addresses kvd cannot
// check, refuses every peer); kInvalidArgument for a malformed address (ParseWorkerAddress) or
// one naming a worker of this process.
Status CheckWorkerAddress(std::string_view address, std::string_view own_address,
                          const std::vector<uint64_t>& own_uids);

// UCT transports read a peer's device and interface addresses as fixed structures whose size can
// depend on bits inside them (cma's iface address grows by a pid namespace when a flag in its
// last byte is set): a checked address whose last interface is such a transport's can still be
// read past its end. kvd hands ucp_ep_create this copy: the address, then kWorkerAddressPadding
// zero bytes, so any such read stays inside kvd's buffer (and reads zeros: "no extension").
inline constexpr size_t kWorkerAddressPadding = 1024;
std::string PaddedWorkerAddress(std::string_view address);

}  // namespace kv::transport::ucx
