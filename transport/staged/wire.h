// The staged transport's frames and descriptors (see staged_transport.h for the protocol).
//
// Every notification a staged transport sends through its inner transport starts with one tag
// byte: kUserTag for the user's notifications (the payload follows unchanged), kControlTag for
// the decorator's own messages (a u32 type, then little-endian fields, transport/codec.h). So a
// user's message can never be mistaken for a control message, whatever its bytes.
//
// Frames come from the network: every decoder checks sizes and counts before building anything
// and answers kInvalidArgument for anything malformed. Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "layout/kv_region.h"
#include "layout/plan.h"

namespace kv::transport::staged {

inline constexpr char kUserTag = 'U';
inline constexpr char kControlTag = 'C';

enum class ControlType : uint32_t {
  kHello = 1,   // sender → receiver: open a link, please grant me receive slots
  kWelcome,     // receiver → sender (over its connection back): the slots, or why not
  kData,        // sender → receiver: a chunk is in your slot, scatter it
  kAck,         // receiver → sender: the chunk's scatter finished (or failed); the slot is free
  kGetRequest,  // requester → holder: put these runs of your region into my region alias
  kGetDone,  // holder → requester (over its connection back): that part is in place, or why not
};

// A link is one sender's connection (an inner PeerId of the sender) to one receiver; the
// receiver names it by the sender's instance and that PeerId.
struct LinkKey {
  uint64_t instance = 0;
  uint64_t link = 0;
  auto operator<=>(const LinkKey&) const = default;
};

struct HelloMsg {
  LinkKey key;
  std::string reply_address;  // the sender's inner transport address
  uint32_t slots = 0;         // receive slots wanted
  uint64_t slot_bytes = 0;    // bytes each
};

struct WelcomeMsg {
  uint64_t link = 0;
  Status status;                         // not OK: the receiver refused the link
  uint64_t slot_bytes = 0;               // granted (≤ asked)
  std::vector<std::string> descriptors;  // one inner descriptor per granted slot
};

// The chunk in a receive slot: `ranges` entries of a table at the slot's start (u64 offset in
// the region, u64 length), then the payload, packed in table order, at TableBytes(ranges).
struct DataMsg {
  LinkKey key;
  uint64_t seq = 0;  // per link, echoed by the ack
  uint64_t region = 0;
  uint32_t slot = 0;
  uint64_t ranges = 0;
  uint64_t payload_bytes = 0;
};

struct AckMsg {
  uint64_t link = 0;
  uint64_t seq = 0;
  uint32_t slot = 0;
  Status status;
};

// A get, in parts of at most kMaxGetRuns runs (a part fits one notification): src_offset in the
// holder's region, dst_offset in the requester's. The holder puts them, staged, into `alias`: a
// region id the requester made for this get alone and forgets when the get ends, so nothing the
// holder sends after that lands.
struct GetRequestMsg {
  LinkKey key;
  uint64_t seq = 0;
  uint32_t part = 0;
  uint64_t region = 0;  // the holder's
  uint64_t alias = 0;   // the requester's
  uint64_t timeout_ms = 0;
  std::vector<Run> runs;
};
inline constexpr size_t kMaxGetRuns = 2000;

struct GetDoneMsg {
  uint64_t link = 0;
  uint64_t seq = 0;
  uint32_t part = 0;
  Status status;
};

inline constexpr uint64_t kTableEntryBytes = 16;
inline uint64_t TableBytes(uint64_t ranges) {
  return ranges * kTableEntryBytes;
}

std::string EncodeUser(std::string_view message);
std::string EncodeHello(const HelloMsg& m);
std::string EncodeWelcome(const WelcomeMsg& m);
std::string EncodeData(const DataMsg& m);
std::string EncodeAck(const AckMsg& m);
std::string EncodeGetRequest(const GetRequestMsg& m);
std::string EncodeGetDone(const GetDoneMsg& m);

// The type of a control frame (tag included); kInvalidArgument for anything else.
Result<ControlType> PeekControl(std::string_view frame);
Result<HelloMsg> DecodeHello(std::string_view frame);
Result<WelcomeMsg> DecodeWelcome(std::string_view frame);
Result<DataMsg> DecodeData(std::string_view frame);
Result<AckMsg> DecodeAck(std::string_view frame);
Result<GetRequestMsg> DecodeGetRequest(std::string_view frame);
Result<GetDoneMsg> DecodeGetDone(std::string_view frame);

// A staged registration as a peer imports it: the owner's instance and region id, its length
// and where it lives. Its magic differs from every inner backend's, so import_remote() tells a
// staged descriptor from an inner one by its first four bytes. `inner` is the inner transport's
// descriptor of the same memory where the owner registered it there too (a host region that
// either path may reach, batch by batch: staged_transport.h); empty for a staged-only region.
struct RegionDescriptor {
  uint64_t instance = 0;
  uint64_t region = 0;
  uint64_t length = 0;
  MemoryLocation location;
  std::string inner;
};
std::string EncodeRegion(const RegionDescriptor& d);
bool IsRegionDescriptor(std::string_view packed);
Result<RegionDescriptor> DecodeRegion(std::string_view packed);

}  // namespace kv::transport::staged
