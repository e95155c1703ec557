#include "transport/ucx/ucx_worker_address.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace kv::transport::ucx {

namespace {

// UCX 1.13's limits (ucp/core/ucp_types.h): resources per context, memory domains in a map,
// system devices in a map.
constexpr size_t kMaxInterfaces = 128;
constexpr unsigned kMaxMemoryDomains = 64;
constexpr unsigned kMaxSystemDevices = 64;
// UCX's address versions 1 and 2 as the header's low nibble packs them.
constexpr uint8_t kVersion1 = 0, kVersion2 = 1;
constexpr uint8_t kFlagDebugInfo = 1, kFlagWorkerUid = 2, kFlagClientId = 4, kFlagAmOnly = 8;
constexpr uint8_t kNullResource = 0xff;  // an address with no device at all
constexpr uint8_t kLast = 0x80, kEmptyDevice = 0x80, kHasEpAddress = 0x40, kNumPaths = 0x40,
                  kSysDevice = 0x20;

// A bounds-checked reader over the address; every failure names where it happened.
class AddressReader {
 public:
  explicit AddressReader(std::string_view bytes) : bytes_(bytes) {}
  size_t at() const { return at_; }
  size_t left() const { return bytes_.size() - at_; }
  bool u8(uint8_t* out) {
    if (left() < 1) return false;
    *out = static_cast<uint8_t>(bytes_[at_++]);
    return true;
  }
  template <typename T>
  bool raw(T* out) {
    if (left() < sizeof(T)) return false;
    std::memcpy(out, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool skip(size_t n) {
    if (left() < n) return false;
    at_ += n;
    return true;
  }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
};

// A value packed in the low bits of a byte; in address version 2 the all-ones value means "the
// value is the next byte" (ucp_address_unpack_byte_extended).
bool ExtendedValue(AddressReader& in, uint8_t first, uint8_t mask, uint8_t version,
                   uint8_t* value) {
  *value = first & mask;
  if (version == kVersion2 && *value == mask) return in.u8(value);
  return true;
}

// Version 1's interface attributes: overhead, bandwidth, latency overhead (floats), then
// priority and capability flags (u32). UCX refuses a bandwidth <= 0 but not a NaN.
bool SaneV1Attributes(const char* attributes) {
  float overhead, bandwidth, latency;
  std::memcpy(&overhead, attributes, 4);
  std::memcpy(&bandwidth, attributes + 4, 4);
  std::memcpy(&latency, attributes + 8, 4);
  return std::isfinite(overhead) && overhead >= 0 && std::isfinite(bandwidth) && bandwidth > 0 &&
         std::isfinite(latency) && latency >= 0;
}

}  // namespace

Result<WorkerAddressInfo> ParseWorkerAddress(std::string_view address) {
  auto bad = [&](size_t at, const std::string& why) {
    return Status::InvalidArgument("malformed ucx worker address of " +
                                   std::to_string(address.size()) + " bytes at byte " +
                                   std::to_string(at) + ": " + why);
  };
  if (address.size() > kMaxWorkerAddressBytes) return bad(0, "too long");
  AddressReader in(address);
  WorkerAddressInfo info;
  uint8_t header = 0;
  if (!in.u8(&header)) return bad(0, "empty");
  info.version = header & 0x0f;
  if (info.version == kVersion1) {
    info.flags = header >> 4;
  } else if (info.version == kVersion2) {
    // UCX 1.16 packs its release there (minor version modulo 16); 1.13 packs 0.
    if (header >> 4 != 0) {
      return Status::Incompatible("ucx worker address (version 2) packed by another UCX release (" +
                                  std::to_string(header >> 4) + "), not this UCX build's format");
    }
    if (!in.u8(&info.flags)) return bad(1, "truncated header");
  } else {
    // UCX asserts on an address version it does not know (ucp_address_unpack_header).
    return Status::Incompatible("ucx worker address version " + std::to_string(info.version + 1) +
                                " is not one this UCX build packs (1 or 2)");
  }
  const uint8_t known = kFlagDebugInfo | kFlagWorkerUid | kFlagClientId | kFlagAmOnly;
  if ((info.flags & ~known) != 0) return bad(0, "unknown header flags");
  if ((info.flags & kFlagWorkerUid) == 0) return bad(0, "no worker id");
  if (!in.raw(&info.uid)) return bad(in.at(), "truncated worker id");
  if ((info.flags & kFlagClientId) != 0 && !in.skip(sizeof(uint64_t)))
    return bad(in.at(), "truncated client id");
  if ((info.flags & kFlagDebugInfo) != 0) {
    uint8_t name_length = 0;
    if (!in.u8(&name_length) || !in.skip(name_length)) return bad(in.at(), "truncated name");
  }
  uint8_t md_byte = 0;
  if (!in.u8(&md_byte)) return bad(in.at(), "no device list");
  if (md_byte == kNullResource) return bad(in.at() - 1, "no device (UCX could not reach it)");
  const size_t attributes_size = info.version == kVersion1 ? 16 : 8;
  for (size_t device = 0;; ++device) {
    const std::string where = "device " + std::to_string(device) + ": ";
    if (device != 0 && !in.u8(&md_byte)) return bad(in.at(), where + "missing");
    // UCX 1.16 ends a version 1 address with an empty device that carries its
    // release; 1.13 packs no empty device in a worker address.
    if ((md_byte & kEmptyDevice) != 0) {
      return Status::Incompatible("ucx worker address: " + where +
                                  "an empty device (what another UCX release packs to carry "
                                  "its version), not this UCX build's format");
    }
    uint8_t md_index = 0;
    if (!ExtendedValue(in, md_byte, info.version == kVersion1 ? 0x1f : 0x7f, info.version,
                       &md_index))
      return bad(in.at(), where + "truncated memory domain");
    if (md_index >= kMaxMemoryDomains)
      return bad(in.at() - 1, where + "memory domain " + std::to_string(md_index));
    uint8_t length_byte = 0, device_length = 0;
    if (!in.u8(&length_byte) || !ExtendedValue(in, length_byte, 0x1f, info.version, &device_length))
      return bad(in.at(), where + "truncated device address length");
    if ((length_byte & kNumPaths) != 0) {
      uint8_t paths = 0;
      if (!in.u8(&paths)) return bad(in.at(), where + "truncated path count");
      // UCX packs the count only when above 1.
      if (paths < 2) return bad(in.at() - 1, where + std::to_string(paths) + " paths");
    }
    if ((length_byte & kSysDevice) != 0) {
      uint8_t sys_device = 0;
      if (!in.u8(&sys_device)) return bad(in.at(), where + "truncated system device");
      if (sys_device >= kMaxSystemDevices)
        return bad(in.at() - 1, where + "system device " + std::to_string(sys_device));
    }
    if (!in.skip(device_length))
      return bad(in.at(), where + "device address of " + std::to_string(device_length) +
                              " bytes overruns the address");
    for (bool last_interface = false; !last_interface;) {
      const std::string iface =
          where + "interface " + std::to_string(info.interfaces.size()) + ": ";
      if (info.interfaces.size() == kMaxInterfaces)
        return bad(in.at(), iface + "more than " + std::to_string(kMaxInterfaces) + " interfaces");
      WorkerAddressInfo::Interface entry;
      entry.device_address_length = device_length;
      if (!in.raw(&entry.transport_checksum)) return bad(in.at(), iface + "truncated");
      if (in.left() < attributes_size) return bad(in.at(), iface + "truncated attributes");
      if (info.version == kVersion1 && !SaneV1Attributes(address.data() + in.at()))
        return bad(in.at(), iface + "attributes out of range");
      in.skip(attributes_size);
      uint8_t iface_byte = 0;
      if (!in.u8(&iface_byte) ||
          !ExtendedValue(in, iface_byte, 0x3f, info.version, &entry.interface_address_length))
        return bad(in.at(), iface + "truncated interface address length");
      if ((iface_byte & kHasEpAddress) != 0)
        return bad(in.at() - 1, iface + "an endpoint address (never in a worker address)");
      if (!in.skip(entry.interface_address_length))
        return bad(in.at(), iface + "interface address of " +
                                std::to_string(entry.interface_address_length) +
                                " bytes overruns the address");
      last_interface = (iface_byte & kLast) != 0;
      info.interfaces.push_back(entry);
    }
    if ((length_byte & kLast) != 0) break;
  }
  if (in.left() != 0)
    return bad(in.at(), std::to_string(in.left()) + " bytes after the last device");
  return info;
}

Status CheckWorkerAddress(std::string_view address, std::string_view own_address,
                          const std::vector<uint64_t>& own_uids) {
  auto own = ParseWorkerAddress(own_address);
  if (!own.ok()) {
    std::string why = "this UCX build's own worker addresses are not in a format kvd can check: ";
    why += own.status().message();
    return Status::Incompatible(std::move(why));
  }
  KV_ASSIGN_OR_RETURN(WorkerAddressInfo peer, ParseWorkerAddress(address));
  if (peer.version != own->version || peer.flags != own->flags) {
    return Status::Incompatible(
        "the peer's ucx worker address is not in this UCX build's format (header differs)");
  }
  // A transport this process has reads the peer's device and interface addresses as its own
  // fixed structures: their lengths must be ones this process packs for that transport (UCX
  // skips interfaces of transports it does not have).
  for (size_t i = 0; i < peer.interfaces.size(); ++i) {
    const auto& entry = peer.interfaces[i];
    bool known = false, matches = false;
    for (const auto& mine : own->interfaces) {
      if (mine.transport_checksum != entry.transport_checksum) continue;
      known = true;
      matches |= mine.device_address_length == entry.device_address_length &&
                 mine.interface_address_length == entry.interface_address_length;
    }
    if (known && !matches) {
      return Status::Incompatible(
          "the peer's ucx worker address has interface " + std::to_string(i) + " (transport " +
          std::to_string(entry.transport_checksum) + ") with a device address of " +
          std::to_string(entry.device_address_length) + " bytes and an interface address of " +
          std::to_string(entry.interface_address_length) +
          " bytes, lengths this UCX build does not pack for that transport");
    }
  }
  if (std::find(own_uids.begin(), own_uids.end(), peer.uid) != own_uids.end()) {
    return Status::InvalidArgument("the peer's ucx worker address names a worker of this kvd");
  }
  return Status::Ok();
}

std::string PaddedWorkerAddress(std::string_view address) {
  std::string padded(address);
  padded.append(kWorkerAddressPadding, '\0');
  return padded;
}

}  // namespace kv::transport::ucx
