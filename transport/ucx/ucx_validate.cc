#include "transport/ucx/ucx_validate.h"

#include <ucp/api/ucp.h>
#include <ucs/memory/memory_type.h>

#include <cstring>
#include <string>

namespace kv::transport::ucx {

Status CheckPackedRkey(std::string_view packed) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("malformed ucx remote key of " + std::to_string(packed.size()) +
                                   " bytes: " + why);
  };
  if (packed.size() > kMaxRkeyBytes) return bad("too long");
  if (packed.size() < sizeof(uint64_t) + 1) return bad("shorter than its header");
  uint64_t md_map = 0;
  std::memcpy(&md_map, packed.data(), sizeof md_map);
  // A key that names no memory domain makes UCX emulate RMA in software: the target's UCX then
  // reads or writes whatever address it is given (issue 19 read kvd's ELF header that way).
  // Every key UCX packs for registered memory names at least one (tcp alone: md 0).
  if (md_map == 0) return bad("it names no memory domain (UCX would emulate RMA)");
  const auto mem_type = static_cast<uint8_t>(packed[sizeof md_map]);
  if (mem_type >= UCS_MEMORY_TYPE_LAST)
    return bad("unknown memory type " + std::to_string(mem_type));
  size_t at = sizeof md_map + 1;
  for (int md = 0; md < 64; ++md) {
    if ((md_map & (uint64_t{1} << md)) == 0) continue;
    if (at >= packed.size()) return bad("memory domain " + std::to_string(md) + " missing");
    const size_t size = static_cast<uint8_t>(packed[at]);
    at += 1 + size;
    if (at > packed.size()) return bad("memory domain " + std::to_string(md) + " overruns it");
  }
  const size_t rest = packed.size() - at;
  // Optional: one system device byte and a 3-byte distance per device.
  if (rest != 0 && (rest - 1) % 3 != 0) return bad(std::to_string(rest) + " trailing bytes");
  return Status::Ok();
}

Result<uint64_t> WorkerUid(std::string_view address) {
  if (address.size() < 1 + sizeof(uint64_t) || address.size() > kMaxWorkerAddressBytes) {
    return Status::InvalidArgument("ucx worker address of " + std::to_string(address.size()) +
                                   " bytes");
  }
  // ucp_worker_address_query reads the header and the id only; it takes a non-const pointer.
  std::string copy(address);
  ucp_worker_address_attr_t attr{};
  attr.field_mask = UCP_WORKER_ADDRESS_ATTR_FIELD_UID;
  if (ucp_worker_address_query(reinterpret_cast<ucp_address_t*>(copy.data()), &attr) != UCS_OK) {
    return Status::InvalidArgument("unreadable ucx worker address");
  }
  return attr.worker_uid;
}

}  // namespace kv::transport::ucx
